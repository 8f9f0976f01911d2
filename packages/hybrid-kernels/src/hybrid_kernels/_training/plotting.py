"""Two plots for a training run: the loss history, and the fit against the data.

matplotlib is an optional dependency (`pip install hybrid-kernels[plot]`); it is imported
only when one of these functions is called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hybrid_kernels._distributed import held_whole
from hybrid_kernels._optional import require
from hybrid_kernels._prediction import predict_dense


def plot_history(history: Sequence[float], *, ax: Any = None, log: bool = True) -> Any:
    """Plot a loss history: the training loss per step, validation scores, skipped steps.

    The hook's events (`history.events`) are marked where they happened: a solid green line
    for an accepted one, a dashed grey line for one whose `"accepted"` is false, each labelled
    with its `"kind"`.

    **Arguments:**

    - `history`: the `loss_history` returned by `train_with_optax` (a
        [`LossHistory`][hybrid_kernels.LossHistory]); a plain list of floats also works.
    - `ax`: a matplotlib `Axes` to draw on; `None` makes a new figure.
    - `log`: use a logarithmic loss axis.

    **Returns:** the `Axes`.
    """
    plt = require("matplotlib.pyplot", "plot", "Plots")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    losses = np.asarray(list(history), dtype=float)
    steps = np.arange(losses.size)
    ax.plot(steps, losses, lw=1.4, label="training loss")
    val = getattr(history, "val", ())
    if len(val):
        vs, vl = np.asarray(val, dtype=float).T
        ax.plot(vs, vl, "o-", ms=3, lw=1.0, label="validation")
    for boundary in getattr(history, "phase_starts", ())[1:]:
        ax.axvline(boundary - 0.5, color="0.6", ls=":", lw=1.0)
    bad = [s for s in getattr(history, "bad_steps", ()) if s < losses.size]
    if bad:
        finite = losses[np.isfinite(losses)]
        level = finite.max() if finite.size else 1.0
        ax.plot(bad, np.full(len(bad), level), "x", color="C3", label="skipped (non-finite)")
    _mark_events(ax, getattr(history, "events", ()))
    best = getattr(history, "best_step", -1)
    if best is not None and 0 <= best < losses.size:
        ax.plot([best], [losses[best]], "*", ms=10, color="C2", label="best step")
    if log and np.any(losses[np.isfinite(losses)] > 0):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(frameon=False)
    return ax


def _mark_events(ax: Any, events: Sequence[Any]) -> None:
    labelled: set[bool] = set()
    for event in events:
        accepted = bool(event.get("accepted", True))
        # The hook ran after `step` steps: its change first shows in loss index `step`.
        x = float(event["step"]) - 0.5
        label = None
        if accepted not in labelled:
            labelled.add(accepted)
            label = "transition" if accepted else "rejected transition"
        colour, style = ("C2", "-") if accepted else ("0.45", "--")  # ":" marks phases
        ax.axvline(x, color=colour, ls=style, lw=1.0, label=label)
        ax.annotate(
            str(event.get("kind", "event")),
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=colour,
        )


def plot_fit(
    predictors: Any,
    dataset: Any,
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[[Any], Any],
    solver: Any,
    exp_ids: Sequence[str] | None = None,
    max_experiments: int = 4,
    n_points: int = 200,
    channels: Sequence[str] | None = None,
    log_y: bool = False,
    t_range: tuple[float, float] | None = None,
) -> Any:
    """Plot observations against the model's trajectories on a dense time grid.

    One panel per experiment; per channel, the measured points and the predicted curve in the
    same colour.

    **Arguments:**

    - `predictors`, `dataset`, `simulate_fn`, `state_to_output`, `solver`: the model and the
        data, as for `predict_dense`.
    - `exp_ids`: which experiments to show; `None` shows the first `max_experiments`.
    - `max_experiments`: the number of panels when `exp_ids` is `None`.
    - `n_points`: points of the dense grid per experiment.
    - `channels`: names of the output channels to show; `None` shows all.
    - `log_y`: a logarithmic y axis (concentrations spanning decades). Non-positive values,
        measured or predicted, are left out (a log axis cannot show them), and each panel's
        y-range is set from the positive values inside `t_range`: from a decade below the
        smallest positive measurement (or the smallest positive prediction when nothing
        positive was measured) to a little above the largest value. So a curve that starts at
        0, as a concentration before its first dose does, does not squash the panel.
    - `t_range`: `(t_start, t_end)`, the time window shown on every panel; `None` shows each
        experiment from its `t0` to its last time. The y-range follows the values inside it.

    **Returns:** the matplotlib `Figure`. With several processes, call it on every process
    (rows held by other processes are gathered) and save the figure from process 0.
    """
    plt = require("matplotlib.pyplot", "plot", "Plots")
    if t_range is not None:
        lo, hi = (float(t) for t in t_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(
                f"plot_fit: `t_range` must be two finite times (start, end) with start < end, "
                f"got {tuple(t_range)!r}."
            )
    dataset = held_whole(dataset)  # rows spread over several processes are gathered first
    names = list(dataset.output_channel_names)
    shown = names if channels is None else list(channels)
    for name in shown:
        if name not in names:
            raise ValueError(f"plot_fit: channel {name!r} is not one of {names}")
    rows = []  # (exp_id, bucket index, row index)
    for b, ids in enumerate(dataset.exp_ids):
        weights = dataset.bucket_payloads[b].row_weights
        for r, exp_id in enumerate(ids):
            if weights is None or float(weights[r]) > 0:
                rows.append((exp_id, b, r))
    if exp_ids is None:
        rows = rows[:max_experiments]
    else:
        known = {row[0]: row for row in rows}
        missing = [e for e in exp_ids if e not in known]
        if missing:
            raise ValueError(f"plot_fit: unknown exp_ids {missing}")
        rows = [known[e] for e in exp_ids]
    if not rows:
        raise ValueError("plot_fit: the dataset has no experiments to plot")
    dense = predict_dense(
        predictors, dataset, simulate_fn, state_to_output, solver, n_points=n_points
    )
    ncols = min(len(rows), 2)
    nrows = -(-len(rows) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 2.8 * nrows), squeeze=False, layout="constrained"
    )
    for ax, (exp_id, b, r) in zip(axes.flat, rows, strict=False):
        bp = dataset.bucket_payloads[b]
        ts_dense, pred = (np.asarray(a) for a in dense[b])
        ts = np.asarray(bp.ts[r])
        measured, predicted = [], []
        for colour, name in enumerate(shown):
            d = names.index(name)
            m = np.asarray(bp.mask[r, :, d])
            t_obs, y_obs = ts[m], np.asarray(bp.y_observed[r, :, d])[m]
            t_fit, y_fit = ts_dense[r], np.array(pred[r, :, d], dtype=float)
            if log_y:
                y_obs = np.where(y_obs > 0, y_obs, np.nan)
                y_fit = np.where(y_fit > 0, y_fit, np.nan)
            ax.plot(t_obs, y_obs, "o", ms=3, color=f"C{colour}")
            ax.plot(t_fit, y_fit, "-", lw=1.4, color=f"C{colour}", label=name)
            measured.append(_inside(t_obs, y_obs, t_range))
            predicted.append(_inside(t_fit, y_fit, t_range))
        if t_range is not None:
            ax.set_xlim(*t_range)
        if log_y:
            ax.set_yscale("log")
            limits = _log_limits(np.concatenate(measured), np.concatenate(predicted))
            if limits is not None:
                ax.set_ylim(*limits)
        elif t_range is not None:
            limits = _linear_limits(np.concatenate([*measured, *predicted]))
            if limits is not None:
                ax.set_ylim(*limits)
        ax.set_title(exp_id or f"bucket {b} row {r}", fontsize=9)
        ax.set_xlabel("t")
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    axes.flat[0].legend(frameon=False, fontsize=8)
    return fig


def _inside(t: np.ndarray, y: np.ndarray, t_range: tuple[float, float] | None) -> np.ndarray:
    """The finite values of `y` whose time lies in `t_range` (all of them without one)."""
    keep = np.isfinite(y)
    if t_range is not None:
        keep &= (t >= t_range[0]) & (t <= t_range[1])
    return y[keep]


def _log_limits(measured: np.ndarray, predicted: np.ndarray) -> tuple[float, float] | None:
    # The lower limit comes from the data, not from the curve, whose start at 0 would otherwise
    # reach down to 1e-12 and flatten everything measured into the top of the panel.
    measured, predicted = measured[measured > 0], predicted[predicted > 0]
    if not measured.size and not predicted.size:
        return None
    low = measured.min() / 10 if measured.size else predicted.min()
    high = max(measured.max() if measured.size else 0.0, predicted.max() if predicted.size else 0)
    return low, high * 1.5


def _linear_limits(values: np.ndarray) -> tuple[float, float] | None:
    if not values.size:
        return None
    low, high = float(values.min()), float(values.max())
    pad = 0.05 * (high - low) if high > low else max(abs(high), 1.0) * 0.05
    return low - pad, high + pad
