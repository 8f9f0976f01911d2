"""The compiled end of a training step: the device state a step consumes, the best-step rule,
and the *tail* that combines the bucket gradients with `combine_bucket_grads`, adds the
penalty gradient, calls `apply_update`, skips the update when anything is non-finite, and
applies the best-step rule. Traced inside the jitted tail (`make_tail`) or inside the fused
one-bucket step (`_fused`); nothing here reads back to the host.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from hybrid_kernels._dtypes import default_float
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
        best_predictors=_snapshot(improved, candidate, carry.best_predictors),
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
    """`on_true` where the scalar `pred` holds, else `on_false` (trees of one structure), leaf by
    leaf."""

    def pick(a: Any, b: Any) -> Any:
        return jnp.where(pred, a, b) if eqx.is_array(a) else a

    return jax.tree_util.tree_map(pick, on_true, on_false)


def _snapshot(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """`_select` for a tree that is only kept, never computed on (the best snapshot).

    On CPU it is one conditional for the whole tree: a `where` per leaf is a piece of the
    compiled program per leaf (compile time, on a small problem's first step). Only here: a
    conditional around the updated parameters would change how XLA fuses the update itself,
    and with it the rounding of the next steps. On GPU a conditional would read its predicate
    back to the host, so the selects stay there.
    """
    if jax.default_backend() != "cpu":
        return _select(pred, on_true, on_false)
    arrays, static = eqx.partition(on_true, eqx.is_array)
    others = eqx.filter(on_false, eqx.is_array)
    if not _same_types(arrays, others):
        return _select(pred, on_true, on_false)
    chosen = jax.lax.cond(pred, lambda a, _: a, lambda _, b: b, arrays, others)
    return eqx.combine(chosen, static)


def _same_types(a: Any, b: Any) -> bool:
    """Whether two trees of arrays have one structure and the same shapes and dtypes, weak
    types included (what both branches of a conditional must return)."""
    left, right = jax.tree_util.tree_flatten(a), jax.tree_util.tree_flatten(b)
    return left[1] == right[1] and all(
        jax.typeof(x) == jax.typeof(y) for x, y in zip(left[0], right[0], strict=True)
    )


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
    penalty_weight=None,
):
    """The end of a step, traced: combine, update, skip a non-finite step, best-step rule.

    `objective`: the whole training objective for an optimiser whose update calls `value_fn`
    (a line search), else `None`. `penalty_weight`: the penalty's weight (a traced scalar)
    when `penalty` is given, so that the update is given the objective's value.
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
    # The objective's value, for an optimiser that reads it (reduce_on_plateau, a line search).
    weight = penalty_weight if objective is None else objective.penalty_weight
    value = loss if weight is None else loss + weight.astype(loss.dtype) * penalty
    if objective is None:
        updated, new_state = apply_update(carry.predictors, combined, carry.opt_state, value=value)
    else:  # a line search: it is also given the objective this step descends
        if not objective.body.solver.throw:  # trials scored on the rows this step solved
            objective = objective._trials_on(failed)
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


def quiet_tail(apply_update, carry, loss, grads, failed, row_weights, steps, weights, best):
    """The end of a quiet one-bucket step (`_quiet`): combine, update, best-step rule, with no
    guard. Its report is read as suspect whenever anything the guards of `step_tail` act on
    happened (a row flagged, a loss, gradient or updated parameter not finite), and such a
    step is replayed through `step_tail`, so the guards are needed only there; a step that is
    not suspect is one they would have let through unchanged. The report is `step_tail`'s
    without the overflow flags; its `finite` entry is that whole check.
    """
    loss, combined = combine_bucket_grads((loss,), (grads,), weights)
    updated, new_state = apply_update(carry.predictors, combined, carry.opt_state, value=loss)
    ok = _nothing_broke(loss, combined, carry.predictors, updated)
    if best:
        carry = improve(carry, carry.predictors, loss, ok)
    carry = dataclasses.replace(carry, predictors=updated, opt_state=new_state, step=carry.step + 1)
    stats = jnp.stack([loss, jnp.zeros_like(loss), ok, carry.since_best], dtype=loss.dtype)
    return carry, ((stats, failed), _solver_effort((steps,), (row_weights,)))


def _nothing_broke(loss: jax.Array, grads: Any, before: Any, after: Any) -> jax.Array:
    """Whether `loss` and `grads` are finite and the update (`before` to `after`) made no
    finite entry non-finite. One reduction over every entry, so that the check stays one
    small piece of the program: `x * 0` is 0, or NaN exactly where `x` is not finite."""
    leaves = jax.tree_util.tree_leaves
    parts = [loss, *(g for g in leaves(grads) if eqx.is_inexact_array(g))]
    pairs = [
        (b, a)
        for b, a in zip(leaves(before), leaves(after), strict=True)
        if eqx.is_inexact_array(a)
    ]
    if pairs:
        # One `where` over all the parameters at once rather than one per leaf: each would be
        # a separate piece of the compiled program.
        b = jnp.concatenate([jnp.ravel(x) for x, _ in pairs])
        a = jnp.concatenate([jnp.ravel(y) for _, y in pairs])
        parts.append(jnp.where(jnp.isfinite(b), a, 0))
    return jnp.isfinite(jnp.sum(jnp.concatenate([jnp.ravel(x) for x in parts]) * 0))


def make_tail(apply_update: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    """The jitted end of a step for one optimiser's `apply_update`: `step_tail` with
    `apply_update` bound, taking the rest of its arguments."""
    return eqx.filter_jit(functools.partial(step_tail, apply_update))


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
