"""Fresh starting points for the tournament and the seed ensembles, and named key folds."""

from __future__ import annotations

import zlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp


def fold_key(key: Any, name: str) -> Any:
    """A subkey of `key` named by `name`: the same name always gives the same subkey.

    Named folds keep the streams of the tournament, the ensembles and the resamples apart,
    and stay stable when one of them adds or removes draws.
    """
    return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def _has_own_reinit(node: Any) -> bool:
    # Duck-typed, so a pytree class from another package (a confluent-bank bank, which is not
    # an equinox module) can say how it starts afresh without either package importing the
    # other.
    return not isinstance(node, jax.Array | type) and callable(getattr(node, "reinitialise", None))


def _draw(key: Any, leaf: Any) -> Any:
    # A matrix gets the fan-in uniform scale of eqx.nn.Linear; anything smaller (a bias, a
    # scalar rate) a standard normal draw. Modules that know better define `reinitialise`.
    if leaf.ndim >= 2:
        bound = 1.0 / jnp.sqrt(jnp.asarray(leaf.shape[-1], dtype=leaf.dtype))
        return jax.random.uniform(key, leaf.shape, leaf.dtype, -bound, bound)
    return jax.random.normal(key, leaf.shape, leaf.dtype)


def reinitialise(predictors: Any, trainable: Any, key: Any) -> Any:
    """New values for the trainable leaves of `predictors`; frozen leaves and buffers stay.

    A node with a `reinitialise(key) -> node` method (any pytree node: an equinox module or,
    duck-typed, another package's class) re-initialises itself, keeping its own invariants;
    its frozen leaves are still restored afterwards. A `BoundScaler` keeps its bounds and
    temperature; a confluent-bank bank keeps its slot structure. Every other trainable
    floating leaf is drawn afresh: matrices uniformly in `±1/sqrt(fan_in)`, smaller leaves
    from a standard normal. One subkey per module or leaf, in traversal order, so identical
    siblings differ.

    **Arguments:**

    - `predictors`: the pytree to re-initialise.
    - `trainable`: its boolean mask (`True` = trained).
    - `key`: a JAX random key.
    """
    units, treedef = jax.tree_util.tree_flatten(predictors, is_leaf=_has_own_reinit)
    keys = jax.random.split(key, max(len(units), 1))
    fresh = []
    for k, unit in zip(keys, units, strict=False):
        if _has_own_reinit(unit):
            fresh.append(unit.reinitialise(k))
        elif eqx.is_inexact_array(unit):
            fresh.append(_draw(k, unit))
        else:
            fresh.append(unit)
    candidate = jax.tree_util.tree_unflatten(treedef, fresh)
    # Only trained leaves take the new values (the peer re-drew buffers too).
    return jax.tree_util.tree_map(
        lambda new, old, train: new if train else old,
        candidate,
        predictors,
        trainable,
    )
