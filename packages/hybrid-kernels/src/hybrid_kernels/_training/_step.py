"""One training step: the device state it consumes, the best-step rule, and the compiled tail.

A step is `bucket_step` on every bucket (one dispatch each, no host sync), then `penalty_step`
once, then one jitted *tail* that combines the bucket gradients with `combine_bucket_grads`,
adds the penalty gradient, calls `apply_update`, skips the update when anything is
non-finite, and applies the best-step rule. With one bucket and no penalty, `bucket_step`'s
body and the tail are traced into one program instead (`_whole_step`): one dispatch and one
compile, as a hand-written loop has. Nothing is read back to the host here: the step returns a
small device report that the loop reads when it has to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from hybrid_kernels import _flat_jit as fj
from hybrid_kernels._dispatch import _explain_backsolve
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._errors import RowSolveError
from hybrid_kernels._reductions import combine_bucket_grads


class Carry(eqx.Module):
    """What a step consumes and returns, all on the device.

    - `predictors`, `opt_state`: the parameters the next update starts from, and its state.
    - `best_predictors`, `best_loss`, `best_step`: the best snapshot so far and its score
        (`inf` and `-1` while there is none).
    - `since_best`: steps (validations, when the validation score is monitored) without a
        new best.
    - `step`: steps taken so far, over all phases.
    """

    predictors: Any
    opt_state: Any
    best_predictors: Any
    best_loss: jax.Array
    best_step: jax.Array
    since_best: jax.Array
    step: jax.Array


def new_carry(predictors: Any, opt_state: Any, step: int = 0) -> Carry:
    """A carry at `step` with nothing seen yet."""
    return Carry(
        predictors=predictors,
        opt_state=opt_state,
        best_predictors=predictors,
        best_loss=jnp.asarray(jnp.inf, dtype=default_float()),
        best_step=jnp.asarray(-1, dtype=jnp.int32),
        since_best=jnp.asarray(0, dtype=jnp.int32),
        step=jnp.asarray(step, dtype=jnp.int32),
    )


def forget_best(carry: Carry) -> Carry:
    """`carry` with the running minimum restarted from its current parameters."""
    return dataclasses.replace(
        carry,
        best_predictors=carry.predictors,
        best_loss=jnp.full_like(carry.best_loss, jnp.inf),
        best_step=jnp.full_like(carry.best_step, -1),
    )


def improve(carry: Carry, candidate: Any, score: jax.Array, ok: Any) -> Carry:
    """The one best-step rule: `candidate`, scored `score` at `carry.step`, becomes the best
    snapshot when `ok` and strictly better; otherwise one more step without a new best."""
    improved = ok & (score < carry.best_loss)
    return dataclasses.replace(
        carry,
        best_predictors=_select(improved, candidate, carry.best_predictors),
        best_loss=jnp.where(improved, score.astype(carry.best_loss.dtype), carry.best_loss),
        best_step=jnp.where(improved, carry.step, carry.best_step),
        since_best=jnp.where(improved, 0, carry.since_best + 1),
    )


improve_jit = eqx.filter_jit(improve)


def set_learning_rate(opt_state: Any, lr: float) -> Any:
    """`opt_state` with its injected learning rate replaced (same dtype, so no recompile)."""
    old = opt_state.hyperparams["learning_rate"]
    hyper = dict(opt_state.hyperparams)
    hyper["learning_rate"] = jnp.asarray(lr, dtype=jnp.asarray(old).dtype)
    return opt_state._replace(hyperparams=hyper)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    def pick(a: Any, b: Any) -> Any:
        return jnp.where(pred, a, b) if eqx.is_array(a) else a

    return jax.tree_util.tree_map(pick, on_true, on_false)


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def _made_nonfinite(before: Any, after: Any, grads: Any) -> jax.Array:
    """`[L]` bool, one per trainable leaf (an inexact array with a gradient), in tree order:
    whether the update made a finite entry non-finite. Entries already non-finite (a bound
    that is `inf`) are not counted."""
    flags: list[jax.Array] = []

    def check(g: Any, b: Any, a: Any) -> None:
        if g is not None and eqx.is_inexact_array(a):
            flags.append(jnp.any(jnp.isfinite(b) & ~jnp.isfinite(a)))

    jax.tree_util.tree_map(check, grads, before, after, is_leaf=lambda x: x is None)
    return jnp.stack(flags) if flags else jnp.zeros((0,), bool)


def trainable_leaf_names(predictors: Any, trainable: Any) -> list[str]:
    """The paths of the leaves `_made_nonfinite` checks, in the same order."""
    kept = eqx.filter(eqx.filter(predictors, trainable), eqx.is_inexact_array)
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(kept)[0]]


def any_solved(failed: tuple[jax.Array, ...], row_weights: tuple[jax.Array, ...]) -> jax.Array:
    """Whether at least one real (non-padding) row of any bucket solved."""
    ok = [(~f & (w > 0)).any() for f, w in zip(failed, row_weights, strict=True)]
    return jnp.any(jnp.stack(ok))


def step_tail(
    apply_update,
    carry,
    losses,
    grads,
    failed,
    row_weights,
    steps,
    weights,
    penalty,
    pen_grads,
    best,
    objective=None,
):
    """The end of a step, traced: combine, update, skip a non-finite step, best-step rule.

    `objective`: the whole training objective for an optimiser whose update calls `value_fn`
    (a line search), else `None`.
    """
    loss, combined = combine_bucket_grads(losses, grads, weights)
    # Under throw=False a step whose every experiment failed has loss and gradient 0: it
    # measured nothing, so it is a non-finite step (skipped, never the best), not a perfect one.
    loss = jnp.where(any_solved(failed, row_weights), loss, jnp.nan)
    if pen_grads is not None:
        combined = jax.tree_util.tree_map(jnp.add, combined, pen_grads)
    else:
        penalty = jnp.zeros((), loss.dtype)
    finite = jnp.isfinite(loss) & jnp.isfinite(penalty) & _all_finite(combined)
    if objective is None:
        updated, new_state = apply_update(carry.predictors, combined, carry.opt_state)
    else:  # a line search: it is given the objective this step descends, and its value
        value = loss + objective.penalty_weight.astype(loss.dtype) * penalty
        updated, new_state = apply_update(
            carry.predictors, combined, carry.opt_state, value=value, value_fn=objective
        )
    # An update from a finite step that overflows a parameter is an optimiser problem: it is
    # not applied (no solve ever sees it) and the host names it from the report.
    broke = finite & _made_nonfinite(carry.predictors, updated, combined)
    if best:
        # The best snapshot is the pre-update parameters: `loss` was measured there.
        carry = improve(carry, carry.predictors, loss, finite)
    # A non-finite step is not applied: parameters and optimiser state stay as they were.
    applied = finite & ~broke.any()
    carry = dataclasses.replace(
        carry,
        predictors=_select(applied, updated, carry.predictors),
        opt_state=_select(applied, new_state, carry.opt_state),
        step=carry.step + 1,
    )
    # Everything the host may need about this step, in one array: one transfer per read.
    # [loss, penalty, finite, since_best, then one flag per trainable leaf the update broke].
    dtype = jnp.result_type(loss, penalty)
    stats = jnp.stack([loss, penalty, finite, carry.since_best], dtype=dtype)
    stats = jnp.concatenate([stats, broke.astype(dtype)])
    report = ((stats, jnp.concatenate(failed)), _solver_effort(steps, row_weights))
    return carry, report


def make_tail(apply_update: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    """The jitted end of a step for one optimiser's `apply_update` (see `step_tail`)."""

    @eqx.filter_jit
    def tail(
        carry,
        losses,
        grads,
        failed,
        row_weights,
        steps,
        weights,
        penalty,
        pen_grads,
        best,
        objective,
    ):
        return step_tail(
            apply_update,
            carry,
            losses,
            grads,
            failed,
            row_weights,
            steps,
            weights,
            penalty,
            pen_grads,
            best,
            objective,
        )

    return tail


def _whole_step(run, apply_update, best, carry, bp, fraction, tp_weight, weights):
    """One bucket's `bucket_step` body and the tail, traced into one program."""
    static, dynamic = fj.flatten(carry.predictors)
    arrays, rest = run(static, dynamic, bp, fraction, tp_weight)
    loss, grads, failed, steps = arrays if rest.value is None else eqx.combine(arrays, rest.value)
    return step_tail(
        apply_update,
        carry,
        (loss,),
        (grads,),
        (failed,),
        (bp.row_weights,),
        (steps,),
        weights,
        None,
        None,
        best,
    )


_WHOLE_STEPS: dict[tuple, Callable[..., Any]] = {}


def _take_whole_step(engine, opt, carry, bp, inputs, best_on_loss):
    """`take_step` for one bucket without a penalty: `bucket_step` and the tail in one call,
    with the bucket kernel's own checks before it and its error naming after a failed solve."""
    kernel = engine.bucket_step
    args = kernel._arguments(carry.predictors, bp, inputs.fraction, None)
    key = (kernel._run, opt.apply_update, best_on_loss)
    run = _WHOLE_STEPS.get(key)
    if run is None:
        if len(_WHOLE_STEPS) >= 64:
            _WHOLE_STEPS.clear()
        run = _WHOLE_STEPS[key] = fj.entry(_whole_step, *key)
    static, dynamic = fj.flatten(carry)
    throw = kernel._objective.solver.throw
    try:
        return fj.call(run, static, dynamic, bp, *args[2:], inputs.weights, wait=throw)
    except eqx.EquinoxRuntimeError as e:
        if throw and not isinstance(e, RowSolveError):
            kernel._name_failed_rows(e, args, bp)
        raise
    except Exception as e:
        _explain_backsolve(e, kernel._objective.solver)
        raise


class StepInputs(NamedTuple):
    """What a step takes besides the carry: fixed for a whole phase.

    `fused`: the step is one compiled program (`bucket_step`'s body and the tail), for one
    bucket without a penalty; otherwise one `bucket_step` dispatch per bucket, then the tail.
    """

    fraction: jax.Array
    weights: jax.Array
    penalty_weight: float
    points: tuple[Any, ...]
    fused: bool = False


def take_step(
    engine: Any,
    opt: Any,
    carry: Carry,
    payloads: tuple[Any, ...],
    inputs: StepInputs,
    *,
    best_on_loss: bool,
) -> tuple[Carry, Any]:
    """Dispatch one training step; everything returned stays on the device.

    Returns the new carry and a report for the host to read when it needs to:
    `(([loss, penalty, finite, steps since the best], failed), effort)`, where `failed` holds
    every bucket's per-row failure flags, concatenated in bucket order, and `effort` is the
    solver effort `[B, 4]` (see `_solver_effort`).
    """
    # A line search evaluates the objective through the bucket kernels, so its steps take the
    # per-bucket path even where an ordinary optimiser's step is one fused program.
    if inputs.fused and not opt.uses_objective:
        return _take_whole_step(engine, opt, carry, payloads[0], inputs, best_on_loss)
    objective = engine.objective(payloads, inputs) if opt.uses_objective else None
    stored = engine.stored_step(opt, carry, objective)
    if stored is not None:  # a line search already evaluated these parameters
        out = opt.tail(carry, *stored, best_on_loss, objective)
        return engine.remember(opt, out, objective)
    predictors = carry.predictors
    losses, grads, failed, steps = [], [], [], []
    for bp in payloads:
        loss, g, f = engine.bucket_step(predictors, bp, inputs.fraction)
        losses.append(loss)
        grads.append(g)
        failed.append(f)
        steps.append(engine.bucket_step.last_solver_steps)
    if inputs.penalty_weight > 0:
        penalty, pen_grads = engine.penalty_step(predictors, inputs.penalty_weight, inputs.points)
    else:  # a zero weight is exactly "off": no penalty kernel runs at all
        penalty, pen_grads = None, None
    out = opt.tail(
        carry,
        tuple(losses),
        tuple(grads),
        tuple(failed),
        tuple(bp.row_weights for bp in payloads),
        tuple(steps),
        inputs.weights,
        penalty,
        pen_grads,
        best_on_loss,
        objective,
    )
    return engine.remember(opt, out, objective)


def _solver_effort(steps: tuple[jax.Array, ...], row_weights: tuple[jax.Array, ...]) -> jax.Array:
    """`[B, 4]`: per bucket, mean and max accepted steps, then mean and max rejected steps,
    over its real rows whose counts are known (NaN when none is)."""
    out = []
    for s, w in zip(steps, row_weights, strict=True):
        known = (s[:, 0] >= 0) & (w > 0)
        n = known.sum()
        x = jnp.where(known[:, None], s, 0).astype(jnp.float32)
        mean = jnp.where(n > 0, x.sum(axis=0) / jnp.maximum(n, 1), jnp.nan)
        peak = jnp.where(n > 0, x.max(axis=0), jnp.nan)
        out.append(jnp.stack([mean[0], peak[0], mean[1], peak[1]]))
    return jnp.stack(out)
