"""Bucketing: scattering experiments onto union axes, bin policies, and stacking.

**Policies** decide which union length each experiment is stacked at.

Every distinct bucket length is one compiled kernel shape (per kernel), and ODE kernels take
seconds to compile. The `"padded"` policy therefore bins the distinct lengths into at most
`max_shapes` bins, choosing the bin edges that minimise the number of padded cells (an exact
dynamic programme over the sorted distinct lengths). With `max_shapes=None` a cost model
picks the number of bins: each bin costs one compile, each padded cell some solve time in
every planned step (see `_auto_shapes`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hybrid_kernels._inputs import stack_inputs
from hybrid_kernels._jumps import stack_jumps

BUCKET_POLICIES = frozenset({"padded", "exact"})

# The cost model of the default policy, in seconds. Orders of magnitude measured on a 2-core
# CPU (benchmarks/kernels.py; issue 13: 20 experiments, 4 shapes against 1): one bucket shape
# costs a few seconds of compile per kernel and about a millisecond of dispatch per step; a
# cell of the padded [N, T] grid costs about a microsecond of solve per step.
COMPILE_S = 5.0
DISPATCH_S = 1e-3
CELL_S = 1e-6
AUTO_MAX_SHAPES = 4
DEFAULT_PLANNED_STEPS = 1000


def choose_bins(
    lengths: np.ndarray, policy: str, max_shapes: int | None, planned_steps: int | None = None
) -> np.ndarray:
    """The bucket length each experiment is padded to (`lengths` itself under `"exact"`).

    `max_shapes=None` lets `_auto_shapes` choose the number of bins.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if policy == "exact":
        return lengths
    distinct, counts = np.unique(lengths, return_counts=True)
    if max_shapes is None:
        steps = DEFAULT_PLANNED_STEPS if planned_steps is None else planned_steps
        return _auto_shapes(lengths, distinct, counts, steps)
    if distinct.size <= max_shapes:
        return lengths
    edges = _optimal_edges(distinct, counts, max_shapes)
    return edges[np.searchsorted(edges, lengths)]


def _auto_shapes(
    lengths: np.ndarray, distinct: np.ndarray, counts: np.ndarray, steps: int
) -> np.ndarray:
    """The bins of least modelled cost: `k * (compile + steps * dispatch) + steps * cells * cell`.

    `cells` is the padded grid every step solves, `sum over rows of the bin length`; for each
    `k` the bins are the padding-optimal ones of `_optimal_edges`.
    """
    best, best_cost = lengths, math.inf
    for k in range(1, min(AUTO_MAX_SHAPES, distinct.size) + 1):
        edges = _optimal_edges(distinct, counts, k)
        bins = edges[np.searchsorted(edges, lengths)]
        n_shapes = np.unique(bins).size
        cost = n_shapes * (COMPILE_S + steps * DISPATCH_S) + steps * CELL_S * float(bins.sum())
        if cost < best_cost:
            best, best_cost = bins, cost
    return best


def _optimal_edges(distinct: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Upper edges of at most `k` contiguous bins over sorted `distinct` lengths.

    Cost of a bin holding distinct lengths i..j is sum_{l in i..j} count_l * (L_j - L_l),
    i.e. the padded cells per channel. Solved exactly in O(k m^2) with NumPy rows.
    """
    m = distinct.size
    c = np.concatenate([[0], np.cumsum(counts)])  # prefix counts
    s = np.concatenate([[0], np.cumsum(counts * distinct)])  # prefix count * length
    big = np.iinfo(np.int64).max // 4
    i = np.arange(m)[:, None]
    j = np.arange(m)[None, :]
    # cost[i, j]: one bin covering distinct[i..j], padded to distinct[j] (inf when i > j).
    cost = np.where(i <= j, (c[j + 1] - c[i]) * distinct[j] - (s[j + 1] - s[i]), big)
    # With m > k distinct lengths, exactly k bins is optimal (splitting a bin never costs).
    dp = cost[0].copy()  # dp[j]: best cost of 0..j with b + 1 bins
    starts = np.zeros((k, m), dtype=np.int64)
    for b in range(1, k):
        cand = dp[:-1, None] + cost[1:, :]  # last bin starts at i + 1
        arg = np.argmin(cand, axis=0)
        dp = np.minimum(cand[arg, np.arange(m)], big)
        starts[b] = arg + 1
    edges, j = [], m - 1
    for b in range(k - 1, -1, -1):
        edges.append(distinct[j])
        j = starts[b][j] - 1
        if j < 0:
            break
    return np.array(sorted(edges), dtype=np.int64)


def validate_experiments(experiments: tuple[Any, ...], names: tuple[str, ...]) -> None:
    """make_dataset's checks; every message names the offending experiment."""
    if not names:
        raise ValueError("make_dataset: `output_channel_names` is empty; name at least one.")
    if len(set(names)) != len(names):
        raise ValueError(f"make_dataset: `output_channel_names` repeats a name: {names}.")
    first = experiments[0]
    ref = {k: np.shape(v) for k, v in first.covariates.items()}
    for exp in experiments:
        shapes = {k: np.shape(v) for k, v in exp.covariates.items()}
        if set(shapes) != set(ref):
            raise ValueError(
                f"make_dataset: experiment {exp.exp_id!r} has covariates {sorted(shapes)}, "
                f"but experiment {first.exp_id!r} has {sorted(ref)}; all must match."
            )
        for k, shape in shapes.items():
            if shape != ref[k]:
                raise ValueError(
                    f"make_dataset: experiment {exp.exp_id!r} covariate {k!r} has shape {shape}, "
                    f"expected {ref[k]} as in experiment {first.exp_id!r}."
                )
        if exp.y0.shape != first.y0.shape:
            raise ValueError(
                f"make_dataset: experiment {exp.exp_id!r} has y0 shape {exp.y0.shape}, "
                f"expected {first.y0.shape} as in experiment {first.exp_id!r}."
            )
        if set(exp.inputs) != set(first.inputs):
            raise ValueError(
                f"make_dataset: experiment {exp.exp_id!r} has inputs {sorted(exp.inputs)}, "
                f"but experiment {first.exp_id!r} has {sorted(first.inputs)}; all must match."
            )
        for k, table in exp.inputs.items():
            if table.values.shape[1:] != first.inputs[k].values.shape[1:]:
                raise ValueError(
                    f"make_dataset: experiment {exp.exp_id!r} input {k!r} has values of shape "
                    f"[K, *{table.values.shape[1:]}], expected [K, *"
                    f"{first.inputs[k].values.shape[1:]}] as in experiment {first.exp_id!r}."
                )
        missing = [n for n in names if n not in exp.channels]
        if missing:
            raise ValueError(
                f"make_dataset: experiment {exp.exp_id!r} has no channel(s) {missing}; "
                f"it defines {sorted(exp.channels)}."
            )


def scatter(exp: Any, names: tuple[str, ...], dtype: np.dtype):
    """One experiment onto its union axis: (ts [T], y [T, D], var [T, D], mask [T, D])."""
    chans = [exp.channels[n] for n in names]
    # Times are matched after rounding to the least precise float dtype present, so one decimal
    # time given in float32 in one channel and float64 in another is one row, not two. Where
    # that rounding would merge two distinct times of one channel (and so overwrite one of its
    # observations), times are matched exactly instead, in the widest dtype present. A time
    # repeated within one channel is a replicate, not a merge.
    dtypes = sorted({np.dtype(c.ts.dtype) for c in chans}, key=lambda d: d.itemsize)
    key_dtype = dtypes[0]
    keys = [c.ts.astype(key_dtype) for c in chans]
    if any(np.unique(k).size != np.unique(c.ts).size for k, c in zip(keys, chans, strict=True)):
        key_dtype = dtypes[-1]
        keys = [c.ts.astype(key_dtype) for c in chans]
    t0 = getattr(exp, "t0", None)
    # The solve starts at t0, so the union axis does too.
    start = [] if t0 is None else [np.asarray([t0], dtype=key_dtype)]
    distinct = np.unique(np.concatenate(keys + start))
    if not any(k.size for k in keys):
        raise ValueError(
            f"make_dataset: experiment {exp.exp_id!r} has no timestamps in channels {names}."
        )
    # Replicates: a time observed r times in some channel gets r rows (the most over channels),
    # and a channel's k-th replicate at that time lands on the k-th of them.
    slot = [np.searchsorted(distinct, k) for k in keys]
    reps = [_occurrence(s) for s in slot]
    mult = np.ones(distinct.size, np.int64)
    for s, r in zip(slot, reps, strict=True):
        np.maximum.at(mult, s, r + 1)
    first_row = np.concatenate([[0], np.cumsum(mult)[:-1]])
    union = np.repeat(distinct, mult)
    T, D = union.size, len(names)
    y = np.zeros((T, D), dtype)
    var = np.ones((T, D), dtype)
    mask = np.zeros((T, D), bool)
    for d, (c, s, r) in enumerate(zip(chans, slot, reps, strict=True)):
        if c.is_probe:
            continue
        rows = first_row[s] + r
        y[rows, d] = c.values
        var[rows, d] = c.variance
        mask[rows, d] = True
    return union.astype(dtype), y, var, mask


def _occurrence(slots: np.ndarray) -> np.ndarray:
    """For each entry, how many earlier entries share its slot (0 for the first)."""
    order = np.argsort(slots, kind="stable")
    sorted_slots = slots[order]
    starts = np.searchsorted(sorted_slots, sorted_slots, side="left")
    out = np.empty_like(slots)
    out[order] = np.arange(slots.size) - starts
    return out


def stack_bucket(
    exps, scattered, T: int, n_devices: int, dtype: np.dtype, jump_slots: int | None = None
):
    """Pad each row to length T, pad rows to a multiple of `n_devices`, and stack.

    `jump_slots` fixes the padded jump count (several processes agree on one); by default it
    follows the bucket's own rows (`hybrid_kernels._jumps.jump_slots`).
    """
    n_real = len(exps)
    n_rows = math.ceil(n_real / n_devices) * n_devices
    D = scattered[0][1].shape[1]
    ts = np.empty((n_rows, T), dtype)
    y = np.zeros((n_rows, T, D), dtype)
    var = np.ones((n_rows, T, D), dtype)
    mask = np.zeros((n_rows, T, D), bool)
    lengths = np.empty((n_rows,), np.int32)
    for n in range(n_rows):
        # Padding rows copy row 0's times and inputs so their (discarded) solve is a benign one.
        t, yy, vv, mm = scattered[n] if n < n_real else scattered[0]
        L = t.shape[0]
        ts[n, :L] = t
        ts[n, L:] = t[-1]  # repeating the last time leaves the integration unchanged
        lengths[n] = L
        if n < n_real:
            y[n, :L], var[n, :L], mask[n, :L] = yy, vv, mm
    src = [*exps, *[exps[0]] * (n_rows - n_real)]
    covs = {
        k: np.stack([_cast(e.covariates[k], dtype) for e in src])
        for k in sorted(exps[0].covariates)
    }
    y0 = np.stack([e.y0.astype(dtype) if e.y0.dtype.kind == "f" else e.y0 for e in src])
    weights = np.zeros((n_rows,), dtype)
    weights[:n_real] = 1
    inputs, jump_ts = stack_inputs(
        [getattr(e, "inputs", {}) for e in src], dtype, [e.exp_id for e in src]
    )
    fields = dict(
        ts=ts,
        y_observed=y,
        yvar=var,
        mask=mask,
        covariates=covs,
        y0=y0.astype(dtype),
        n_obs=np.asarray(mask.sum(), dtype=np.int32),
        row_weights=weights,
        row_lengths=lengths,
        inputs=inputs,
        jump_ts=jump_ts,
        # Padding rows copy row 0's jumps, like its inputs: a benign, discarded solve.
        jumps=stack_jumps(
            [getattr(e, "jumps", ()) for e in src], dtype, [e.exp_id for e in src], jump_slots
        ),
    )
    ids = tuple(e.exp_id for e in exps) + ("",) * (n_rows - n_real)
    return fields, ids


def _cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return x.astype(dtype) if x.dtype.kind == "f" else x
