"""Trainable masks: the default predicate and the three freezers."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import hybrid_kernels as hk


class Scale(eqx.Module):
    temperature: jax.Array


class Net(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    scale: Scale
    activation: str = "tanh"


@pytest.fixture
def predictors():
    return (
        Net(jnp.ones((2, 2)), jnp.zeros(2), Scale(jnp.asarray(1.0))),
        {"rate": jnp.asarray(0.5), "count": jnp.asarray(3)},
    )


def test_default_mask_trains_exactly_the_inexact_array_leaves(predictors):
    mask = hk.trainable_mask(predictors)
    assert mask[0].weight and mask[0].bias and mask[0].scale.temperature and mask[1]["rate"]
    assert mask[1]["count"] is False


def test_custom_predicate_is_applied_to_every_leaf(predictors):
    mask = hk.trainable_mask(predictors, lambda x: getattr(x, "ndim", 0) == 2)
    assert jax.tree.leaves(mask) == [True, False, False, False, False, False]


def test_freeze_paths_freezes_a_leaf_by_dotted_path(predictors):
    mask = hk.freeze_paths(hk.trainable_mask(predictors), ["0.bias", "1.rate"])
    assert mask[0].bias is False and mask[1]["rate"] is False and mask[0].weight


def test_freeze_paths_freezes_a_whole_subtree_by_its_prefix(predictors):
    mask = hk.freeze_paths(hk.trainable_mask(predictors), "0.scale")
    assert mask[0].scale.temperature is False and mask[0].weight


def test_freeze_paths_suggests_close_matches_for_an_unmatched_path(predictors):
    with pytest.raises(ValueError, match=r"'0.bais' matches no leaf.*Did you mean \['0.bias'"):
        hk.freeze_paths(hk.trainable_mask(predictors), ["0.bais"])


def test_freeze_modules_of_type_freezes_every_leaf_inside_those_modules(predictors):
    mask = hk.freeze_modules_of_type(hk.trainable_mask(predictors), predictors, Scale)
    assert mask[0].scale.temperature is False
    assert mask[0].weight and mask[0].bias and mask[1]["rate"]


def test_freeze_where_freezes_the_leaves_the_predicate_selects(predictors):
    mask = hk.freeze_where(
        hk.trainable_mask(predictors), predictors, lambda x: getattr(x, "ndim", None) == 0
    )
    assert mask[0].weight and mask[0].bias
    assert mask[0].scale.temperature is False and mask[1]["rate"] is False


def test_freezers_compose_by_chaining(predictors):
    mask = hk.freeze_paths(
        hk.freeze_modules_of_type(hk.trainable_mask(predictors), predictors, Scale), ["0.bias"]
    )
    # leaves: weight, bias, temperature, activation, count, rate
    assert [k for k, v in enumerate(jax.tree.leaves(mask)) if v] == [0, 5]


def test_freezers_reject_a_mask_of_another_structure(predictors):
    with pytest.raises(ValueError, match="does not have the structure of `predictors`"):
        hk.freeze_where(hk.trainable_mask(predictors[0]), predictors, lambda x: False)


def test_freeze_where_with_an_isinstance_predicate_freezes_whole_modules(predictors):
    mask = hk.freeze_where(
        hk.trainable_mask(predictors), predictors, lambda x: isinstance(x, Scale)
    )
    assert mask[0].scale.temperature is False
    assert mask[0].weight and mask[0].bias and mask[1]["rate"]


def test_freeze_where_freezes_eqx_layers_by_type():
    net = eqx.nn.MLP(2, 1, 3, 1, key=jax.random.key(0))
    mask = hk.freeze_where(
        hk.trainable_mask(net), net, lambda x: isinstance(x, eqx.nn.Linear) and x.in_features == 2
    )
    assert mask.layers[0].weight is False and mask.layers[0].bias is False
    assert mask.layers[1].weight is True


def test_freeze_where_ignores_a_leaf_predicate_that_fails_on_modules():
    tree = (Scale(jnp.ones((2, 2))), {"bias": jnp.zeros(2)})
    mask = hk.freeze_where(hk.trainable_mask(tree), tree, lambda x: x.ndim == 2)
    assert mask[0].temperature is False and mask[1]["bias"] is True


def test_freeze_where_propagates_a_predicate_error_raised_on_a_leaf(predictors):
    with pytest.raises(AttributeError):
        hk.freeze_where(hk.trainable_mask(predictors), predictors, lambda x: x.no_such_attribute)


def test_count_trainable_params_sums_the_sizes_of_trained_arrays(predictors):
    mask = hk.trainable_mask(predictors)  # weight 4 + bias 2 + temperature 1 + rate 1
    assert hk.count_trainable_params(predictors, mask) == 8
    assert hk.count_trainable_params(predictors, hk.freeze_paths(mask, ["0.weight"])) == 4


def test_count_trainable_params_rejects_a_mask_of_another_structure(predictors):
    with pytest.raises(ValueError, match="count_trainable_params: `trainable` does not have"):
        hk.count_trainable_params(predictors, hk.trainable_mask(predictors[0]))
