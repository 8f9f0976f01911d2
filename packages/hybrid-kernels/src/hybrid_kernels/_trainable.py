"""Trainable masks: a boolean pytree mirroring the predictors, `True` where a leaf trains.

Masks are plain data. The freezers below return new masks and compose by chaining:
`freeze_paths(freeze_modules_of_type(trainable_mask(p), p, Scaler), ["0.bias"])`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from hybrid_kernels._bounded import BoundScaler


def default_trainable(leaf: Any) -> bool:
    """The default predicate: a leaf trains when it is an inexact (float/complex) array."""
    return eqx.is_inexact_array(leaf)


def trainable_mask(predictors: Any, predicate: Callable[[Any], bool] = default_trainable) -> Any:
    """A mask with `predicate(leaf)` at every leaf of `predictors` (any container).

    With the default predicate the leaves inside every `BoundScaler` (its temperature) are
    frozen too, following the convention that a scaler is configuration, not a fit; train
    them with `trainable_mask(predictors, eqx.is_inexact_array)`. A custom predicate is applied
    to every leaf as is.
    """
    mask = jax.tree.map(lambda x: bool(predicate(x)), predictors)
    if predicate is default_trainable:
        mask = freeze_modules_of_type(mask, predictors, BoundScaler)
    return mask


def count_trainable_params(predictors: Any, trainable: Any) -> int:
    """The number of scalar parameters the optimiser updates: sizes of the trained arrays.

    **Arguments:**

    - `predictors`: the pytree.
    - `trainable`: its boolean mask (`True` = trained), e.g. from `trainable_mask`.

    A complex entry counts once. Raises `ValueError` when the mask does not mirror
    `predictors`.
    """
    _check_structure(trainable, predictors, "count_trainable_params", "trainable")
    return sum(
        int(np.prod(np.shape(x), dtype=np.int64))
        for x, train in zip(jax.tree.leaves(predictors), jax.tree.leaves(trainable), strict=True)
        if train and eqx.is_array(x)
    )


def _segment(key: Any) -> str:
    for attr in ("name", "idx", "key"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_str(path: tuple) -> str:
    """A `jax.tree_util` key path as dot-joined attribute/index/key segments, e.g. `0.mlp.1`."""
    return ".".join(_segment(k) for k in path)


def _check_structure(mask: Any, predictors: Any, where: str, name: str = "mask") -> None:
    if jtu.tree_structure(mask) != jtu.tree_structure(predictors):
        raise ValueError(
            f"{where}: `{name}` does not have the structure of `predictors`; build it with "
            "trainable_mask(predictors)."
        )


def freeze_paths(mask: Any, paths: Iterable[str]) -> Any:
    """Freeze every leaf at or under each dot-joined path (e.g. `"0.layers.1.weight"`).

    An unmatched path raises `ValueError` and suggests the closest existing paths.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    leaves = jtu.tree_flatten_with_path(mask)[0]
    names = [path_str(p) for p, _ in leaves]
    for p in paths:
        if not any(n == p or n.startswith(p + ".") for n in names):
            close = difflib.get_close_matches(p, names, n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise ValueError(f"freeze_paths: path {p!r} matches no leaf of the mask.{hint}")

    def visit(path, leaf):
        n = path_str(path)
        return False if any(n == p or n.startswith(p + ".") for p in paths) else leaf

    return jtu.tree_map_with_path(visit, mask)


def freeze_modules_of_type(mask: Any, predictors: Any, cls: type | tuple[type, ...]) -> Any:
    """Freeze every leaf inside any node of `predictors` that is an instance of `cls`."""
    _check_structure(mask, predictors, "freeze_modules_of_type")
    prefixes = [
        path
        for path, node in jtu.tree_flatten_with_path(
            predictors, is_leaf=lambda x: isinstance(x, cls)
        )[0]
        if isinstance(node, cls)
    ]

    def visit(path, leaf):
        return False if any(path[: len(p)] == p for p in prefixes) else leaf

    return jtu.tree_map_with_path(visit, mask)


def _selects(fn: Callable[[Any], bool], node: Any, leaf: bool) -> bool:
    try:
        return bool(fn(node))
    except Exception:
        # A leaf predicate such as `lambda x: x.ndim == 0` need not make sense on a module:
        # on an inner node a failure means "not selected"; on a leaf it is the user's error.
        if leaf:
            raise
        return False


def freeze_where(mask: Any, predictors: Any, fn: Callable[[Any], bool]) -> Any:
    """Freeze every leaf of `predictors` that `fn` selects, itself or through a subtree.

    `fn` is asked about every node, outermost first: a module or container for which it is
    true has all its leaves frozen (so `lambda x: isinstance(x, eqx.nn.Linear)` freezes the
    linear layers), and so does a leaf for which it is true. An inner node on which `fn` raises
    counts as not selected; a leaf on which it raises propagates the error.
    """
    _check_structure(mask, predictors, "freeze_where")
    leaf_paths = {path for path, _ in jtu.tree_flatten_with_path(predictors)[0]}
    prefixes = [
        path
        for path, node in jtu.tree_flatten_with_path(
            predictors,
            is_leaf=lambda x: not isinstance(x, jax.Array) and _selects(fn, x, leaf=False),
        )[0]
        if path not in leaf_paths or _selects(fn, node, leaf=True)
    ]

    def visit(path, leaf):
        return False if any(path[: len(p)] == p for p in prefixes) else leaf

    return jtu.tree_map_with_path(visit, mask)
