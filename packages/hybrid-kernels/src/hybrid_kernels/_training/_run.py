"""One training run: the Python loop around the compiled step, and what it knows on the host.

`Run` holds the device trees the next step consumes (predictors, optimiser state, best-step
tracker) and the host-side record (history, counters). The loop dispatches steps without
waiting for them, and reads values back only when something must be decided on the host:
every `log_every` steps, at a phase end, a validation or a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from hybrid_kernels._data import failed_exp_ids
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._errors import RowSolveError
from hybrid_kernels._penalties import select_penalty_points
from hybrid_kernels._reductions import bucket_weights
from hybrid_kernels._training._engine import Engine, Track, strong
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.history import LossHistory, NonFiniteTrainingError
from hybrid_kernels._training.hooks import HookEvents, apply_hook
from hybrid_kernels._training.state import TrainingState, save_training_state
from hybrid_kernels._training.tournament import new_track, set_learning_rate
from hybrid_kernels._training.ui import TrainingUI


def _read_back(tree: Any) -> Any:
    """The trainer's only device-to-host reads go through here (tests count them)."""
    return jax.device_get(tree)


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


class Run:
    """One call of the trainer."""

    def __init__(
        self,
        engine: Engine,
        config: OptaxTrainingConfig,
        dataset: Any,
        val_dataset: Any,
        *,
        ui: TrainingUI,
        hook: Callable[..., Any] | None,
        key: Any,
        fingerprint: str,
        path: Any,
        sources: Any = None,
        extras: tuple[Any, ...] = (),
        hook_events: HookEvents | None = None,
    ) -> None:
        self.engine, self.config, self.dataset = engine, config, dataset
        self.payloads = tuple(dataset.bucket_payloads)
        # Where each bucket's rows end in a step report's concatenated failure flags.
        self.row_splits = np.cumsum([bp.ts.shape[0] for bp in self.payloads])[:-1]
        self.val_payloads = () if val_dataset is None else tuple(val_dataset.bucket_payloads)
        self.val_weights = None
        if val_dataset is not None:
            weights = bucket_weights(val_dataset, config.reduction)
            self.val_weights = jnp.asarray(weights, dtype=default_float())
        self.ui, self.hook, self.key, self.fingerprint, self.path = ui, hook, key, fingerprint, path
        self.sources, self.extras = sources, extras
        self.hook_events = hook_events
        self.history = LossHistory()
        self.pending: list[tuple[int, int, Any]] = []  # (step, phase, device report)
        self.bad_run = 0
        self.best_on_loss = config.monitor == "train"
        # The validation-monitored best lives on the host: its scores are read back anyway.
        self.val_best: Any = None
        self.val_best_score = float("inf")
        self.val_best_step = -1
        self.val_since = 0
        self.ended = False
        # The trees the next step consumes, and where it sits in the schedule.
        self.predictors: Any = None
        self.opt_state: Any = None
        self.opt: Any = None
        self.track: Track | None = None
        self.done = self.p = self.k = 0

    def end(self, final_loss: float) -> None:
        self.ended = True
        self.ui.on_run_end(final_loss=final_loss)

    # -- starting ------------------------------------------------------------------------

    def start(self, predictors: Any) -> None:
        """A fresh run from `predictors`, at phase 0."""
        self.predictors, self.opt = predictors, None
        self.track = new_track(predictors)
        self.done = self.p = self.k = 0
        self.begin_phase(0)

    def resume(self, st: TrainingState) -> None:
        """Continue from a saved state."""
        self.history.extend(st.history)
        self.history.penalties.extend(st.penalties)
        self.history.val.extend(st.val_history)
        self.history.bad_steps.extend(st.bad_steps)
        self.history.phase_starts.extend(st.phase_starts)
        self.history.failed.update(st.failed)
        self.history.events.extend(st.events)
        self.bad_run = st.bad_in_row
        self.predictors, self.opt_state = st.predictors, st.opt_state
        self.done, self.p, self.k = st.step, st.phase, st.phase_step
        c = self.config
        p_opt = min(self.p, c.n_phases - 1)
        self.opt = self.engine.optimizer(c.optimizer[p_opt], c.lr[p_opt])
        self.track = new_track(st.predictors, st.step)
        if self.best_on_loss:
            self.track = self.track._replace(
                best_predictors=st.best_predictors,
                best_loss=jnp.asarray(st.best_loss, dtype=default_float()),
                best_step=jnp.asarray(st.best_step, dtype=jnp.int32),
                since_best=jnp.asarray(st.since_best, dtype=jnp.int32),
            )
        else:
            self.val_best = st.best_predictors if st.best_step >= 0 else None
            self.val_best_score, self.val_best_step = st.best_loss, st.best_step
            self.val_since = st.since_best

    def begin_phase(self, p: int) -> None:
        """State changes at the start of phase `p` (reset or new rate, patience, horizon)."""
        c, track = self.config, self.track
        if self.opt is None or c.reset_optimiser_state[p]:
            self.opt = self.engine.optimizer(c.optimizer[p], c.lr[p])
            params = eqx.filter(self.predictors, self.engine.trainable)
            self.opt_state = strong(self.opt.transformation.init(params))
        if self.opt.injectable:
            self.opt_state = set_learning_rate(self.opt_state, c.lr[p])
        track = track._replace(since_best=jnp.zeros_like(track.since_best))
        self.val_since = 0
        if p > 0 and c.length_schedule[p] != c.length_schedule[p - 1] and self.best_on_loss:
            # Losses over different horizons are not comparable: the minimum starts again.
            track = track._replace(
                best_predictors=self.predictors,
                best_loss=jnp.full_like(track.best_loss, jnp.inf),
                best_step=jnp.full_like(track.best_step, -1),
            )
        self.track = track

    def phase_inputs(self, p: int) -> tuple[Any, Any, float, tuple[Any, ...]]:
        """Fraction, bucket weights, penalty weight and penalty points of phase `p`."""
        c = self.config
        fraction = c.length_schedule[p]
        weights = bucket_weights(self.dataset, c.reduction, fraction)
        weight = c.penalty_weight_for_phase(p)
        points: tuple[Any, ...] = ()
        if weight > 0 and self.sources is not None:
            points = select_penalty_points(self.sources, self.extras, fraction)
        dtype = default_float()
        return jnp.asarray(fraction, dtype), jnp.asarray(weights, dtype), weight, points

    # -- the loop ------------------------------------------------------------------------

    def step(self, inputs: tuple[Any, Any, float, tuple[Any, ...]]) -> None:
        """Dispatch one step; its results stay on the device until the next read."""
        fraction, weights, pen_weight, points = inputs
        self.predictors, self.opt_state, self.track, report = self.engine.step(
            self.opt,
            self.predictors,
            self.opt_state,
            self.track,
            self.payloads,
            fraction,
            weights,
            pen_weight,
            points,
            best_on_loss=self.best_on_loss,
        )
        self.pending.append((self.done, self.p, report))
        self.done, self.k = self.done + 1, self.k + 1

    def train(self) -> None:
        """Run the remaining steps of every phase."""
        c = self.config
        if self.val_payloads and self.done == 0:
            self.validate()
        while self.p < c.n_phases:
            phase = self.p
            inputs = self.phase_inputs(phase)
            if self.k == 0 and len(self.history.phase_starts) <= phase:
                self.history.phase_starts.append(self.done)
            self.ui.on_phase_start(
                phase_idx=phase,
                phase_steps=c.steps[phase],
                lr=c.lr[phase],
                optimizer=c.optimizer[phase],
                start_step=self.done - self.k,
            )
            while self.p == phase:
                self.step(inputs)
                self.between_steps()

    def between_steps(self) -> None:
        """Host work after a step: reads, validation, phase change, hook, checkpoint."""
        c, done = self.config, self.done
        last = self.k == c.steps[self.p]
        val_due = bool(self.val_payloads) and done % c.val_every == 0
        save_due = c.checkpoint_every > 0 and done % c.checkpoint_every == 0
        stop = False
        if len(self.pending) >= c.log_every or last or val_due or save_due:
            stop = self.sync()
        if val_due:
            stop = self.validate() or stop
        if last or stop:
            self.ui.on_phase_end(phase_idx=self.p)
            self.p, self.k = self.p + 1, 0
            if self.p < c.n_phases:
                self.begin_phase(self.p)
        if self.hook is not None and self.p < c.n_phases:
            self.predictors, self.opt_state, _ = apply_hook(
                self.hook, done, self.predictors, self.opt_state
            )
            if self.hook_events is not None:
                self.history.events.extend(self.hook_events.take(done))
        if save_due:
            save_training_state(self.path, self.state())

    def finish(self) -> tuple[Any, float]:
        """Final read, validation and save; returns the predictors to hand back and their loss."""
        self.sync()
        if self.val_payloads and (not self.history.val or self.history.val[-1][0] != self.done):
            self.validate()
        final = self.state()
        if self.path is not None:
            save_training_state(self.path, final)
        self.history.best_step, self.history.best_loss = final.best_step, final.best_loss
        if self.config.restore_best and final.best_step >= 0:
            return final.best_predictors, final.best_loss
        return self.predictors, (self.history[-1] if self.history else float("nan"))

    # -- host reads ----------------------------------------------------------------------

    def sync(self) -> bool:
        """Read the pending steps back in one transfer; report them; say if patience ran out."""
        if not self.pending:
            return False
        reports = _read_back([report for *_, report in self.pending])
        pending, self.pending = self.pending, []
        on_effort = getattr(self.ui, "on_solver_steps", None)  # optional for duck-typed UIs
        for (step, phase, _), ((stats, flags), effort) in zip(pending, reports, strict=True):
            loss, pen, ok = float(stats[0]), float(stats[1]), stats[2]
            self.history.append(loss)
            self.history.penalties.append(pen)
            effort = tuple(tuple(float(v) for v in row) for row in effort)
            self.history.solver_steps.append(effort)
            if on_effort is not None:
                on_effort(step=step, per_bucket=effort)
            self.ui.on_step_end(step=step, phase_idx=phase, loss=loss, penalty=pen)
            if flags.any():
                self.report_failures(step, phase, flags)
            if bool(ok):
                self.bad_run = 0
                continue
            self.bad_run += 1
            self.history.bad_steps.append(step)
            self.ui.on_bad_step(step=step, phase_idx=phase, loss=loss)
            if self.bad_run >= self.config.max_bad_steps:
                self._diverged(phase, step)
        since_best = int(reports[-1][0][0][3])
        patience = self.config.patience
        return self.best_on_loss and patience > 0 and since_best >= patience

    def report_failures(self, step: int, phase: int, flags: Any) -> None:
        """Name the experiments whose solve failed at `step`, in the history and the UI."""
        ids = failed_exp_ids(self.dataset, np.split(flags, self.row_splits))
        if ids:
            self.history.failed[step] = ids
            self.ui.on_failed_experiments(step=step, phase_idx=phase, exp_ids=ids)

    def _diverged(self, phase: int, step: int) -> None:
        best = self.track.best_predictors if self.best_on_loss else self.val_best
        self.end(float("nan"))
        raise NonFiniteTrainingError(
            f"training stopped in phase {phase} at step {step}: {self.bad_run} steps in a row "
            "had a non-finite loss or gradient, or no experiment that solved "
            f"(max_bad_steps={self.config.max_bad_steps}). "
            "They were not applied; the last good and the best parameters are on this error "
            "(.predictors, .best_predictors)",
            phase=phase,
            step=step,
            predictors=self.predictors,
            opt_state=self.opt_state,
            best_predictors=self.predictors if best is None else best,
            history=self.history,
        )

    def validate(self) -> bool:
        """Score the validation data at the current parameters; say if patience ran out."""
        score = self.engine.score(self.predictors, self.val_payloads, self.val_weights)
        score = float(_read_back(score))
        self.history.val.append((self.done, score))
        self.ui.on_validation(step=self.done, loss=score)
        if self.best_on_loss:
            return False
        if score < self.val_best_score:
            self.val_best, self.val_best_score = self.predictors, score
            self.val_best_step, self.val_since = self.done, 0
            return False
        self.val_since += 1
        patience = self.config.patience
        return patience > 0 and self.val_since >= patience

    def state(self) -> TrainingState:
        """The run as a `TrainingState` (reads the best-step tracker back)."""
        if self.best_on_loss:
            track = self.track
            best_loss, best_step, since = _read_back(
                (track.best_loss, track.best_step, track.since_best)
            )
            best, best_loss, best_step, since = (
                track.best_predictors,
                float(best_loss),
                int(best_step),
                int(since),
            )
        else:
            best = self.predictors if self.val_best is None else self.val_best
            best_loss, best_step, since = self.val_best_score, self.val_best_step, self.val_since
        return TrainingState(
            predictors=self.predictors,
            opt_state=self.opt_state,
            step=self.done,
            phase=self.p,
            phase_step=self.k,
            key=self.key,
            best_predictors=best,
            best_loss=best_loss,
            best_step=best_step,
            history=list(self.history),
            penalties=list(self.history.penalties),
            val_history=list(self.history.val),
            bad_steps=list(self.history.bad_steps),
            since_best=since,
            bad_in_row=self.bad_run,
            tournament_done=True,
            fingerprint=self.fingerprint,
            phase_starts=list(self.history.phase_starts),
            failed=dict(self.history.failed),
            events=list(self.history.events),
        )

    # -- compiling -----------------------------------------------------------------------

    def compile_kernels(self) -> None:
        """Run every kernel once before the first step, reporting progress per shape."""
        engine, c = self.engine, self.config
        predictors = self.predictors
        inputs = self.phase_inputs(min(self.p, c.n_phases - 1))
        fraction, _, pen_weight, points = inputs
        items: list[tuple[str, Callable[[], Any]]] = []
        for bp in self.payloads:
            N, T = bp.ts.shape
            items.append(
                (
                    f"bucket_step N={N} T={T}",
                    lambda bp=bp: engine.bucket_step(predictors, bp, fraction),
                )
            )
        one = jnp.ones((), default_float())
        scored = list(self.payloads) if c.tournament_enabled() else []
        for bp in scored + list(self.val_payloads):
            N, T = bp.ts.shape
            items.append(
                (
                    f"score_bucket N={N} T={T}",
                    lambda bp=bp: engine.score_bucket(predictors, bp, one),
                )
            )
        if pen_weight > 0:
            items.append(
                ("penalty_step", lambda: engine.penalty_step(predictors, pen_weight, points))
            )

        def update() -> Any:  # one whole step on copies of the state, then discarded
            return engine.step(
                self.opt,
                predictors,
                self.opt_state,
                self.track,
                self.payloads,
                *inputs,
                best_on_loss=self.best_on_loss,
            )

        items.append(("update", update))
        self.ui.on_compile_start(n_kernels=len(items))
        start = time.perf_counter()
        for index, (label, call) in enumerate(items):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            seconds = time.perf_counter() - t0
            self.ui.on_compile_progress(
                index=index, n_kernels=len(items), label=label, seconds=seconds
            )
        self.ui.on_compile_done(seconds=time.perf_counter() - start)
