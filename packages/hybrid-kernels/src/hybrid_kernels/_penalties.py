"""The bound penalty: keep bounded predictors out of their saturated squash tails.

The penalty reads only the predictors and fixed point arrays, never the data loss, so it is
charged once per training step by `build_penalty_step`, outside the bucket loop. Points come
from two places: the covariates a predictor actually sees in the data
(:func:`data_penalty_points`, narrowed to the scored prefix by :func:`select_penalty_points`),
and extra points the user supplies (for example a :func:`box_grid`).

The host-side helpers here run between steps, never inside a jit: they decide array shapes.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from hybrid_kernels._bounded import _WARPS, BoundedPredictor, BoundScaler
from hybrid_kernels._cells import scored
from hybrid_kernels._preflight import check_int


def _bounded_nodes(predictors: Any) -> list[BoundedPredictor]:
    """Every `BoundedPredictor` in `predictors`, depth-first, each before those nested in it."""
    found: list[BoundedPredictor] = []
    is_node = lambda x: isinstance(x, BoundedPredictor)  # noqa: E731
    for leaf in jtu.tree_leaves(predictors, is_leaf=is_node):
        if is_node(leaf):
            found.append(leaf)
            found.extend(_bounded_nodes(leaf.inner))
    return found


def bound_penalty(predictors: Any, points: Sequence[Float[ArrayLike, "G n_inputs"]]) -> Array:
    """Saturation of every bounded predictor's output latents at the given points.

    **Arguments:**

    - `predictors`: any pytree; its `BoundedPredictor` nodes are found depth-first, an outer
      node before the nodes nested inside it.
    - `points`: one array `[G, n_inputs]` of physical inputs per node, in that order (as
      :func:`select_penalty_points` returns them). An empty array (`G = 0`) adds exactly 0.

    **Returns:**

    A non-negative scalar: the sum over nodes of `out_scaler.saturation(latents)`; zero when no
    latent passes its knee.
    """
    nodes = _bounded_nodes(predictors)
    if len(points) != len(nodes):
        raise ValueError(
            f"points holds {len(points)} arrays but predictors contain {len(nodes)} "
            "BoundedPredictor nodes; pass one [G, n_inputs] array per node"
        )
    total = jnp.zeros(())
    for i, (node, pts) in enumerate(zip(nodes, points, strict=True)):
        pts = jnp.asarray(pts)
        if pts.size == 0:
            continue
        if pts.ndim != 2 or pts.shape[1] != node.n_inputs:
            raise ValueError(
                f"points[{i}] has shape {pts.shape}; expected (G, {node.n_inputs}) for the node "
                f"reading {node.input_keys}"
            )
        latents = jax.vmap(node.latent)(pts)
        total = total + node.out_scaler.saturation(latents)
    return total


class PenaltyPointSource(NamedTuple):
    """The measured cells one bounded predictor sees in a dataset (host-side NumPy).

    - `points [G, n_inputs]`: the predictor's inputs, one row per measured cell;
    - `cell_ts [G]`: the cell's row index on its bucket's time axis;
    - `cell_T [G]`: the length the length mask is computed from for that row.
    """

    points: np.ndarray
    cell_ts: np.ndarray
    cell_T: np.ndarray


def data_penalty_points(predictors: Any, dataset: Any) -> tuple[PenaltyPointSource | None, ...]:
    """Gather, per bounded predictor, its inputs at every measured cell of `dataset`.

    A cell is one (experiment, time row) where any channel is measured; probes and padded rows
    contribute nothing. Covariates are constant in time, so a predictor's input at a cell is
    its experiment's covariates, repeated once per measured row: the penalty weighs the data
    the way the loss does.

    **Arguments:**

    - `predictors`: the pytree whose `BoundedPredictor` nodes are searched (see
      :func:`bound_penalty` for the order).
    - `dataset`: a `Dataset`.

    **Returns:**

    One entry per node: a :class:`PenaltyPointSource`, or `None` when some of the node's
    `input_keys` are not dataset covariates (an embedded predictor, whose inputs are states).
    """
    nodes = _bounded_nodes(predictors)
    chunks: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in nodes]
    resolvable = [True] * len(nodes)
    for bp in dataset.bucket_payloads:
        measured = np.asarray(bp.mask).any(axis=-1) & (np.asarray(bp.row_weights) > 0)[:, None]
        rows, times = np.nonzero(measured)  # [N, T] cells
        lengths = np.asarray(bp.row_lengths)
        for j, node in enumerate(nodes):
            if not all(k in bp.covariates for k in node.input_keys):
                resolvable[j] = False
                continue
            cols = []
            for k in node.input_keys:
                cov = np.asarray(bp.covariates[k])
                if cov.ndim != 1:
                    raise ValueError(
                        f"covariate {k!r} feeds BoundedPredictor input_keys {node.input_keys} "
                        f"but is a vector of shape {cov.shape[1:]} per experiment; bounded "
                        "predictors read scalar covariates"
                    )
                cols.append(cov[rows])
            points = np.stack(cols, axis=-1) if cols else np.zeros((rows.size, 0))
            chunks[j].append((points, times, lengths[rows]))
    sources: list[PenaltyPointSource | None] = []
    for j, node in enumerate(nodes):
        if not resolvable[j]:
            sources.append(None)
        elif not chunks[j]:
            empty = np.zeros((0,), dtype=np.int64)
            sources.append(PenaltyPointSource(np.zeros((0, node.n_inputs)), empty, empty))
        else:
            parts = zip(*chunks[j], strict=True)
            sources.append(PenaltyPointSource(*(np.concatenate(p) for p in parts)))
    return tuple(sources)


def _check_fraction(fraction: Any) -> float:
    if isinstance(fraction, jax.Array):
        try:
            fraction = float(fraction)
        except Exception:  # a tracer: its value is unknown on the host
            fraction = None
    if not isinstance(fraction, numbers.Real):
        raise TypeError(
            "fraction must be a concrete Python float (it decides host-side array shapes); "
            f"got {type(fraction).__name__}"
        )
    fraction = float(fraction)
    if not (0 < fraction <= 1):
        raise ValueError(f"fraction must be in (0, 1]; got {fraction}")
    return fraction


def select_penalty_points(
    sources: Sequence[PenaltyPointSource | None],
    extras: Sequence[ArrayLike | None] = (),
    fraction: float = 1.0,
) -> tuple[Float[Array, "G n_inputs"], ...]:
    """The point arrays `bound_penalty` reads for one training phase.

    Per node: the measured points the length mask keeps at `fraction`, followed by the user's
    extra points; or the extras alone when the node has no data source; or an empty `(0, 0)`
    array (which adds exactly 0 to the penalty). Call it once per phase, on the host: the
    result's shapes are what `penalty_step` compiles for.

    **Arguments:**

    - `sources`: from :func:`data_penalty_points`.
    - `extras`: either empty, or one entry per node: an array `[G_extra, n_inputs]` or `None`.
    - `fraction`: the phase's length-mask fraction, a concrete float in (0, 1].
    """
    fraction = _check_fraction(fraction)
    if len(extras) not in (0, len(sources)):
        raise ValueError(
            f"extras must be empty or hold one entry per bounded predictor ({len(sources)}); "
            f"got {len(extras)}"
        )
    selected = []
    for j, source in enumerate(sources):
        parts = []
        if source is not None and len(source.points):
            keep = np.asarray(scored(source.cell_ts, source.cell_T, fraction))
            parts.append(np.asarray(source.points)[keep])
        extra = extras[j] if extras else None
        if extra is not None and np.size(extra):
            parts.append(np.asarray(extra))
        if not parts:
            selected.append(jnp.zeros((0, 0)))
        else:
            selected.append(jnp.asarray(np.concatenate(parts, axis=0)))
    return tuple(selected)


def validate_penalty_points(
    predictors: Any,
    sources: Sequence[PenaltyPointSource | None],
    extras: Sequence[ArrayLike | None] = (),
    *,
    enabled: bool,
) -> None:
    """Check the penalty's point sources before training; raise `ValueError` on a mismatch.

    - `sources` holds one entry per `BoundedPredictor` node of `predictors`;
    - `extras` is empty or holds one entry per node, each `None` or a finite array
      `[G, n_inputs]`;
    - when `enabled`, every node is reached by data points or extras: a predictor embedded in
      the dynamics (its inputs are states) needs extras, or the trajectory penalty instead.
    """
    nodes = _bounded_nodes(predictors)
    if len(sources) != len(nodes):
        raise ValueError(
            f"sources holds {len(sources)} entries but predictors contain {len(nodes)} "
            "BoundedPredictor nodes; build them with data_penalty_points(predictors, dataset)"
        )
    if len(extras) not in (0, len(nodes)):
        raise ValueError(
            f"extras must be empty or hold one entry per BoundedPredictor node ({len(nodes)}); "
            f"got {len(extras)}"
        )
    for j, node in enumerate(nodes):
        extra = extras[j] if extras else None
        if extra is not None:
            arr = np.asarray(extra)
            if arr.ndim != 2 or arr.shape[1] != node.n_inputs:
                raise ValueError(
                    f"extras[{j}] has shape {arr.shape}; expected (G, {node.n_inputs}) with "
                    f"columns {node.input_keys}"
                )
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"extras[{j}] holds non-finite values")
        covered = (sources[j] is not None and len(sources[j].points) > 0) or (
            extra is not None and np.size(extra) > 0
        )
        if enabled and not covered:
            raise ValueError(
                f"BoundedPredictor node {j} (inputs {node.input_keys}) has no penalty points: its "
                "inputs are not dataset covariates and no extras were given. Pass extra points "
                "for it (for example box_grid(node.in_scaler)), or, for a predictor embedded in "
                "the dynamics, use a trajectory penalty instead."
            )


def box_grid(in_scaler: BoundScaler, n_per_dim: int = 5) -> Float[Array, "G n_inputs"]:
    """A tensor grid over `in_scaler`'s box, uniform in warped coordinates.

    Each axis is cut into `n_per_dim` equal cells in warped coordinates (a log warp covers
    decades evenly) and the grid takes the cell centres, so no point sits on a bound.

    **Returns:**

    An array `[n_per_dim ** n_inputs, n_inputs]` of physical points; the last input varies
    fastest.
    """
    n_per_dim = check_int(n_per_dim, "box_grid: `n_per_dim`", minimum=2)
    forward, inverse = _WARPS[in_scaler.warp]
    centres = (np.arange(n_per_dim) + 0.5) / n_per_dim
    axes = []
    for low, high in in_scaler.bounds:
        lo, hi = float(forward(np.float64(low))), float(forward(np.float64(high)))
        axes.append(np.asarray(inverse(lo + (hi - lo) * centres), dtype=np.float64))
    mesh = np.meshgrid(*axes, indexing="ij")
    grid = np.stack([m.reshape(-1) for m in mesh], axis=-1)
    return jnp.asarray(grid)
