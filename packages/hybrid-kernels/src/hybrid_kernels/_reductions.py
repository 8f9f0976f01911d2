"""How bucket losses and gradients combine into one step's objective.

A step's objective is `Σ_b w_b · loss_b`, and its gradient is `Σ_b w_b · grads_b` with the same
weights: the loss you see is the loss you descend. The weights depend on `reduction`:

- `"per_bucket"` (the peer's rule): `w_b = 1 / B`. Every bucket weighs the same, so the
  objective depends on how the data happened to bucket.
- `"per_observation"`: `w_b = n_b / Σ n`, `n_b` the bucket's observed cells inside the length
  mask. With a mean-over-cells loss (`masked_mse`) this is the mean over *all* observations of
  the dataset, however it is bucketed.
- `"per_experiment"`: `w_b = e_b / Σ e`, `e_b` the bucket's experiments with at least one
  observed cell inside the length mask (padding rows and probes excluded). With an
  experiment-balanced loss (`bal_mse`, `bal_mle`) this is the mean over experiments.

The denominators are computed once on the host, from the dataset and the fraction (use the
same fraction as the kernels), never inside a kernel. `masked_mle` is a sum, not a mean, so
its natural combination is a plain sum: pass `weights=np.ones(B)`. Rows that fail under
`SolverConfig(throw=False)` still count in the host denominators (they contribute 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from hybrid_kernels._cells import scored_rows
from hybrid_kernels._dtypes import default_float

REDUCTIONS = ("per_bucket", "per_experiment", "per_observation")
"""The ways bucket losses and gradients combine into one step."""


def _kept_mask(bp: Any, fraction: float) -> np.ndarray:
    mask = np.asarray(bp.mask)
    return mask & np.asarray(scored_rows(bp.row_lengths, mask.shape[1], fraction))[:, :, None]


def bucket_weights(
    dataset: Any, reduction: str = "per_bucket", length_mask_fraction: float = 1.0
) -> np.ndarray:
    """The weight `w_b` of each bucket's loss and gradient under `reduction`.

    **Arguments:**

    - `dataset`: a [`hybrid_kernels.Dataset`][] (or any object with `bucket_payloads`).
    - `reduction`: `"per_bucket"`, `"per_experiment"` or `"per_observation"`.
    - `length_mask_fraction`: the fraction the kernels use this phase, in (0, 1].

    **Returns:** a NumPy `[B]` array summing to 1. Compute it once per phase, not per step.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}, got {reduction!r}.")
    fraction = float(length_mask_fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"`length_mask_fraction` must be in (0, 1], got {fraction!r}.")
    payloads = tuple(dataset.bucket_payloads)
    if not payloads:
        raise ValueError("bucket_weights: the dataset has no buckets.")
    if reduction == "per_bucket":
        return np.full((len(payloads),), 1.0 / len(payloads))
    counts = []
    for bp in payloads:
        kept = _kept_mask(bp, fraction)
        if reduction == "per_observation":
            counts.append(kept.sum())
        else:
            counts.append(np.any(kept, axis=(1, 2)).sum())
    counts_arr = np.asarray(counts, dtype=np.float64)
    if counts_arr.sum() == 0:
        raise ValueError(
            f"bucket_weights: no observed cells inside the length mask (fraction {fraction}); "
            f"`{reduction}` has nothing to average over."
        )
    return counts_arr / counts_arr.sum()


@eqx.filter_jit
def _combine(losses, grads, weights):
    loss = sum(weights[b].astype(l.dtype) * l for b, l in enumerate(losses))

    def wsum(*gs):
        return sum(weights[b].astype(g.dtype) * g for b, g in enumerate(gs))

    return loss, jax.tree.map(wsum, *grads)


def combine_bucket_grads(
    losses: Sequence[Array], grads: Sequence[Any], weights: Any
) -> tuple[Array, Any]:
    """`(Σ_b w_b·loss_b, Σ_b w_b·grads_b)` in one jitted call (no per-leaf eager dispatch).

    **Arguments:**

    - `losses`: one scalar per bucket, as returned by `bucket_step`.
    - `grads`: one gradient pytree per bucket (same structure; `None` at frozen leaves).
    - `weights`: `[B]` weights, usually [`hybrid_kernels.bucket_weights`][]. Traced: new
        values never recompile; a new bucket count does.

    **Returns:** the combined loss and gradient.
    """
    losses, grads = tuple(losses), tuple(grads)
    if len(losses) != len(grads):
        raise ValueError(f"got {len(losses)} losses but {len(grads)} gradient trees.")
    w = jnp.asarray(weights, dtype=default_float())
    if w.shape != (len(losses),):
        raise ValueError(
            f"`weights` has shape {w.shape}; expected ({len(losses)},), one per bucket."
        )
    return _combine(losses, grads, w)
