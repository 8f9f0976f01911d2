"""`reinitialise` keeps every shipped predictor type valid, and the default mask's convention."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk


def bounded(temperature=2.5):
    return hk.BoundedPredictor(
        eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0)),
        in_scaler=hk.BoundScaler([(0.5, 2.0), (1.0, 10.0)], warp="log", temperature=temperature),
        out_scaler=hk.BoundScaler([(0.0, 3.0)], temperature=temperature),
    )


def all_floats(tree):
    """A mask that trains every floating leaf, temperatures included (the old default)."""
    return jax.tree.map(eqx.is_inexact_array, tree)


def test_default_mask_freezes_bound_scaler_temperatures():
    tree = (bounded(),)
    mask = hk.trainable_mask(tree)
    assert mask[0].in_scaler.temperature is False and mask[0].out_scaler.temperature is False
    assert all(layer.weight and layer.bias for layer in mask[0].inner.layers)


def test_a_custom_predicate_still_sees_the_temperatures():
    mask = hk.trainable_mask((bounded(),), eqx.is_inexact_array)
    assert mask[0].in_scaler.temperature is True


@pytest.mark.parametrize("mask_of", [hk.trainable_mask, all_floats])
def test_reinitialise_keeps_a_scalers_temperature_and_bounds(mask_of):
    tree = (hk.BoundScaler([(0.0, 1.0)], temperature=0.7), bounded())
    fresh = hk.reinitialise(tree, mask_of(tree), jax.random.key(1))
    for old, new in [(tree[0], fresh[0]), (tree[1].in_scaler, fresh[1].in_scaler)]:
        assert float(new.temperature) == float(old.temperature)
        assert new.bounds == old.bounds and new.warp == old.warp


@pytest.mark.parametrize("seed", range(4))
def test_a_reinitialised_bounded_predictor_stays_inside_its_box(seed):
    tree = (bounded(),)
    fresh = hk.reinitialise(tree, all_floats(tree), jax.random.key(seed))
    assert not np.allclose(fresh[0].inner.layers[0].weight, tree[0].inner.layers[0].weight)
    out = jax.vmap(fresh[0])(jnp.asarray([[0.5, 1.0], [1.0, 4.0], [2.0, 10.0]]))
    assert np.all((out >= 0.0) & (out <= 3.0))


def test_reinitialise_calls_a_duck_typed_method_on_a_plain_pytree_class():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Bank:  # not an equinox module, like confluent-bank's bank
        w: jax.Array

        def reinitialise(self, key):
            return Bank(jnp.full_like(self.w, 7.0))

    tree = (Bank(jnp.zeros(3)), jnp.zeros(2))
    fresh = hk.reinitialise(tree, hk.trainable_mask(tree), jax.random.key(0))
    np.testing.assert_array_equal(fresh[0].w, np.full(3, 7.0))
    assert not np.array_equal(fresh[1], np.zeros(2))  # the bare leaf is still drawn
