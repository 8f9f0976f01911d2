"""One bucket, no penalty: the whole training step as one compiled program.

`bucket_step`'s body and the tail (`_tail.step_tail`) are traced together, so a step is one
dispatch and one compile, as a hand-written loop's is. Two more things make it cost what a
hand-written loop costs:

- A small bucket is closed over as constants of the program (`fj.closed_entry`), as a
  hand-written loop closes over its data; XLA then folds what depends on the data alone
  (diffrax's checks on `t0`, `t1` and the save times, and their host callbacks).
- The carry stays flat between steps (`FlatCarry`: its array leaves and its structure, which
  a step never changes), so the host neither rebuilds nor walks the parameter, optimiser and
  best-step trees every step; the loop rebuilds the tree only when it needs it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax

from hybrid_kernels import _flat_jit as fj
from hybrid_kernels._dispatch import _explain_backsolve
from hybrid_kernels._errors import RowSolveError, equinox_message
from hybrid_kernels._training._tail import Carry, quiet_tail, step_tail


class FlatCarry(NamedTuple):
    """A `Carry` as `fj.flatten` gives it: `static` (structure and non-array leaves) and
    `dynamic` (the array leaves, in order)."""

    static: tuple
    dynamic: list


def as_carry(carry: Carry | FlatCarry) -> Carry:
    """The `Carry` tree of `carry`."""
    return fj.unflatten(*carry) if isinstance(carry, FlatCarry) else carry


# The structure of a step's output carry, by the structure of its input (noted at trace time;
# the same unless a leaf's kind changes, e.g. a weak-typed scalar becoming strong).
_OUT_STATIC: dict[tuple, tuple] = {}


def _whole_step(run, apply_update, best, quiet, carry, bp, fraction, tp_weight, weights):
    """One bucket's `bucket_step` body and the tail, traced into one program; returns the new
    carry's array leaves and the step's report. A `quiet` step (`_quiet`) ends in the
    unguarded `quiet_tail`: its suspect steps are replayed through `step_tail`."""
    static, dynamic = fj.flatten(carry.predictors)
    arrays, rest = run(static, dynamic, bp, fraction, tp_weight)
    loss, grads, failed, steps = arrays if rest.value is None else eqx.combine(arrays, rest.value)
    if quiet:
        tail = quiet_tail(
            apply_update, carry, loss, grads, failed, bp.row_weights, steps, weights, best
        )
        return fj.flatten(tail[0]), tail[1]
    carry, report = step_tail(
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
    return fj.flatten(carry), report


def _traced(run, apply_update, best, quiet, carry, bp, fraction, tp_weight, weights):
    in_static = fj.flatten(carry)[0]
    (out_static, dynamic), report = _whole_step(
        run, apply_update, best, quiet, carry, bp, fraction, tp_weight, weights
    )
    _OUT_STATIC[in_static] = out_static
    return dynamic, report


# A bucket up to this size is compiled into the step as constants; a larger one stays an
# argument, since XLA's constant folding and the program's size grow with it.
_CLOSED_BUCKET_BYTES = 1 << 16


def _closable(bp) -> bool:
    leaves = [x for x in jax.tree_util.tree_leaves(bp) if eqx.is_array(x)]
    one_device = all(
        getattr(x, "is_fully_addressable", True) and len(getattr(x, "devices", lambda: ())()) <= 1
        for x in leaves
    )
    return one_device and sum(x.size * x.dtype.itemsize for x in leaves) <= _CLOSED_BUCKET_BYTES


class _Entry(NamedTuple):
    """What one (kernel, bucket, optimiser, phase) pair reuses from step to step."""

    kernel: Any
    bp: Any
    fraction: Any
    apply_update: Any
    best: bool
    quiet: bool
    run: Any
    data: tuple
    tail: tuple


_ENTRIES: dict[tuple[int, bool], _Entry] = {}


def _entry(kernel, opt, carry: Carry | FlatCarry, bp, inputs, best: bool, quiet: bool) -> _Entry:
    """The program and the arguments a fused step passes besides the carry; the bucket
    kernel's first-use checks run once per bucket, phase and optimiser."""
    e = _ENTRIES.get((id(kernel), quiet))
    if (
        e is not None
        and e.kernel is kernel
        and e.bp is bp
        and e.fraction is inputs.fraction
        and e.apply_update is opt.apply_update
        and e.best == best
    ):
        return e
    args = kernel._arguments(as_carry(carry).predictors, bp, inputs.fraction, None)
    bound = (kernel.quiet_run() if quiet else kernel._run, opt.apply_update, best, quiet)
    if _closable(bp):
        run, data = fj.closed_entry(_traced, bp, *bound), ()
    else:
        run, data = fj.entry(_traced, *bound), (bp,)
    e = _Entry(
        kernel, bp, inputs.fraction, opt.apply_update, best, quiet, run, data, tuple(args[2:])
    )
    if len(_ENTRIES) >= 64:
        _ENTRIES.clear()
    _ENTRIES[(id(kernel), quiet)] = e
    return e


def take_whole_step(engine, opt, carry, bp, inputs, best_on_loss, defer_errors, quiet=False):
    """`take_step` for one bucket without a penalty: `bucket_step` and the tail in one call,
    with the bucket kernel's own checks before it and its error naming after a failed solve
    (at once, or through `raise_deferred` when the caller reads the report later). Returns a
    `FlatCarry` and the report.

    `quiet`: a `throw=True` solve is traced without host callbacks (`_quiet`), so the step
    dispatches asynchronously even on CPU; a report with any row flagged or not finite is
    then *suspect*, and its step must be replayed with `quiet=False` (`_reads.sync` does)."""
    kernel = engine.bucket_step
    e = _entry(kernel, opt, carry, bp, inputs, best_on_loss, quiet)
    static, dynamic = carry if isinstance(carry, FlatCarry) else fj.flatten(carry)
    throw = kernel._objective.solver.throw
    try:
        out, report = fj.call(
            e.run,
            static,
            dynamic,
            *e.data,
            *e.tail,
            inputs.weights,
            wait=throw and not defer_errors,
        )
    except eqx.EquinoxRuntimeError as error:
        if throw and not isinstance(error, RowSolveError):
            args = kernel._arguments(as_carry(carry).predictors, bp, inputs.fraction, None)
            kernel._name_failed_rows(error, args, bp)
        raise
    except Exception as error:
        _explain_backsolve(error, kernel._objective.solver)
        raise
    return FlatCarry(_OUT_STATIC[static], out), report


def raise_deferred(engine: Any, carry: Carry | FlatCarry, payloads: tuple, inputs: Any, error):
    """Raise what `take_step(carry, ...)` would have raised had it waited for its result:
    `error` is the failure of a step dispatched with `defer_errors=True`, met when its report
    was read. A failed solver check becomes `RowSolveError` naming the bucket's failed rows (or
    `eqx.EquinoxRuntimeError` with the solver's reason); anything else is raised as it is."""
    message = equinox_message(error)
    if message is None or not inputs.fused:
        raise error
    failure = eqx.EquinoxRuntimeError(message)
    kernel, bp = engine.bucket_step, payloads[0]
    args = kernel._arguments(as_carry(carry).predictors, bp, inputs.fraction, None)
    kernel._name_failed_rows(failure, args, bp)
    raise failure from None
