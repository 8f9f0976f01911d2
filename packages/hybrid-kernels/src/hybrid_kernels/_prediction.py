"""Prediction and evaluation: run the trained model over a dataset and score it.

`predict_bucket` is its own jitted entry point around the uncompiled `predict_bucket_obs`, so
its compile cache is separate from the training kernels' (R-J1): predicting never evicts or
retraces a training kernel, and vice versa. Its callables and solver are static cache keys, so
pass stable module-level functions rather than fresh lambdas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from hybrid_kernels._dispatch import _strong
from hybrid_kernels._distributed import held_whole, to_host
from hybrid_kernels._errors import no_host_callbacks
from hybrid_kernels._kernels import predict_bucket_obs
from hybrid_kernels._preflight import check_int


@eqx.filter_jit
def _predict_bucket(predictors, bp, simulate_fn, state_to_output, solver):
    with no_host_callbacks(not getattr(solver, "throw", True)):
        return predict_bucket_obs(predictors, bp, simulate_fn, state_to_output, solver)


def predict_bucket(
    predictors: Any,
    bp: Any,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: Any,
) -> Float[Array, "N T D"]:
    """Simulate every experiment of one bucket and project to the observed channels.

    Jitted with its own cache, one compile per bucket shape, separate from the training
    kernels' caches.

    **Arguments:**

    - `predictors`: the model's predictors pytree (weak-typed leaves are made strong first, so
      a weak/strong flip never recompiles).
    - `bp`: a `BucketPayload`.
    - `simulate_fn`, `state_to_output`, `solver`: as for the training kernels. They are static:
      each distinct value compiles its own copy.

    **Returns:** predictions `[N, T, D]`, the shape of `bp.y_observed` (padded rows and times
    included; `bp.mask` and `bp.row_weights` say which cells are real). With
    `SolverConfig(throw=False)` a failed solve gives non-finite predictions in its row.
    """
    return _predict_bucket(_strong(predictors), bp, simulate_fn, state_to_output, solver)


def predict_dataset(
    predictors: Any,
    dataset: Any,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: Any,
) -> tuple[Float[Array, "N T D"], ...]:
    """`predict_bucket` over every bucket of `dataset`, in bucket order.

    **Returns:** one `[N_b, T_b, D]` array per bucket; a tuple, since buckets differ in `T`.
    """
    return tuple(
        predict_bucket(predictors, bp, simulate_fn, state_to_output, solver)
        for bp in dataset.bucket_payloads
    )


def _dense_payload(bp: Any, ts: np.ndarray) -> Any:
    N, P = ts.shape
    D = bp.y_observed.shape[-1]
    fields = dict(
        ts=jnp.asarray(ts, dtype=bp.ts.dtype),
        y_observed=jnp.zeros((N, P, D), bp.y_observed.dtype),
        yvar=jnp.ones((N, P, D), bp.yvar.dtype),
        mask=jnp.zeros((N, P, D), bool),
        n_obs=jnp.zeros((), bp.n_obs.dtype),
        row_lengths=jnp.full((N,), P, bp.row_lengths.dtype),
    )
    return bp._replace(**fields)


def _with_jump_sides(dense: np.ndarray, bp: Any) -> np.ndarray:
    """`dense [N, P]` plus, per jump slot, the jump's time and the float just before it.

    A jump is right-continuous, so its time shows the state after it and the time just
    before shows the state before: the curve drops or rises vertically there instead of
    being drawn as a slope between two grid points. Times are clipped into each row's grid
    range (padding slots land on its last time, a repeated trailing time).
    """
    if bp.jumps is None:
        return dense
    dtype = np.dtype(bp.ts.dtype)
    dense = np.asarray(dense, dtype=dtype)
    jt = np.asarray(bp.jumps.ts, dtype=dtype)
    lo, hi = dense[:, :1], dense[:, -1:]
    before = np.nextafter(jt, np.asarray(-np.inf, dtype))
    sides = np.clip(np.concatenate([before, jt], axis=1), lo, hi)
    return np.sort(np.concatenate([dense, sides], axis=1), axis=1)


def predict_dense(
    predictors: Any,
    dataset: Any,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: Any,
    ts_grid: Float[ArrayLike, " P"] | None = None,
    n_points: int = 100,
) -> tuple[tuple[Float[Array, "N P"], Float[Array, "N P D"]], ...]:
    """Predictions on a dense time grid, for plotting smooth curves through the data.

    **Arguments:**

    - `predictors`, `dataset`, `simulate_fn`, `state_to_output`, `solver`: as for
      `predict_dataset`.
    - `ts_grid`: a shared increasing grid `[P]` used for every experiment; or `None` (default)
      for `n_points` evenly spaced times from each row's first to its last time.
    - `n_points`: grid size when `ts_grid` is `None` (at least 2).

    A bucket whose experiments have state jumps ([`hybrid_kernels.StateJump`][]) gets two
    more points per jump slot `M` (`P + 2 M` in all): each jump's time, showing the state
    after it, and the float just before, showing the state before, so a curve drawn through
    the grid is vertical at the jump instead of smeared across it.

    **Returns:** per bucket, the pair `(ts [N, P], predictions [N, P, D])`. A new `P` is a new
    shape, compiled once. With several processes every process gets every row (the buckets
    are gathered first, so every process must call this), computed on its own device.
    """
    if ts_grid is not None:
        grid = np.asarray(ts_grid, dtype=np.float64)
        if grid.ndim != 1 or grid.size < 1 or not np.all(np.isfinite(grid)):
            raise ValueError(f"ts_grid must be a non-empty finite rank-1 array; got {grid.shape}")
        if np.any(np.diff(grid) < 0):
            raise ValueError("ts_grid must be sorted in increasing order")
    else:
        check_int(n_points, "predict_dense: `n_points`", minimum=2)
    out = []
    for bp in held_whole(dataset).bucket_payloads:
        ts = np.asarray(bp.ts, dtype=np.float64)
        if ts_grid is not None:
            dense = np.broadcast_to(grid, (ts.shape[0], grid.size))
        else:
            dense = np.linspace(ts[:, 0], ts[:, -1], n_points, axis=-1)
        dbp = _dense_payload(bp, _with_jump_sides(dense, bp))
        out.append((dbp.ts, predict_bucket(predictors, dbp, simulate_fn, state_to_output, solver)))
    return tuple(out)


def ensemble_predictions(
    members: Sequence[Any],
    dataset: Any,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: Any,
) -> tuple[Float[Array, "N T D"], ...]:
    """Mean prediction of several predictor pytrees (ensemble members), per bucket.

    Members share one architecture, so they share `predict_bucket`'s compiled copies.
    """
    members = list(members)
    if not members:
        raise ValueError("members is empty; pass at least one predictors pytree")
    per_member = [
        predict_dataset(m, dataset, simulate_fn, state_to_output, solver) for m in members
    ]
    return tuple(jnp.mean(jnp.stack(preds), axis=0) for preds in zip(*per_member, strict=True))


class ChannelMetrics(NamedTuple):
    """Error statistics of one output channel over its measured cells.

    - `name`: the channel name.
    - `n`: number of measured cells.
    - `mse`, `rmse`, `mae`: of `prediction - observation`.
    - `r2`: `1 - SS_res / SS_tot`; NaN when the channel has no cell or its observations are
      constant. (`mse`, `rmse`, `mae` are NaN for a channel with no cell.)
    """

    name: str
    n: int
    mse: float
    rmse: float
    mae: float
    r2: float


def rich_metrics_table(
    metrics: Mapping[str, ChannelMetrics], *, title: str | None = "Fit metrics"
) -> Any:
    """`compute_metrics`'s result as a `rich.table.Table`, one row per channel.

    Print it with `rich.print(table)` or `rich.console.Console().print(table)`. NaN (a channel
    with no measured cell, or constant observations for R²) shows as `-`.

    **Arguments:**

    - `metrics`: `{channel name: ChannelMetrics}`, as returned by `compute_metrics`.
    - `title`: the caption above the table; `None` for none.
    """
    from rich.table import Table

    table = Table(title=title)
    table.add_column("channel")
    for column in ("n", "MSE", "RMSE", "MAE", "R²"):
        table.add_column(column, justify="right")

    def cell(x: float) -> str:
        return "-" if not np.isfinite(x) else f"{x:.4g}"

    for name, m in metrics.items():
        if not isinstance(m, ChannelMetrics):
            raise TypeError(
                f"rich_metrics_table: metrics[{name!r}] must be a ChannelMetrics (the output of "
                f"compute_metrics); got {type(m).__name__}"
            )
        table.add_row(name, str(m.n), cell(m.mse), cell(m.rmse), cell(m.mae), cell(m.r2))
    return table


def compute_metrics(
    predictions: Sequence[Float[ArrayLike, "N T D"]], dataset: Any
) -> dict[str, ChannelMetrics]:
    """Per-channel metrics of `predictions` (one array per bucket) against `dataset`.

    Only measured cells count (`mask`; padding is never measured). Channels are never pooled:
    they carry different units. Computed on the host in float64, all channels at once. With
    several processes, call it on every process: arrays spread over them are gathered, and
    every process gets the metrics of every experiment.

    **Returns:** `{channel name: ChannelMetrics}` in `dataset.output_channel_names` order.
    """
    payloads = dataset.bucket_payloads
    if len(predictions) != len(payloads):
        raise ValueError(
            f"predictions holds {len(predictions)} arrays but dataset has {len(payloads)} "
            "buckets; pass predict_dataset's output for this dataset"
        )
    names = tuple(dataset.output_channel_names)
    D = len(names)
    preds, obs, masks = [], [], []
    for i, (pred, bp) in enumerate(zip(predictions, payloads, strict=True)):
        pred = np.asarray(to_host(pred), dtype=np.float64)
        if pred.shape != tuple(bp.y_observed.shape):
            raise ValueError(
                f"predictions[{i}] has shape {pred.shape}; expected {tuple(bp.y_observed.shape)}, "
                f"the shape of bucket {i}'s y_observed"
            )
        preds.append(pred.reshape(-1, D))
        obs.append(np.asarray(to_host(bp.y_observed), dtype=np.float64).reshape(-1, D))
        masks.append(np.asarray(to_host(bp.mask), dtype=bool).reshape(-1, D))
    p = np.concatenate(preds) if preds else np.zeros((0, D))
    y = np.concatenate(obs) if obs else np.zeros((0, D))
    m = np.concatenate(masks) if masks else np.zeros((0, D), bool)
    # Masked cells are zeroed before any arithmetic, so NaN there never leaks into a statistic.
    residual = np.where(m, p, 0) - np.where(m, y, 0)
    n = m.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mse = np.where(n > 0, (residual**2).sum(axis=0) / n, np.nan)
        mae = np.where(n > 0, np.abs(residual).sum(axis=0) / n, np.nan)
        mean = np.where(m, y, 0).sum(axis=0) / np.maximum(n, 1)
        ss_tot = (np.where(m, y - mean, 0) ** 2).sum(axis=0)
        r2 = np.where((n > 0) & (ss_tot > 0), 1 - mse * n / ss_tot, np.nan)
    return {
        name: ChannelMetrics(
            name=name,
            n=int(n[d]),
            mse=float(mse[d]),
            rmse=float(np.sqrt(mse[d])),
            mae=float(mae[d]),
            r2=float(r2[d]),
        )
        for d, name in enumerate(names)
    }
