"""Validation of user callbacks and kernel arguments, with messages that name the bucket.

Shape checks run while a kernel traces a new bucket shape: tracing *is* abstract evaluation
(what `jax.eval_shape` does), so checking there costs no extra trace of `simulate_fn` and runs
exactly once per bucket shape. Host checks (the trainable mask's structure, the fraction's
range, the dtype policy) run once per new shape on the host before dispatch.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from hybrid_kernels._dtypes import warn_mixed_dtypes


def bucket_name(bp: Any) -> str:
    N, T = bp.ts.shape
    return f"bucket N={N}, T={T}"


def check_scalar(value: Any, what: str, bp: Any) -> None:
    if getattr(value, "shape", None) != ():
        raise ValueError(
            f"{what} returned shape {getattr(value, 'shape', type(value).__name__)} for "
            f"{bucket_name(bp)}; expected a scalar, shape ()."
        )


def check_simulate_out(out: Any, bp: Any) -> None:
    """`simulate_fn` per experiment must return `[T, S]` with S = y0.shape[-1]."""
    T, S = bp.ts.shape[1], bp.y0.shape[-1]
    shape = getattr(out, "shape", None)
    if shape != (T, S):
        raise ValueError(
            f"simulate_fn returned shape {shape} for {bucket_name(bp)}; expected ({T}, S) "
            f"with S = y0.shape[-1] = {S}."
        )


def check_output(pred: Any, bp: Any) -> None:
    """`state_to_output` must map `[T, S]` to `[T, D]` with D = number of output channels."""
    T, D = bp.ts.shape[1], bp.mask.shape[-1]
    shape = getattr(pred, "shape", None)
    if shape is None or tuple(shape[1:]) != (T, D):
        got = None if shape is None else tuple(shape[1:])
        raise ValueError(
            f"state_to_output returned shape {got} per experiment for {bucket_name(bp)}; "
            f"expected ({T}, D) with D = number of output channels = {D}."
        )


def check_trainable(trainable: Any, predictors: Any) -> None:
    """The mask must be a tree prefix of `predictors` with bool (or callable) leaves."""
    if callable(trainable) and not isinstance(trainable, jax.Array | np.ndarray):
        return
    try:
        jtu.tree_map(lambda m, _: m, trainable, predictors)
    except (ValueError, TypeError) as e:
        raise ValueError(
            "`trainable` does not have the structure of `predictors`: expected a mask built "
            f"with trainable_mask(predictors) (structure {jtu.tree_structure(predictors)}), got "
            f"structure {jtu.tree_structure(trainable)}."
        ) from e
    bad = [m for m in jtu.tree_leaves(trainable) if not isinstance(m, bool | np.bool_)]
    if bad:
        raise ValueError(
            f"`trainable` mask leaves must be Python bools, got {type(bad[0]).__name__}."
        )


def check_fraction(fraction: Any, what: str = "length_mask_fraction") -> None:
    """A concrete fraction must lie in (0, 1]; a traced one cannot be checked on the host."""
    if isinstance(fraction, jax.core.Tracer):
        return
    arr = np.asarray(fraction)
    if arr.shape != ():
        raise ValueError(f"`{what}` must be a scalar, got shape {arr.shape}.")
    value = float(arr)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"`{what}` must be in (0, 1], got {value!r}.")


def check_int(value: Any, what: str, *, minimum: int = 1) -> int:
    """`value` as an int; `TypeError` unless an integer (bools refused), `ValueError` below
    `minimum`. `what` names the argument, e.g. "make_dataset: `max_shapes`"."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_weight(weight: Any, what: str) -> None:
    if isinstance(weight, jax.core.Tracer):
        return
    arr = np.asarray(weight)
    if arr.shape != ():
        raise ValueError(f"`{what}` must be a scalar, got shape {arr.shape}.")
    value = float(arr)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"`{what}` must be finite and >= 0, got {value!r}.")


def _float_dtypes(tree: Any) -> set[np.dtype]:
    return {
        np.dtype(x.dtype)
        for x in jtu.tree_leaves(tree)
        if hasattr(x, "dtype") and np.issubdtype(x.dtype, np.floating)
    }


def narrow_y0_note(predictors: Any, y0: Any, bp: Any) -> str | None:
    """What to add to an error raised inside `simulate_fn` when `y0` is narrower than a float
    leaf of the predictors (float32 data, a float64 model): a solve in `y0`'s dtype then meets
    a wider vector field, which diffrax cannot store (its `buffer.at[i].set(value)` error).
    `None` when the dtypes do not explain it."""
    widest = max(_float_dtypes(predictors), key=lambda d: d.itemsize, default=None)
    start = np.dtype(y0.dtype)
    if widest is None or widest.itemsize <= start.itemsize:
        return None
    return (
        f"hybrid_kernels: in {bucket_name(bp)}, y0 is {start.name} (the dataset's dtype) while "
        f"the predictors hold {widest.name} leaves; a solve started in {start.name} whose "
        f"vector field returns {widest.name} fails inside diffrax (`buffer.at[i].set(value)`). "
        f"If that is this error, build the dataset in {widest.name} "
        f"(make_dataset(..., dtype={widest.name!r})) or the predictors in {start.name}."
    )


def check_dtypes(predictors: Any, bp: Any, where: str) -> None:
    """Warn once when data, y0 and predictor leaves disagree on the float dtype."""
    warn_mixed_dtypes(
        {
            "data": _float_dtypes((bp.ts, bp.y_observed, bp.yvar)),
            "y0": _float_dtypes(bp.y0),
            "predictors": _float_dtypes(predictors),
        },
        where,
    )
