"""The training loop: phases of steps around the compiled step, and what it knows on the host.

`LoopState` is the one state of a run: the device `Carry` the next step consumes and the
host-side record (history, counters, unread step reports). `train` starts it (fresh, from the
tournament's winner, or from a checkpoint), compiles the kernels, then drives the phases:
each step is dispatched without waiting for it, and values are read back only when something
must be decided on the host: every `log_every` steps, at a phase end, a validation or a
checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hybrid_kernels import _flat_jit as fj
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._errors import RowSolveError
from hybrid_kernels._training import _reads
from hybrid_kernels._training._fused import FlatCarry, as_carry
from hybrid_kernels._training._reads import Pending, end_run, may_lag, sync
from hybrid_kernels._training._setup import (
    Setup,
    compile_kernels,
    load_saved,
    phase_inputs,
    replicate,
)
from hybrid_kernels._training._step import (
    Carry,
    forget_best,
    improve_jit,
    new_carry,
    quiet_step,
    set_learning_rate,
    take_step,
)
from hybrid_kernels._training.history import LossHistory
from hybrid_kernels._training.hooks import apply_hook
from hybrid_kernels._training.reinit import fold_key
from hybrid_kernels._training.state import TrainingState, save_training_state
from hybrid_kernels._training.tournament import run_tournament


class RunResult(NamedTuple):
    """What a run hands back: its history, the predictors to return and their loss."""

    history: LossHistory
    predictors: Any
    final_loss: float


@dataclasses.dataclass
class LoopState:
    """What a step consumes (`carry`, `opt`, the schedule position) and what the loop records.

    `raw` is the carry as the last step left it (see `carry`). `done` counts steps over all
    phases, `phase_step` steps within phase `phase`; `pending` holds the dispatched steps not
    yet read back (`_reads.Pending`), oldest first. `quiet`: one-program steps of a
    `throw=True` solve are traced without host callbacks (`_quiet`) until replays of suspect
    steps that raised nothing show that this run's steps are often not finite
    (`_reads.MAX_REPLAYS`).
    """

    history: LossHistory = dataclasses.field(default_factory=LossHistory)
    raw: Carry | FlatCarry | None = None
    opt: Any = None
    done: int = 0
    phase: int = 0
    phase_step: int = 0
    bad_in_row: int = 0
    pending: list[Pending] = dataclasses.field(default_factory=list)
    ended: bool = False
    quiet: bool = True
    replays: int = 0

    @property
    def carry(self) -> Carry:
        """The carry as a tree (a fused step leaves it flat: rebuilt here, once, when read)."""
        if isinstance(self.raw, FlatCarry):
            self.raw = as_carry(self.raw)
        return self.raw

    @carry.setter
    def carry(self, value: Carry | FlatCarry) -> None:
        self.raw = value


def train(setup: Setup, predictors: Any, *, tournament: bool) -> RunResult:
    """Run every phase of `setup.config` from `predictors` (or from the saved state)."""
    c, ui = setup.config, setup.ui
    st = LoopState()
    ui.on_run_start(total_steps=c.total_steps, num_phases=c.n_phases)
    try:
        saved = load_saved(setup, predictors)
        if saved is None:
            _start(setup, st, predictors)
            compile_kernels(setup, st.carry, st.opt, st.phase)
            if tournament and c.tournament_enabled():
                ranked = run_tournament(
                    setup,
                    predictors,
                    n_attempts=c.tournament_attempts,
                    key=fold_key(setup.key, "tournament"),
                )
                _start(setup, st, replicate(ranked[0][1], setup.mesh))
        else:
            _resume(setup, st, saved)
            ui.on_message(text=f"resumed from {str(setup.path)!r} after step {st.done}")
            if st.phase < c.n_phases:
                compile_kernels(setup, st.carry, st.opt, st.phase)
        # A fused step's failed solver check is met when its report is read, not at its call
        with fj.quiet_callbacks():
            _run_phases(setup, st)
            final, final_loss = _finish(setup, st)
        end_run(setup, st, final_loss)
        return RunResult(st.history, final, final_loss)
    except BaseException as error:
        if not st.ended:  # close a live display on any error (Ctrl-C included)
            # Said before the display closes: without it, its last line would read as a run
            # that ended normally (with no final loss), above the traceback.
            steps = f"{st.done} step" + ("" if st.done == 1 else "s")
            ui.on_message(text=f"training stopped by {type(error).__name__} after {steps}")
            end_run(setup, st, float("nan"))
        if isinstance(error, RowSolveError):  # a throw=True solve: say which experiment failed
            named = name_failed_experiments(error, (setup.dataset, setup.val_dataset), setup.where)
            if named is not error:
                raise named from error
        raise


def name_failed_experiments(error: RowSolveError, datasets: Any, where: str) -> RowSolveError:
    """`error` with its failed bucket rows named by `exp_id`, when one of `datasets` holds them."""
    for dataset in datasets:
        if dataset is None:
            continue
        for b, bp in enumerate(dataset.bucket_payloads):
            if bp is error.bucket:
                ids = tuple(dataset.exp_ids[b][r] for r in error.rows)
                return RowSolveError(
                    f"{where}: the solve failed for experiment(s) {list(ids)}: {error}",
                    bucket=error.bucket,
                    rows=error.rows,
                    exp_ids=ids,
                )
    return error


# -- starting ----------------------------------------------------------------------------


def _start(setup: Setup, st: LoopState, predictors: Any) -> None:
    """A fresh run from `predictors`, at phase 0."""
    st.carry, st.opt = new_carry(predictors, None), None
    st.done = st.phase = st.phase_step = 0
    _begin_phase(setup, st, 0)


def _resume(setup: Setup, st: LoopState, saved: TrainingState) -> None:
    """Continue from a saved state."""
    h = st.history
    h.extend(saved.history)
    h.penalties.extend(saved.penalties)
    h.val.extend(saved.val_history)
    h.bad_steps.extend(saved.bad_steps)
    h.phase_starts.extend(saved.phase_starts)
    h.failed.update(saved.failed)
    h.events.extend(saved.events)
    if setup.hook_events is not None:
        setup.hook_events.load_state_dict(saved.hook_state, setup.where)
    st.bad_in_row = saved.bad_in_row
    st.done, st.phase, st.phase_step = saved.step, saved.phase, saved.phase_step
    c = setup.config
    p = min(st.phase, c.n_phases - 1)
    st.opt = setup.engine.optimizer(c.optimizer[p], c.lr[p])
    st.carry = dataclasses.replace(
        new_carry(saved.predictors, saved.opt_state, saved.step),
        best_predictors=saved.best_predictors,
        best_loss=jnp.asarray(saved.best_loss, dtype=default_float()),
        best_step=jnp.asarray(saved.best_step, dtype=jnp.int32),
        since_best=jnp.asarray(saved.since_best, dtype=jnp.int32),
    )


def _begin_phase(setup: Setup, st: LoopState, p: int) -> None:
    """State changes at the start of phase `p` (reset or new rate, patience, horizon)."""
    c, carry = setup.config, st.carry
    opt_state = carry.opt_state
    if st.opt is None or c.reset_optimiser_state[p]:
        st.opt = setup.engine.optimizer(c.optimizer[p], c.lr[p])
        opt_state = setup.engine.fresh_opt_state(st.opt, carry.predictors, c.lr[p])
    elif st.opt.injectable:
        opt_state = set_learning_rate(opt_state, c.lr[p])
    carry = dataclasses.replace(
        carry, opt_state=opt_state, since_best=jnp.zeros_like(carry.since_best)
    )
    # Losses over different horizons are not comparable: the minimum starts again. (The
    # validation score is always taken at the full horizon.)
    if setup.best_on_loss and p > 0 and c.length_schedule[p] != c.length_schedule[p - 1]:
        carry = forget_best(carry)
    st.carry = carry


# -- the loop ----------------------------------------------------------------------------


def _run_phases(setup: Setup, st: LoopState) -> None:
    """Run the remaining steps of every phase."""
    c = setup.config
    if setup.val_payloads and st.done == 0:
        _validate(setup, st)
    while st.phase < c.n_phases:
        phase = st.phase
        inputs = phase_inputs(setup, phase)
        if st.phase_step == 0 and len(st.history.phase_starts) <= phase:
            st.history.phase_starts.append(st.done)
        setup.ui.on_phase_start(
            phase_idx=phase,
            phase_steps=c.steps[phase],
            lr=c.lr[phase],
            optimizer=c.optimizer[phase],
            start_step=st.done - st.phase_step,
        )
        while st.phase == phase:
            before = st.raw
            quiet = st.quiet and quiet_step(setup.engine, st.opt, inputs)
            try:
                st.raw, report = take_step(
                    setup.engine,
                    st.opt,
                    before,
                    setup.payloads,
                    inputs,
                    best_on_loss=setup.best_on_loss,
                    defer_errors=True,
                    quiet=quiet,
                )
            except (jax.errors.JaxRuntimeError, ValueError) as error:  # an earlier step's?
                failed = Pending(st.done, st.phase, None, before, before, inputs)
                _reads.raise_failed(setup, st, [*st.pending, failed], error)
            st.pending.append(Pending(st.done, st.phase, report, before, st.raw, inputs, quiet))
            st.done, st.phase_step = st.done + 1, st.phase_step + 1
            _between_steps(setup, st)


def _between_steps(setup: Setup, st: LoopState) -> None:
    """Host work after a step: reads, validation, phase change, hook, checkpoint."""
    c, done = setup.config, st.done
    last = st.phase_step == c.steps[st.phase]
    val_due = bool(setup.val_payloads) and done % c.val_every == 0
    save_due = c.checkpoint_every > 0 and done % c.checkpoint_every == 0
    stop = False
    # Decided on the newest parameters, or handed to a hook: read every step first. A quiet
    # step's update is applied before its checks are read, so an unread step's parameters may
    # be a failed solve's; a hook must act on the ones the run keeps.
    if last or val_due or save_due or setup.hook is not None:
        stop = sync(setup, st)
    elif len(st.pending) >= c.log_every + may_lag(setup):
        stop = sync(setup, st, keep=int(may_lag(setup)))
    if val_due:
        stop = _validate(setup, st) or stop
    if last or stop:
        setup.ui.on_phase_end(phase_idx=st.phase)
        st.phase, st.phase_step = st.phase + 1, 0
        if st.phase < c.n_phases:
            _begin_phase(setup, st, st.phase)
    if setup.hook is not None and st.phase < c.n_phases:
        predictors, opt_state, _ = apply_hook(
            setup.hook, done, st.carry.predictors, st.carry.opt_state
        )
        st.carry = dataclasses.replace(st.carry, predictors=predictors, opt_state=opt_state)
        if setup.hook_events is not None:
            st.history.events.extend(setup.hook_events.take(done))
    if save_due:
        save_training_state(setup.path, _training_state(setup, st))


def _finish(setup: Setup, st: LoopState) -> tuple[Any, float]:
    """Final read, validation and save; returns the predictors to hand back and their loss."""
    sync(setup, st)
    if setup.val_payloads and (not st.history.val or st.history.val[-1][0] != st.done):
        _validate(setup, st)
    final = _training_state(setup, st)
    if setup.path is not None:
        save_training_state(setup.path, final)
    st.history.best_step, st.history.best_loss = final.best_step, final.best_loss
    if setup.config.restore_best and final.best_step >= 0:
        return final.best_predictors, final.best_loss
    return st.carry.predictors, (st.history[-1] if st.history else float("nan"))


# -- validation and saved state ---------------------------------------------------------


def _validate(setup: Setup, st: LoopState) -> bool:
    """Score the validation data at the current parameters; say if patience ran out."""
    carry = st.carry
    score = setup.engine.score(carry.predictors, setup.val_payloads, setup.val_weights)
    if not setup.best_on_loss:
        carry = st.carry = improve_jit(carry, carry.predictors, score, True)
    score, since_best = _reads.read_back((score, carry.since_best))
    score = float(score)
    st.history.val.append((st.done, score))
    setup.ui.on_validation(step=st.done, loss=score)
    return setup.config.patience > 0 and int(since_best) >= setup.config.patience


def _training_state(setup: Setup, st: LoopState) -> TrainingState:
    """The run as a `TrainingState` (reads the best-step record back)."""
    carry = st.carry
    record = (carry.best_loss, carry.best_step, carry.since_best)
    best_loss, best_step, since = _reads.read_back(record)
    return TrainingState(
        predictors=carry.predictors,
        opt_state=carry.opt_state,
        step=st.done,
        phase=st.phase,
        phase_step=st.phase_step,
        key=setup.key,
        best_predictors=carry.best_predictors,
        best_loss=float(best_loss),
        best_step=int(best_step),
        history=list(st.history),
        penalties=list(st.history.penalties),
        val_history=list(st.history.val),
        bad_steps=list(st.history.bad_steps),
        since_best=int(since),
        bad_in_row=st.bad_in_row,
        tournament_done=True,
        fingerprint=setup.fingerprint,
        phase_starts=list(st.history.phase_starts),
        failed=dict(st.history.failed),
        events=list(st.history.events),
        hook_state=None if setup.hook_events is None else setup.hook_events.state_dict(),
    )
