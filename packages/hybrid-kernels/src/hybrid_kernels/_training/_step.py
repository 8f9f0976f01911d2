"""One training step, dispatched: `take_step`, and what stays fixed for a phase (`StepInputs`).

A step is `bucket_step` on every bucket (one dispatch each, no host sync), then `penalty_step`
once, then one jitted tail (`_tail.make_tail`). With one bucket and no penalty, `bucket_step`'s
body and the tail are traced into one program instead (`_fused`): one dispatch and one
compile, as a hand-written loop has. Nothing is read back to the host here: the step returns a
small device report that the loop reads when it has to.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from hybrid_kernels._training._fused import FlatCarry, as_carry, take_whole_step
from hybrid_kernels._training._tail import (  # noqa: F401  (the step's state, re-exported)
    Carry,
    any_solved,
    forget_best,
    improve,
    improve_jit,
    make_tail,
    new_carry,
    set_learning_rate,
    step_tail,
    trainable_leaf_names,
)


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
    # `penalty_weight` on the device, made once per phase: the tail gives the optimiser the
    # objective's value (loss + weight x penalty) without a transfer per step.
    penalty_scale: jax.Array | None = None


def take_step(
    engine: Any,
    opt: Any,
    carry: Carry | FlatCarry,
    payloads: tuple[Any, ...],
    inputs: StepInputs,
    *,
    best_on_loss: bool,
    defer_errors: bool = False,
    quiet: bool = False,
) -> tuple[Carry | FlatCarry, Any]:
    """Dispatch one training step; everything returned stays on the device.

    `quiet`: where `quiet_step` says so, the step is traced without the solver's host
    callbacks, and a suspect report (`suspect`) must be replayed with `quiet=False`.

    `defer_errors`: a fused step does not wait for its result even under `throw=True`; a
    failed solve then surfaces when the report is read, and the reader turns it into the
    error this call would have raised with `raise_deferred`.

    `carry` may be a `FlatCarry` (a fused step returns one: its leaves, never rebuilt into a
    tree on the host between steps).

    Returns the new carry and a report for the host to read when it needs to:
    `(([loss, penalty, finite, steps since the best], failed), effort)`, where `failed` holds
    every bucket's per-row failure flags, concatenated in bucket order, and `effort` is the
    solver effort `[B, 4]` (see `_tail._solver_effort`).
    """
    # A line search evaluates the objective through the bucket kernels, so its steps take the
    # per-bucket path even where an ordinary optimiser's step is one fused program.
    if inputs.fused and not opt.uses_objective:
        return take_whole_step(
            engine, opt, carry, payloads[0], inputs, best_on_loss, defer_errors, quiet
        )
    carry = as_carry(carry)
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
        None if penalty is None else inputs.penalty_scale,
    )
    return engine.remember(opt, out, objective)


def quiet_step(engine: Any, opt: Any, inputs: StepInputs) -> bool:
    """Whether a step can be traced without the solver's host callbacks (`_quiet`): a fused
    step (one program) of a `throw=True` solve. Its report must then be checked (`suspect`)."""
    return inputs.fused and not opt.uses_objective and engine.throws


def suspect(report: Any) -> bool:
    """Whether a quiet step's report (read back) may hide a failed solver check: a row was
    flagged (its states or predictions were not finite) or the step was not finite."""
    (stats, flags), _ = report
    return bool(flags.any()) or not bool(stats[2])
