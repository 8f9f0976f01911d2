"""The compiled end of a step (`_tail`): the pieces that keep the step program small give the
same values as the per-leaf forms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_kernels._training import _tail


def _tree(scale):
    return {"w": scale * jnp.arange(3.0), "b": jnp.asarray(scale), "name": "layer", "n": 3}


@pytest.mark.parametrize("pred", [True, False])
def test_a_snapshot_takes_the_whole_tree_the_predicate_names(pred):
    on_true, on_false = _tree(1.0), _tree(2.0)
    chosen = eqx.filter_jit(_tail._snapshot)(jnp.asarray(pred), on_true, on_false)
    expected = on_true if pred else on_false
    np.testing.assert_array_equal(chosen["w"], expected["w"])
    np.testing.assert_array_equal(chosen["b"], expected["b"])
    assert (chosen["name"], chosen["n"]) == ("layer", 3)


def test_a_snapshot_is_one_conditional_on_cpu_and_a_select_per_leaf_elsewhere():
    trees = ({"w": jnp.ones(3), "b": jnp.zeros(()), "c": jnp.ones((2, 2))},) * 2
    jaxpr = jax.make_jaxpr(_tail._snapshot)(jnp.asarray(True), *trees).jaxpr
    names = [eqn.primitive.name for eqn in jaxpr.eqns]
    if jax.default_backend() == "cpu":
        assert names.count("cond") == 1 and "select_n" not in names
    else:  # a conditional would read its predicate back to the host
        assert "cond" not in names and names.count("select_n") == 3


def test_a_snapshot_takes_leaves_of_different_weak_types_leaf_by_leaf():
    # A conditional needs both branches to return the same types; `where` promotes instead.
    weak, strong = {"x": jnp.asarray(1.0)}, {"x": jnp.ones((), jnp.float32)}
    assert not _tail._same_types(weak, strong)
    chosen = jax.jit(_tail._snapshot)(jnp.asarray(False), weak, strong)
    assert float(chosen["x"]) == 1.0


def _broke(before, after, grads=None, loss=0.5):
    grads = jax.tree.map(jnp.zeros_like, before) if grads is None else grads
    return bool(_tail._nothing_broke(jnp.asarray(loss), grads, before, after))


def test_nothing_broke_holds_for_a_finite_update():
    before = {"a": jnp.ones(3), "b": jnp.zeros((2, 2))}
    after = jax.tree.map(lambda x: x + 0.1, before)
    assert _broke(before, after)


def test_nothing_broke_fails_when_an_update_makes_a_finite_entry_non_finite():
    before = {"a": jnp.ones(3), "b": jnp.zeros((2, 2))}
    after = {"a": jnp.ones(3), "b": jnp.zeros((2, 2)).at[1, 0].set(jnp.inf)}
    assert not _broke(before, after)


def test_nothing_broke_ignores_entries_that_were_already_non_finite():
    # An infinite bound stays infinite through every update: not the update's doing.
    before = {"upper": jnp.asarray([jnp.inf, 1.0]), "b": jnp.zeros(2)}
    after = {"upper": jnp.asarray([jnp.inf, 1.5]), "b": jnp.ones(2)}
    assert _broke(before, after)


def test_nothing_broke_fails_for_a_non_finite_loss_or_gradient():
    before = {"a": jnp.ones(3)}
    assert not _broke(before, before, loss=jnp.nan)
    assert not _broke(before, before, grads={"a": jnp.asarray([0.0, jnp.nan, 0.0])})
