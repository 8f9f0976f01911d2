"""The training kernels: small jitted pieces a Python loop over buckets composes.

- [`hybrid_kernels.build_bucket_step`][]: `(loss, grads)` of one bucket, one trace per shape.
- [`hybrid_kernels.build_score_bucket`][]: the same objective, forward only.
- [`hybrid_kernels.build_penalty_step`][]: a regulariser charged once per step.
- [`hybrid_kernels.build_apply_update`][]: the single optimiser update.

What is traced: every array argument (predictors' array leaves, the bucket payload, the length
fraction, weights, penalty points). Python floats given for fractions and weights are turned
into arrays of jax's default float dtype before dispatch, and weak-typed leaves of the
predictors are made strong, so neither a new value nor an optimiser update recompiles a kernel.
What is static: the callables, the solver config and the trainable mask, fixed at build time.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax
from jaxtyping import Array, Float

from hybrid_kernels import _preflight as pf
from hybrid_kernels import _sensitivity as sensitivity
from hybrid_kernels._cells import scored_rows
from hybrid_kernels._data import BucketPayload
from hybrid_kernels._dispatch import (
    _BucketKernel,
    _check_build,
    _check_tp,
    _scalar,
    _strong,
    _strong_flat,
)
from hybrid_kernels._errors import no_host_callbacks
from hybrid_kernels._quiet import callback_free, is_quiet, loud
from hybrid_kernels._simulate import _simulate_bucket, _simulate_with_steps
from hybrid_kernels._solver import SolverConfig


def apply_length_mask(bp: BucketPayload, length_mask_fraction: Array) -> BucketPayload:
    """Narrow the bucket's mask to the first `length_mask_fraction` of each row's times.

    Only the loss is masked: the solver still integrates the whole trajectory. The cutoff is
    `max(ceil(L * fraction), 1)` union rows, where `L` is the row's own union length
    (`bp.row_lengths`), so a padded bucket scores exactly the cells an unpadded
    one would. The clamp at 1 keeps a tiny fraction from silently scoring nothing. `n_obs` is
    recomputed from the new mask. The fraction stays traced: changing it never recompiles.

    **Arguments:**

    - `bp`: the bucket.
    - `length_mask_fraction`: a scalar in (0, 1].

    **Returns:** the bucket with `mask` and `n_obs` narrowed.
    """
    keep = scored_rows(bp.row_lengths, bp.ts.shape[1], length_mask_fraction)  # [N, T]
    return with_mask(bp, bp.mask & keep[:, :, None])


def with_mask(bp: BucketPayload, mask: Array) -> BucketPayload:
    """`bp` scoring only the cells of `mask` `[N, T, D]`, its `n_obs` counted from them."""
    return bp._replace(mask=mask, n_obs=mask.sum().astype(bp.n_obs.dtype))


def without_rows(bp: BucketPayload, rows: Array) -> BucketPayload:
    """`bp` with the rows flagged in `rows` `[N]` (bool) masked out of its loss."""
    return with_mask(bp, bp.mask & ~rows[:, None, None])


def _project(full, bp, state_to_output):
    pred = jax.vmap(state_to_output)(full)
    pf.check_output(pred, bp)
    return pred


def predict_bucket_obs(
    predictors: Any,
    bp: BucketPayload,
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: SolverConfig,
) -> Float[Array, "N T D"]:
    """Simulate every experiment in the bucket and project to `[N, T, D]`.

    Not jitted: each caller traces it into its own `eqx.filter_jit`, which keeps training and
    prediction caches separate.

    **Arguments:**

    - `predictors`: any pytree of modules, passed unchanged to `simulate_fn`.
    - `bp`: the bucket.
    - `simulate_fn`: `(predictors, ts [T], covariates, y0 [S], solver) -> [T, S]`.
    - `state_to_output`: `[T, S] -> [T, D]`.
    - `solver`: the [`hybrid_kernels.SolverConfig`][].
    """
    full = _simulate_bucket(predictors, bp, simulate_fn=simulate_fn, solver=solver)
    return _project(full, bp, state_to_output)


class _Objective(eqx.Module):
    """Data loss (+ weighted trajectory penalty) of one bucket, and per-row failure flags."""

    simulate_fn: Callable = eqx.field(static=True)
    state_to_output: Callable = eqx.field(static=True)
    solver: SolverConfig = eqx.field(static=True)
    loss_fn: Callable = eqx.field(static=True)
    trajectory_penalty_fn: Callable | None = eqx.field(static=True)

    def __call__(self, predictors, bp, fraction, tp_weight, *, differentiable=False):
        bp_m = apply_length_mask(bp, fraction)
        if self.solver.throw:
            full, steps = _simulate_with_steps(
                predictors, bp_m, simulate_fn=self.simulate_fn, solver=self.solver
            )
        else:
            full, failed, bp_m, steps = self._tolerant(predictors, bp_m, differentiable)
        pred = _project(full, bp_m, self.state_to_output)
        if self.solver.throw:
            # No solve failed (it would have raised), but a row whose scored predictions are
            # not finite makes the loss non-finite: flag it, so the skipped step names it.
            failed = ~jnp.all(jnp.isfinite(pred) | ~bp_m.mask, axis=(1, 2))
            if is_quiet(self.solver):  # a failed check left NaN somewhere in the row: suspect
                failed = failed | ~jnp.all(jnp.isfinite(full), axis=tuple(range(1, full.ndim)))
        loss = self.loss_fn(pred, bp_m)
        pf.check_scalar(loss, "loss_fn", bp)
        if self.trajectory_penalty_fn is not None:
            pen = self.trajectory_penalty_fn(full, bp_m)
            pf.check_scalar(pen, "trajectory_penalty_fn", bp)
            loss = loss + jnp.where(tp_weight != 0, tp_weight * pen, 0.0).astype(loss.dtype)
        return loss, (failed, jax.lax.stop_gradient(steps))

    def _tolerant(self, predictors, bp, differentiable):
        """The `throw=False` solve: failed rows flagged, zeroed and masked out.

        A failed solve (max_steps reached, non-finite state) leaves non-finite states in its
        row. Masking the row keeps it out of the value, but not out of the gradient: the
        backward pass multiplies a zero cotangent by the row's non-finite Jacobians, giving
        NaN. So a differentiable call first solves forward only to find the failed rows, then
        re-solves with each failed row's inputs swapped for a healthy row's: the gradient is
        exactly that of the bucket without the failed rows, at the price of one extra forward
        solve per step in this mode.
        """
        simulate = functools.partial(
            _simulate_with_steps, simulate_fn=self.simulate_fn, solver=self.solver
        )
        if differentiable:
            frozen = jtu.tree_map(
                lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x, predictors
            )
            probe = jax.lax.stop_gradient(simulate(frozen, bp)[0])
            failed = ~jnp.all(jnp.isfinite(probe), axis=(1, 2))
            donor = jnp.argmax(~failed)  # first healthy row (row 0 if none is)

            def swap(a):
                rows = failed.reshape((-1,) + (1,) * (a.ndim - 1))
                return jnp.where(rows, a[donor], a)

            safe = bp._replace(
                ts=swap(bp.ts),
                y0=swap(bp.y0),
                covariates=jax.tree.map(swap, bp.covariates),
                inputs=jax.tree.map(swap, bp.inputs),
                jump_ts=jax.tree.map(swap, bp.jump_ts),
                jumps=jax.tree.map(swap, bp.jumps),
            )
            full, steps = simulate(predictors, safe)
        else:
            full, steps = simulate(predictors, bp)
            failed = ~jnp.all(jnp.isfinite(full), axis=(1, 2))
        full = jnp.where(failed[:, None, None], jnp.zeros_like(full), full)
        return full, failed, without_rows(bp, failed), steps


# The bodies. Module-level and jitted with the objective bound (`_flat_jit.entry`), so the
# compile cache is keyed on *what* a kernel computes rather than on which closure built it.


def _bucket_step(objective, trainable, predictors, bp, fraction, tp_weight):
    with no_host_callbacks(callback_free(objective.solver)):
        diff, static = eqx.partition(predictors, trainable)

        def f_for(solver):
            obj = dataclasses.replace(objective, solver=solver)

            def f(d):
                return obj(eqx.combine(d, static), bp, fraction, tp_weight, differentiable=True)

            return f

        # Forward or reverse: decided here, at trace time, from static shapes and from whether
        # forward mode can trace `simulate_fn` at all (_sensitivity).
        (loss, (failed, steps)), grads = sensitivity.value_and_grad(
            f_for, objective.solver, diff, key=_plain(objective)
        )
        if not objective.solver.throw:
            # Every row failed: even the donor row is unhealthy, so drop the whole gradient.
            grads = jax.tree.map(lambda g: jnp.where(failed.all(), jnp.zeros_like(g), g), grads)
    return loss, grads, failed, steps


def _plain(objective):
    # A quiet trace (`_quiet`) shares its ordinary trace's sensitivity decision and notice.
    solver = loud(objective.solver)
    return (
        objective if solver is objective.solver else dataclasses.replace(objective, solver=solver)
    )


def _score_bucket(objective, predictors, bp, fraction, tp_weight):
    with no_host_callbacks(callback_free(objective.solver)):
        loss, (failed, steps) = objective(predictors, bp, fraction, tp_weight)
        return loss, failed, steps


@eqx.filter_jit
def _penalty_step(penalty_fn, trainable, predictors, weight, points):
    diff, static = eqx.partition(predictors, trainable)

    def f(d):
        pen = penalty_fn(eqx.combine(d, static), points)
        if getattr(pen, "shape", None) != ():
            raise ValueError(
                f"penalty_fn returned shape {getattr(pen, 'shape', None)}; expected a "
                "scalar, shape ()."
            )
        return weight * pen, pen

    # The value is reported unweighted whatever the weight; at weight 0 the gradient is 0.
    (_, pen), grads = eqx.filter_value_and_grad(f, has_aux=True)(diff)
    return pen, grads


@eqx.filter_jit
def _apply_update(optimizer, trainable, predictors, grads, opt_state, value=None, value_fn=None):
    params, frozen = eqx.partition(predictors, trainable)
    if value_fn is None:
        # optax passes extra arguments only to transformations that take them (`chain` does
        # the same), so `value` reaches `reduce_on_plateau` and is ignored by the rest.
        reads = value is not None and isinstance(optimizer, optax.GradientTransformationExtraArgs)
        extra = {"value": value} if reads else {}
        updates, opt_state = optimizer.update(grads, opt_state, params, **extra)
    else:
        # The optimiser sees (and its line search moves) only the trainable leaves.
        def on_params(p):
            return value_fn(eqx.combine(_dtypes_of(params, p), frozen))

        updates, opt_state = optimizer.update(
            grads, opt_state, params, value=value, grad=grads, value_fn=on_params
        )
    return eqx.apply_updates(predictors, _dtypes_of(params, updates)), opt_state


def _dtypes_of(reference: Any, tree: Any) -> Any:
    """`tree` with each array leaf cast to the dtype of `reference`'s leaf.

    With x64 on, optax's line searches step in float64 whatever the parameters' dtype, so a
    float32 model's trial points and updates come back float64: its solves would then mix
    float32 states with a float64 vector field, which diffrax refuses. (Adam's updates keep
    the parameters' dtype; this changes nothing there.)"""

    def cast(old: Any, new: Any) -> Any:
        return new.astype(old.dtype) if eqx.is_inexact_array(old) and eqx.is_array(new) else new

    return jax.tree.map(cast, reference, tree)


def _build(where, jitted, trainable, spec, tp_weight, return_status) -> _BucketKernel:
    """Check a bucket kernel's build arguments and wrap its jitted body.

    `spec` is `(simulate_fn, state_to_output, solver, loss_fn, trajectory_penalty_fn)`;
    `trainable=None` builds a forward-only kernel.
    """
    _check_build(f"build_{where}", *spec[:4])
    _check_tp(spec[4], tp_weight)
    objective = _Objective(*spec)
    return _BucketKernel(
        jitted, objective, trainable, tp_weight, return_status, where, _score_bucket
    )


def build_bucket_step(
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: SolverConfig,
    loss_fn: Callable[[Array, BucketPayload], Array],
    trainable: Any,
    trajectory_penalty_fn: Callable[[Array, BucketPayload], Array] | None = None,
    trajectory_penalty_weight: float = 0.0,
    *,
    return_status: bool = False,
) -> Callable[..., tuple[Array, Any]]:
    """Return a jitted `bucket_step(predictors, bp, fraction) -> (loss, grads)`.

    One trace per bucket shape. No optimiser state goes in or out, and no bound penalty is
    charged here (see [`hybrid_kernels.build_penalty_step`][]).

    **Arguments:**

    - `simulate_fn`: `(predictors, ts [T], covariates, y0 [S], solver) -> [T, S]`.
    - `state_to_output`: `[T, S] -> [T, D]`; a stable module-level function.
    - `solver`: the [`hybrid_kernels.SolverConfig`][]. With `throw=False`, rows whose solve
        fails are masked out of the loss instead of failing the whole bucket.
    - `loss_fn`: `(pred_obs [N, T, D], bp) -> scalar`, e.g. [`hybrid_kernels.masked_mse`][].
    - `trainable`: a boolean mask over `predictors` (see [`hybrid_kernels.trainable_mask`][])
        or an equinox filter function.
    - `trajectory_penalty_fn`: optional `(full_state [N, T, S], bp) -> scalar`, added to the
        data loss of every bucket. Padding rows have `bp.row_weights == 0`; a penalty that sums
        over rows should weigh them by it.
    - `trajectory_penalty_weight`: the default weight of that penalty (finite, >= 0).
    - `return_status`: also return `failed [N]` bool flags (see
        [`hybrid_kernels.failed_exp_ids`][]): with `throw=False`, the rows whose solve failed
        (masked out of the loss); with `throw=True`, the rows whose scored predictions are
        not finite (they make the loss non-finite).

    **Returns:** `bucket_step(predictors, bp, length_mask_fraction,
    trajectory_penalty_weight=None)`. The weight is a traced argument: `None` uses the
    build-time value, a number overrides it for that call without recompiling. It returns
    `(loss, grads)`, or `(loss, grads, failed)` with `return_status=True`; `grads` has the
    structure of `eqx.filter(predictors, trainable)` (`None` at frozen leaves).

    After each call, `bucket_step.last_solver_steps` holds the solver effort of that call as
    an `[N, 2]` int32 device array: each row's accepted and rejected steps, read from
    diffrax's `stats` of the solve the loss already made (-1 where `simulate_fn` did not
    solve through `solver.diffeqsolve`). Reading it is the caller's choice of host sync.
    Once traced, `bucket_step.sensitivity_notice` is the text of `"auto"`'s reverse-mode
    fallback (forward mode could not differentiate `simulate_fn`), or `None`.
    """
    spec = (simulate_fn, state_to_output, solver, loss_fn, trajectory_penalty_fn)
    weight = trajectory_penalty_weight
    return _build("bucket_step", _bucket_step, trainable, spec, weight, return_status)  # type: ignore[return-value]


def build_score_bucket(
    simulate_fn: Callable[..., Array],
    state_to_output: Callable[[Array], Array],
    solver: SolverConfig,
    loss_fn: Callable[[Array, BucketPayload], Array],
    trajectory_penalty_fn: Callable[[Array, BucketPayload], Array] | None = None,
    trajectory_penalty_weight: float = 0.0,
    *,
    return_status: bool = False,
) -> Callable[..., Array]:
    """Return a forward-only `score_bucket(predictors, bp, fraction) -> loss`.

    The objective of [`hybrid_kernels.build_bucket_step`][] (data loss plus any trajectory
    penalty) without the backward pass, which would roughly triple the cost of a scoring sweep.
    Arguments as there; `score_bucket` also takes an optional `trajectory_penalty_weight`
    override, and returns `(loss, failed)` with `return_status=True`.
    """
    spec = (simulate_fn, state_to_output, solver, loss_fn, trajectory_penalty_fn)
    weight = trajectory_penalty_weight
    return _build("score_bucket", _score_bucket, None, spec, weight, return_status)  # type: ignore[return-value]


def build_penalty_step(
    penalty_fn: Callable[[Any, tuple[Array, ...]], Array],
    trainable: Any,
) -> Callable[..., tuple[Array, Any]]:
    """Return `penalty_step(predictors, weight, points=()) -> (penalty, weighted_grads)`.

    Charged once per training step, outside the bucket loop: the penalty reads only the
    predictors and its point arrays.

    **Arguments:**

    - `penalty_fn`: `(predictors, points) -> scalar`, e.g. `bound_penalty` or a custom
        regulariser that ignores `points`.
    - `trainable`: the mask, as for [`hybrid_kernels.build_bucket_step`][].

    **Returns:** `penalty_step`. `weight` (finite, >= 0) and `points` (a tuple of arrays) are
    traced; a new point shape retraces this small kernel only. It returns the *unweighted*
    penalty, whatever the weight (0 included), and the gradient of `weight * penalty` (zero
    when `weight == 0`), ready to add onto the combined data gradient.
    """

    seen: set = set()

    def run(predictors, weight, points=()):
        if not isinstance(weight, jax.Array):  # an array weight is checked on first use only
            pf.check_weight(weight, "weight")
        predictors, key = _strong_flat(predictors)
        if key not in seen:
            pf.check_weight(weight, "weight")
            pf.check_trainable(trainable, predictors)
            seen.add(key)
        pts = tuple(jnp.asarray(p) for p in points)
        return _penalty_step(penalty_fn, trainable, predictors, _scalar(weight), pts)

    return run


def build_apply_update(
    optimizer: Any,
    trainable: Any,
) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """Return a jitted `apply_update(predictors, grads, opt_state) -> (predictors, opt_state)`.

    The single optimiser update per training step. Create the state once with
    `optimizer.init(eqx.filter(predictors, trainable))`; rebuild it only on a reset.

    For an optimiser whose update reads the objective's value (a chain with
    `optax.contrib.reduce_on_plateau`), call `apply_update(predictors, grads, opt_state,
    value=value)`, `value` being the objective at `predictors` (a scalar). For one whose update
    calls the objective (`optax.lbfgs`, a chain ending in a line search), also pass
    `value_fn=objective`, a function of the whole predictors such as
    [`hybrid_kernels.build_objective`][] returns; the optimiser then receives `value`,
    `grad=grads` and `value_fn` restricted to the trainable leaves (the frozen ones held at
    their values in `predictors`). `value` reaches only an
    `optax.GradientTransformationExtraArgs` (as `optax.chain` passes it on); any other
    optimiser's update is called without it.

    **Arguments:**

    - `optimizer`: an `optax.GradientTransformation`.
    - `trainable`: the mask, as for [`hybrid_kernels.build_bucket_step`][].
    """

    def run(predictors, grads, opt_state, *, value=None, value_fn=None):
        if value_fn is not None and value is None:
            raise TypeError(
                "apply_update: value_fn needs value, the objective at predictors "
                "(apply_update(predictors, grads, opt_state, value=value, value_fn=objective))"
            )
        strong = (_strong(x) for x in (predictors, grads, opt_state))
        return _apply_update(optimizer, trainable, *strong, value, value_fn)

    return run
