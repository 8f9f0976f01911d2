"""The whole training objective as one function of the predictors, for optimisers that need it.

Optimisers with a line search (`optax.lbfgs`, chains ending in
`optax.scale_by_zoom_linesearch` or `optax.scale_by_backtracking_linesearch`) call the
objective at trial parameters inside their `update`. [`hybrid_kernels.build_objective`][]
gives them the objective a training step descends: every bucket's loss (with its trajectory
penalty) combined under the reduction, plus the weighted once-per-step penalty.

Its value is the forward-only score of each bucket (no backward pass); its gradient, when a
line search asks for one, is exactly the trainer's: each bucket's gradient from the bucket
kernel's body (forward or reverse sensitivities as the `SolverConfig` says), combined with
the same weights, plus the penalty's. So `jax.value_and_grad(objective)` costs one bucket step
per bucket, not a second differentiation through the solver.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

from hybrid_kernels._dtypes import default_float
from hybrid_kernels._kernels import (
    _bucket_step,
    _Objective,
    _penalty_step,
    _score_bucket,
    build_bucket_step,
    without_rows,
)
from hybrid_kernels._losses import resolve_loss_fn
from hybrid_kernels._penalties import bound_penalty
from hybrid_kernels._preflight import check_fraction, check_weight
from hybrid_kernels._quiet import is_quiet, quiet
from hybrid_kernels._reductions import REDUCTIONS, bucket_weights
from hybrid_kernels._trainable import trainable_mask


class Objective(eqx.Module):
    """`objective(predictors) -> scalar`: the training objective at `predictors`.

    Built by [`hybrid_kernels.build_objective`][] (or by the trainer for a phase). Jittable,
    and differentiable with respect to the trainable leaves (frozen leaves get no gradient).
    Fields are the phase's data and weights; the kernels' callables are static.
    """

    payloads: tuple[Any, ...]
    weights: Float[Array, " B"]
    fraction: Float[Array, ""]
    tp_weight: Float[Array, ""]
    penalty_weight: Float[Array, ""]
    points: tuple[Any, ...]
    trainable: Any
    body: _Objective = eqx.field(static=True)
    penalty_fn: Callable[..., Any] | None = eqx.field(static=True)
    # Set by `_trials_on`: the value is NaN where any row still scored fails.
    _strict: bool = eqx.field(static=True, default=False)

    def __call__(self, predictors: Any) -> Float[Array, ""]:
        return _call(self, predictors)

    def for_trials(self, at: Any = None) -> Objective:
        """This objective as a line search's `value_fn` should see it: under
        `SolverConfig(throw=True)`, a trial whose solve fails (in `solver.diffeqsolve` or in a
        `diffrax.diffeqsolve` that `simulate_fn` calls itself) makes the value NaN instead of
        raising inside the optimiser's update; optax's line searches treat NaN as outside the
        domain and shrink the step. Where every solve succeeds the value and gradient are
        this objective's.

        Under `throw=False` a failed experiment is masked out of the value, so a trial at which
        one fails drops its loss and looks like a descent. Pass `at`, the predictors the line
        search starts from: each trial is then scored on the experiments that solve at `at`
        (those that fail there stay out, as the step's own value leaves them out) and is NaN
        where another fails, as the trainer's line searches score them. This costs one
        forward solve of every bucket at `at`; under `throw=True` `at` is not needed and not
        solved.

        Keep the objective itself for the parameters a run holds, where a failed solve must
        raise; the trainer passes `for_trials()` to its line searches.

        **Arguments:**

        - `at`: the predictors (the same structure the objective is called with) of the
            point a line search starts from, or `None`.
        """
        trials = dataclasses.replace(self, body=trial_body(self.body))
        if at is None or self.body.solver.throw:
            return trials
        return trials._trials_on(_failed_rows(self, at))

    def _trials_on(self, failed: tuple[Array, ...]) -> Objective:
        """The objective a line search's trials see in a `throw=False` step whose rows
        `failed` (one `[N]` bool array per bucket) did not solve at the point it starts from:
        those rows left out, as the step's own value leaves them out, and the value NaN where
        any other real row fails. Scored as a step is instead, a trial at which an experiment
        fails drops that experiment's loss, so the search would take a step into the region
        where the experiment fails as a descent (measured, `test_train_lbfgs_throw_false.py`'s
        problem: Adam then L-BFGS settled there, its best loss 1.7e-7 on the two rigs left,
        where the best fit of all three rigs has 0.0019)."""
        # A zero row weight also keeps a left-out row's failure out of `_measured`.
        payloads = tuple(
            without_rows(bp, f)._replace(row_weights=jnp.where(f, 0, bp.row_weights))
            for bp, f in zip(self.payloads, failed, strict=True)
        )
        return dataclasses.replace(self, payloads=payloads, _strict=True)


@eqx.filter_jit
def _failed_rows(objective: Objective, predictors: Any) -> tuple[Array, ...]:
    """Each bucket's rows whose solve fails at `predictors`, `[N]` bool per bucket (forward
    only)."""
    o = objective
    return tuple(
        _score_bucket(o.body, predictors, bp, o.fraction, o.tp_weight)[1] for bp in o.payloads
    )


def _mask(objective: Objective, predictors: Any) -> Any:
    trainable = objective.trainable
    if trainable is None:
        return trainable_mask(predictors)
    if isinstance(trainable, types.FunctionType | types.BuiltinFunctionType):
        return trainable_mask(predictors, trainable)
    return trainable


@eqx.filter_jit
def _call(objective: Objective, predictors: Any) -> Array:
    diff, static = eqx.partition(predictors, _mask(objective, predictors))
    return _value(diff, static, objective)


def _any_solved(failed: list[Array], payloads: tuple[Any, ...]) -> Array:
    ok = [(~f & (bp.row_weights > 0)).any() for f, bp in zip(failed, payloads, strict=True)]
    return jnp.any(jnp.stack(ok))


def trial_body(body: _Objective) -> _Objective:
    """`body` as a line search's trials run it: under `throw=True`, traced without host
    callbacks (`_quiet`), so that a trial whose solve fails poisons its row with NaN instead of
    raising inside the optimiser's update, and the whole value is NaN (`_measured`). optax's
    line searches treat a NaN value as outside the domain and shrink the step; a trial is not
    a step the run takes, so `throw=True` still holds at every parameter it keeps."""
    solver = quiet(body.solver)
    return body if solver is body.solver else dataclasses.replace(body, solver=solver)


def _measured(total: Array, failed: list[Array], objective: Objective) -> Array:
    """`total`, or NaN where it measured nothing: every experiment failed (`throw=False`, as in
    the trainer), or, for a trial body (`trial_body`, `Objective._trials_on`), any real row
    did."""
    total = jnp.where(_any_solved(failed, objective.payloads), total, jnp.nan)
    if is_quiet(objective.body.solver) or objective._strict:
        real = [f & (bp.row_weights > 0) for f, bp in zip(failed, objective.payloads, strict=True)]
        total = jnp.where(jnp.any(jnp.stack([r.any() for r in real])), jnp.nan, total)
    return total


@eqx.filter_custom_jvp
def _value(diff, static, objective):
    """The value, forward only: each bucket scored once, no backward pass."""
    predictors = eqx.combine(diff, static)
    o = objective
    losses, failed = [], []
    for bp in o.payloads:
        loss, f, _ = _score_bucket(o.body, predictors, bp, o.fraction, o.tp_weight)
        losses.append(loss)
        failed.append(f)
    total = sum(o.weights[b].astype(loss.dtype) * loss for b, loss in enumerate(losses))
    total = _measured(total, failed, o)
    if o.penalty_fn is not None:
        pen = o.penalty_fn(predictors, o.points)
        total = total + (o.penalty_weight * pen).astype(total.dtype)
    return total


@_value.def_jvp
def _value_jvp(primals, tangents):
    # Only the trainable leaves (`diff`) have a gradient: tangents of frozen leaves and of
    # the data are ignored, as the trainer's partition ignores them.
    diff, static, objective = primals
    t_diff = tangents[0]
    value, grads = value_and_grad(objective, eqx.combine(diff, static))
    is_none = lambda x: x is None  # noqa: E731
    g_leaves = jax.tree_util.tree_leaves(grads, is_leaf=is_none)
    t_leaves = jax.tree_util.tree_leaves(t_diff, is_leaf=is_none)
    tangent = jnp.zeros((), value.dtype)
    for g, t in zip(g_leaves, t_leaves, strict=True):
        if g is not None and t is not None:
            tangent = tangent + jnp.vdot(g, t).real.astype(value.dtype)
    return value, tangent


def value_and_grad(objective: Objective, predictors: Any) -> tuple[Array, Any]:
    """`(value, grads)` from the bucket kernels' bodies: the trainer's step gradient."""
    o = objective
    mask = _mask(o, predictors)
    losses, grads, failed = [], [], []
    for bp in o.payloads:
        loss, g, f, _ = _bucket_step(o.body, mask, predictors, bp, o.fraction, o.tp_weight)
        losses.append(loss)
        grads.append(g)
        failed.append(f)
    w = [o.weights[b].astype(loss.dtype) for b, loss in enumerate(losses)]
    total = sum(wb * loss for wb, loss in zip(w, losses, strict=True))
    total = _measured(total, failed, o)
    combined = jax.tree.map(lambda *gs: sum(wb * g for wb, g in zip(w, gs, strict=True)), *grads)
    if o.penalty_fn is not None:
        pen, pen_grads = _penalty_step(o.penalty_fn, mask, predictors, o.penalty_weight, o.points)
        total = total + (o.penalty_weight * pen).astype(total.dtype)
        combined = jax.tree.map(jnp.add, combined, pen_grads)
    return total, combined


@eqx.filter_jit
def stored_value_and_grad(objective: Objective, predictors: Any, opt_state: Any) -> tuple:
    """The value and gradient of `objective` a line search stored in `opt_state` for
    `predictors` (the parameters its update returned), split as a step reports them:
    `(loss, grads, penalty, penalty_grads)`, with the penalty's gradient already in `grads`
    (`penalty_grads` is zeros) and `penalty`, `penalty_grads` `None` when it is off.

    Read, never recomputed. `optax.value_and_grad_from_state` recomputes them where the stored
    value is not finite, which here would give the same value (the state holds this
    objective's value at these parameters), but it puts the whole gradient program in a
    `lax.cond` branch that compiles at the first stored step and never runs (7.1 s of XLA
    compile there on a 10-experiment reactor model, `JAX_LOG_COMPILES`)."""
    value = optax.tree_utils.tree_get(opt_state, "value")
    grads = optax.tree_utils.tree_get(opt_state, "grad")
    if objective.penalty_fn is None:
        return value, grads, None, None
    pen = objective.penalty_fn(predictors, objective.points)
    loss = value - (objective.penalty_weight * pen).astype(value.dtype)
    return loss, grads, pen, jax.tree.map(jnp.zeros_like, grads)


def make_objective(
    body: _Objective,
    trainable: Any,
    payloads: Sequence[Any],
    weights: Any,
    *,
    fraction: Any = 1.0,
    tp_weight: Any = 0.0,
    penalty_fn: Callable[..., Any] | None = None,
    penalty_weight: Any = 0.0,
    points: Sequence[Any] = (),
) -> Objective:
    """An `Objective` from a bucket kernel's body; `penalty_weight == 0` charges no penalty."""
    dtype = default_float()
    penalty_on = penalty_fn is not None and float(penalty_weight) > 0
    return Objective(
        payloads=tuple(payloads),
        weights=jnp.asarray(weights, dtype),
        fraction=jnp.asarray(fraction, dtype),
        tp_weight=jnp.asarray(tp_weight, dtype),
        penalty_weight=jnp.asarray(penalty_weight, dtype),
        points=tuple(jnp.asarray(p) for p in points),
        trainable=trainable,
        body=body,
        penalty_fn=penalty_fn if penalty_on else None,
    )


def build_objective(
    dataset: Any,
    *,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: Any,
    trainable: Any = None,
    loss: str | Callable[..., Array] = "mse",
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
    reduction: str = "per_bucket",
    length_mask_fraction: float = 1.0,
    trajectory_penalty_fn: Callable[[Array, Any], Array] | None = None,
    trajectory_penalty_weight: float = 0.0,
    penalty_fn: Callable[[Any, tuple[Array, ...]], Array] | None = None,
    penalty_weight: float = 0.0,
    penalty_points: Sequence[Any] = (),
) -> Objective:
    """Return the training objective over every bucket of `dataset`: `(predictors) -> scalar`.

    The value is `Σ_b w_b · loss_b + penalty_weight · penalty_fn(predictors, penalty_points)`
    with the weights `w_b` of `reduction` ([`hybrid_kernels.bucket_weights`][]): the loss a
    training step reports plus the weighted penalty it descends. Made for optimisers whose
    update takes `value`, `grad` and `value_fn` (`optax.lbfgs`, line searches); see the custom
    loop guide. Jittable; compiled once per predictor structure and reused.

    Its gradient is taken with respect to the trainable leaves only (frozen leaves get
    none), through the bucket kernels (forward or reverse sensitivities as `solver` says),
    so `jax.value_and_grad(objective)` equals one training step's loss and gradient.

    **Arguments:**

    - `dataset`: a [`hybrid_kernels.Dataset`][] (or any object with `bucket_payloads`).
    - `simulate_fn`, `state_to_output`, `solver`: as for
        [`hybrid_kernels.train_with_optax`][].
    - `trainable`: a boolean mask over the predictors, an equinox filter function, or `None`
        for `trainable_mask(predictors)`, as for `train_with_optax`.
    - `loss`, `channel_idx`, `channel_weights`, `reduction`, `trajectory_penalty_fn`,
        `trajectory_penalty_weight`: as in [`hybrid_kernels.OptaxTrainingConfig`][].
    - `length_mask_fraction`: the fraction in (0, 1] of each time axis scored.
    - `penalty_fn`: `(predictors, points) -> scalar`; `None` is
        [`hybrid_kernels.bound_penalty`][]. Charged only when `penalty_weight > 0`.
    - `penalty_weight`: its weight (finite, >= 0).
    - `penalty_points`: the point arrays `penalty_fn` reads, as
        [`hybrid_kernels.build_penalty_step`][] takes them. The trainer's bound penalty reads
        `select_penalty_points(data_penalty_points(predictors, dataset), extras, fraction)`.

    **Returns:** an `Objective`, called as `objective(predictors)`; a scalar of the
    predictors' float dtype (NaN when, under `SolverConfig(throw=False)`, every experiment
    failed).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"build_objective: reduction={reduction!r}; expected one of {REDUCTIONS}")
    payloads = tuple(getattr(dataset, "bucket_payloads", ()))
    if not payloads:
        raise ValueError("build_objective: dataset has no buckets; nothing to score")
    check_fraction(length_mask_fraction)
    check_weight(penalty_weight, "penalty_weight")
    if penalty_fn is not None and not callable(penalty_fn):
        raise TypeError(f"build_objective: penalty_fn must be callable; got {penalty_fn!r}")
    loss_fn = resolve_loss_fn(loss, channel_idx, channel_weights)
    kernel = build_bucket_step(
        simulate_fn,
        state_to_output,
        solver,
        loss_fn,
        trainable,
        trajectory_penalty_fn,
        trajectory_penalty_weight,
    )
    return make_objective(
        kernel._objective,
        trainable,
        payloads,
        bucket_weights(dataset, reduction, length_mask_fraction),
        fraction=length_mask_fraction,
        tp_weight=trajectory_penalty_weight,
        penalty_fn=bound_penalty if penalty_fn is None else penalty_fn,
        penalty_weight=penalty_weight,
        points=penalty_points,
    )
