"""What the host reads back from dispatched steps, and what it decides from them.

Steps are dispatched without waiting; each leaves a `Pending` record (its report, and the
carries before and after it) until the loop reads it. A read may lag one step behind: the
loop reads step `n` after dispatching step `n + 1`, so the host's own work (the read, the
display, the next dispatch) overlaps the device's work on the step in flight, where a loop
that waits on every step pays both one after the other. A decision taken from a lagged read
(a patience stop, a non-finite streak, an overflowing update, a failed solve) first rolls the
run back to the step it was taken at, so the lag never changes what a run does, only when
the host learns of it.

A quiet step (`_quiet`: a `throw=True` solve traced without host callbacks, so that it
dispatches asynchronously on CPU too) whose report is suspect is replayed here with the
callbacks before anything is decided from it: the run then raises, or records, exactly what a
`throw=True` step records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import numpy as np

from hybrid_kernels._data import failed_exp_ids
from hybrid_kernels._distributed import to_host
from hybrid_kernels._training._fused import FlatCarry, as_carry, raise_deferred
from hybrid_kernels._training._step import (
    Carry,
    StepInputs,
    suspect,
    take_step,
    trainable_leaf_names,
)
from hybrid_kernels._training.history import NonFiniteTrainingError

if TYPE_CHECKING:
    from hybrid_kernels._training._loop import LoopState
    from hybrid_kernels._training._setup import Setup


class Pending(NamedTuple):
    """A dispatched step not yet read back: `report` (see `take_step`), the carries `before`
    and `after` it (device references, not copies), the phase `inputs` it ran with, and
    whether it was traced without host callbacks (`quiet`, see `_quiet`)."""

    step: int
    phase: int
    report: Any
    before: Carry | FlatCarry
    after: Carry | FlatCarry
    inputs: StepInputs
    quiet: bool = False


def read_back(tree: Any) -> Any:
    """The trainer's only device-to-host reads go through here (tests count them).

    Per-row flags (which experiments failed or went non-finite) follow the rows' sharding, so
    with several processes they span devices this process cannot read: those leaves are
    gathered (`to_host`, a collective every process joins, as every process syncs at the same
    steps)."""
    leaves = jax.tree.leaves(tree)
    if all(getattr(x, "is_fully_addressable", True) for x in leaves):
        return jax.device_get(tree)
    return jax.tree.map(to_host, tree)


def may_lag(setup: Setup) -> bool:
    """Whether reads may trail the newest step by one. A hook acts on the newest parameters
    after every step, so a run with one reads every step it has dispatched."""
    return setup.hook is None


def sync(setup: Setup, st: LoopState, *, keep: int = 0) -> bool:
    """Read every pending step but the newest `keep` in one transfer; report them; say if
    patience ran out. A stop or an error found in a read rolls the steps after it back."""
    if len(st.pending) <= keep:
        return False
    read = st.pending[: len(st.pending) - keep]
    try:
        reports = read_back([p.report for p in read])
    except (jax.errors.JaxRuntimeError, ValueError) as error:
        raise_failed(setup, st, read, error)
    st.pending = st.pending[len(read) :]
    for i, (p, report) in enumerate(zip(read, reports, strict=True)):
        if p.quiet and suspect(report):
            p = _replay(setup, st, p)
            read, reports = [*read[:i], p], [*reports[:i], read_back(p.report)]
            break
    ui, h = setup.ui, st.history
    on_effort = getattr(ui, "on_solver_steps", None)  # optional for duck-typed UIs
    on_read = getattr(ui, "on_steps_read", None)
    if on_read is not None:
        on_read(first_step=read[0].step, last_step=read[-1].step)
    for p, ((stats, flags), effort) in zip(read, reports, strict=True):
        loss, pen, ok = float(stats[0]), float(stats[1]), stats[2]
        h.append(loss)
        h.penalties.append(pen)
        effort = tuple(tuple(float(v) for v in row) for row in effort)
        h.solver_steps.append(effort)
        if on_effort is not None:
            on_effort(step=p.step, per_bucket=effort)
        ui.on_step_end(step=p.step, phase_idx=p.phase, loss=loss, penalty=pen)
        if flags.any():
            _report_failures(setup, st, p.step, p.phase, flags)
        if stats[4:].any():
            _roll_back(st, p)
            _update_overflowed(setup, st, p.phase, p.step, stats[4:])
        if bool(ok):
            st.bad_in_row = 0
            continue
        st.bad_in_row += 1
        h.bad_steps.append(p.step)
        ui.on_bad_step(step=p.step, phase_idx=p.phase, loss=loss)
        if st.bad_in_row >= setup.config.max_bad_steps:
            _roll_back(st, p)
            _diverged(setup, st, p.phase, p.step)
    # The counter in the last report is the carry's then: steps (or validations) since the best.
    stop = _out_of_patience(setup, reports[-1][0][0][3])
    if stop:
        _roll_back(st, read[-1])
    return stop


MAX_REPLAYS = 3
"""Replays of suspect quiet steps that raise nothing (steps that were simply not finite)
after which a run traces its steps with the callbacks again: a replay costs a second run of
the step, and its first one a compile."""


def _replay(setup: Setup, st: LoopState, p: Pending) -> Pending:
    """Run the suspect quiet step `p` again from its carry before, with the solver's checks
    as host callbacks, waiting for it; the steps dispatched after it are dropped. Raises what
    a `throw=True` step raises; otherwise returns `p` with the replay's report and carry."""
    st.pending, st.raw = [], p.before
    st.done, st.phase_step = p.step, st.phase_step - (st.done - p.step)
    after, report = take_step(
        setup.engine, st.opt, p.before, setup.payloads, p.inputs, best_on_loss=setup.best_on_loss
    )
    st.raw, st.done, st.phase_step = after, st.done + 1, st.phase_step + 1
    st.replays += 1
    st.quiet = st.replays < MAX_REPLAYS
    return p._replace(report=report, after=after, quiet=False)


def _roll_back(st: LoopState, last: Pending) -> None:
    """Make `last` the newest step: the steps dispatched after it are dropped, unapplied."""
    dropped = len(st.pending)
    if dropped:
        st.pending = []
        st.carry = last.after
        st.done -= dropped
        st.phase_step -= dropped


def raise_failed(setup: Setup, st: LoopState, steps: list[Pending], error: Exception):
    """A read or a dispatch failed: a step's solve may have failed its checks (`throw=True`)
    after it was dispatched (its result, and every later step's input, then hold the error).
    Find the first such step among `steps` (a `report` of `None` is the step whose dispatch
    raised), put the run back before it, and raise what a waiting call would have raised:
    `RowSolveError` naming its rows where they can be found; `error` itself when it is not a
    solver failure."""
    for p in steps:
        if p.report is not None:
            try:
                read_back(p.report)
                continue
            except (jax.errors.JaxRuntimeError, ValueError) as failed:
                error = failed
        st.pending, st.carry = [], p.before
        st.done, st.phase_step = p.step, st.phase_step - (st.done - p.step)
        raise_deferred(setup.engine, as_carry(p.before), setup.payloads, p.inputs, error)
    raise error


def _out_of_patience(setup: Setup, since_best: Any) -> bool:
    patience = setup.config.patience
    return patience > 0 and int(since_best) >= patience


def _report_failures(setup: Setup, st: LoopState, step: int, phase: int, flags: Any) -> None:
    """Name the experiments whose solve failed at `step`, in the history and the UI."""
    ids = failed_exp_ids(setup.dataset, np.split(flags, setup.row_splits))
    if ids:
        st.history.failed[step] = ids
        setup.ui.on_failed_experiments(step=step, phase_idx=phase, exp_ids=ids)


def _diverged(setup: Setup, st: LoopState, phase: int, step: int) -> None:
    end_run(setup, st, float("nan"))
    streak = st.history.bad_steps[-st.bad_in_row :]
    ids = tuple(dict.fromkeys(i for s in streak for i in st.history.failed.get(s, ())))
    if ids:
        named = (
            f" Experiments whose predictions were non-finite or whose solve failed in those "
            f"steps: {list(ids)} (by step in .history.failed)."
        )
    else:
        named = (
            " No experiment's predictions were non-finite in those steps: the non-finite "
            "value came from the gradient, a penalty or the loss function."
        )
    raise _stopped(
        st,
        phase,
        step,
        f"{st.bad_in_row} steps in a row had a non-finite loss or gradient, or no experiment "
        f"that solved (max_bad_steps={setup.config.max_bad_steps}).{named} They were not "
        "applied",
        exp_ids=ids,
    )


def _update_overflowed(setup: Setup, st: LoopState, phase: int, step: int, broke: Any) -> None:
    """The update of a finite step made trainable parameters non-finite: stop, naming it."""
    end_run(setup, st, float("nan"))
    names = trainable_leaf_names(st.carry.predictors, setup.engine.trainable)
    flags = np.asarray(broke) > 0
    leaves = (
        tuple(n for n, f in zip(names, flags, strict=False) if f)
        if len(names) == len(flags)
        else ()
    )
    c = setup.config
    opt = c.optimizer[phase]
    opt = opt if isinstance(opt, str) else getattr(opt, "__name__", type(opt).__name__)
    raise _stopped(
        st,
        phase,
        step,
        f"the optimiser update (optimizer {opt!r}, learning rate {c.lr[phase]:g}) made "
        f"trainable parameter(s) {list(leaves) if leaves else '(unnamed)'} non-finite, from a "
        "finite loss and gradient. This is an update problem, not a solver one: lower the "
        "learning rate or clip the update. It was not applied",
        leaves=leaves,
    )


def _stopped(st: LoopState, phase: int, step: int, why: str, **names: Any):
    """The error that stops a run at `step`, with the run's last good state on it."""
    return NonFiniteTrainingError(
        f"training stopped in phase {phase} at step {step}: {why}; the last good and the best "
        "parameters are on this error (.predictors, .best_predictors)",
        phase=phase,
        step=step,
        predictors=st.carry.predictors,
        opt_state=st.carry.opt_state,
        best_predictors=st.carry.best_predictors,
        history=st.history,
        **names,
    )


def end_run(setup: Setup, st: LoopState, final_loss: float) -> None:
    """Close the display, once."""
    st.ended = True
    setup.ui.on_run_end(final_loss=final_loss)
