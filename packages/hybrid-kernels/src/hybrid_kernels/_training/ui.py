"""Progress reporting: a small event protocol and four implementations.

The trainer reports through a `TrainingUI`. `SilentUI` ignores every event, `LogUI` prints a
plain line every few steps (for logs and CI), `RichUI` draws a live dashboard on a terminal,
and `RecordingUI` keeps every event for tests. A custom UI subclasses `TrainingUI` and
overrides what it needs.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import jax

_EVENTS = (
    "on_run_start",
    "on_compile_start",
    "on_compile_progress",
    "on_compile_done",
    "on_phase_start",
    "on_step_end",
    "on_bad_step",
    "on_failed_experiments",
    "on_validation",
    "on_phase_end",
    "on_message",
    "on_run_end",
)


class TrainingUI:
    """The progress protocol of the trainer; every method is a no-op here.

    Events arrive in this order: `on_run_start`, the compile bracket (`on_compile_start`,
    one `on_compile_progress` per compiled kernel shape, `on_compile_done`), then for each
    phase `on_phase_start`, one `on_step_end` per step (plus `on_failed_experiments` for a
    step in which some experiments' solves failed, `on_bad_step` for a skipped step and
    `on_validation` for each validation), `on_phase_end`; finally `on_run_end`.
    `on_message` may come at any time. With `log_every=k`, step events arrive in blocks of
    `k`, but there is still exactly one per step.
    """

    def on_run_start(self, *, total_steps: int, num_phases: int) -> None:
        """A run of at most `total_steps` steps in `num_phases` phases begins."""

    def on_compile_start(self, *, n_kernels: int) -> None:
        """`n_kernels` kernel shapes are about to be compiled (or found in the cache)."""

    def on_compile_progress(
        self, *, index: int, n_kernels: int, label: str, seconds: float
    ) -> None:
        """Kernel shape `index` (0-based) is ready; `label` names it, e.g. `bucket N=8 T=20`."""

    def on_compile_done(self, *, seconds: float) -> None:
        """Every kernel is ready, after `seconds` in total."""

    def on_phase_start(
        self, *, phase_idx: int, phase_steps: int, lr: float, optimizer: Any, start_step: int
    ) -> None:
        """Phase `phase_idx` of `phase_steps` steps starts; its first step is `start_step`."""

    def on_step_end(self, *, step: int, phase_idx: int, loss: float, penalty: float) -> None:
        """Global step `step` (0-based) finished with data loss `loss` and penalty `penalty`."""

    def on_solver_steps(self, *, step: int, per_bucket: tuple[tuple[float, ...], ...]) -> None:
        """Solver effort of `step`, before its `on_step_end`: per bucket, `(mean accepted, max
        accepted, mean rejected, max rejected)` steps (see `LossHistory.solver_steps`)."""

    def on_bad_step(self, *, step: int, phase_idx: int, loss: float) -> None:
        """Step `step` had a non-finite loss or gradient and was not applied."""

    def on_failed_experiments(self, *, step: int, phase_idx: int, exp_ids: tuple[str, ...]) -> None:
        """At step `step`, the solves of `exp_ids` failed and were masked out of the loss
        (`SolverConfig(throw=False)`), or, with `throw=True`, their predictions were not finite
        and the step was skipped. Only for steps with at least one such experiment.
        """

    def on_validation(self, *, step: int, loss: float) -> None:
        """The validation score of the parameters after `step` steps is `loss`."""

    def on_phase_end(self, *, phase_idx: int) -> None:
        """Phase `phase_idx` ended (its step budget ran out or patience stopped it)."""

    def on_message(self, *, text: str) -> None:
        """A line of information (tournament results, resume, checkpoints)."""

    def on_run_end(self, *, final_loss: float) -> None:
        """The run ended; `final_loss` labels the returned predictors."""


class SilentUI(TrainingUI):
    """Reports nothing."""


class RecordingUI(TrainingUI):
    """Records every event as `(name, kwargs)` in `events`, for tests.

    `count(name)` and `of(name)` filter the record.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def count(self, name: str) -> int:
        """The number of recorded `name` events."""
        return sum(1 for n, _ in self.events if n == name)

    def of(self, name: str) -> list[dict[str, Any]]:
        """The keyword arguments of every recorded `name` event, in order."""
        return [kw for n, kw in self.events if n == name]


def _recorder(name: str):
    def method(self: RecordingUI, **kwargs: Any) -> None:
        self.events.append((name, kwargs))

    method.__name__ = name
    return method


for _name in (*_EVENTS, "on_solver_steps"):
    setattr(RecordingUI, _name, _recorder(_name))


def _format_effort(per_bucket: tuple[tuple[float, ...], ...]) -> str:
    """`solver steps b0 12/15 r0/1 | b1 ...`: per bucket, mean/max accepted, mean/max rejected."""
    parts = [
        f"b{b} {a:.0f}/{am:.0f} r{r:.0f}/{rm:.0f}"
        for b, (a, am, r, rm) in enumerate(per_bucket)
        if a == a  # NaN: the counts are unknown for this bucket
    ]
    return ("solver steps " + " | ".join(parts)) if parts else ""


class _Clock:
    """Steps per second and ETA from the steps seen since the first step of the run."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.start: float | None = None
        self.first_done = 0

    def reset(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, None

    def tick(self, step: int) -> None:
        self.done = step + 1
        if self.start is None:
            self.start, self.first_done = time.perf_counter(), self.done

    def rate(self) -> float:
        if self.start is None:
            return 0.0
        elapsed = time.perf_counter() - self.start
        steps = self.done - self.first_done
        return steps / elapsed if elapsed > 0 and steps > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None


class _Failures:
    """Names failed experiments when the failing set changes, not on every step it persists."""

    _SHOWN = 10

    def __init__(self) -> None:
        self.last: tuple[str, ...] = ()
        self.last_step = -2

    def describe(self, step: int, exp_ids: tuple[str, ...]) -> str | None:
        same = exp_ids == self.last and step == self.last_step + 1
        self.last, self.last_step = exp_ids, step
        if same:
            return None
        names = ", ".join(repr(i) for i in exp_ids[: self._SHOWN])
        more = f" and {len(exp_ids) - self._SHOWN} more" if len(exp_ids) > self._SHOWN else ""
        return (
            f"step {step + 1}: {len(exp_ids)} experiment(s) failed to solve and were masked "
            f"out: {names}{more}"
        )


def _format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = round(seconds)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


class LogUI(TrainingUI):
    """Plain log lines: one every `every` steps, plus phase, compile and run summaries.

    **Arguments:**

    - `every`: print a step line every this many steps (and at the last step of a phase).
    - `stream`: where to write; `None` is `sys.stdout` at the time of writing.
    """

    def __init__(self, every: int = 10, stream: TextIO | None = None) -> None:
        if every < 1:
            raise ValueError(f"LogUI: every must be at least 1; got {every}")
        self.every = every
        self.stream = stream
        self._clock = _Clock()
        self._phase_end = 0
        self._failures = _Failures()
        self._per_bucket: tuple[tuple[float, ...], ...] = ()

    def on_solver_steps(self, *, step: int, per_bucket: tuple[tuple[float, ...], ...]) -> None:
        self._per_bucket = per_bucket  # formatted only for the lines written

    def _write(self, text: str) -> None:
        stream = sys.stdout if self.stream is None else self.stream
        print(text, file=stream, flush=True)

    def on_run_start(self, *, total_steps: int, num_phases: int) -> None:
        self._clock.reset(total_steps)
        self._write(f"training: {total_steps} steps in {num_phases} phase(s)")

    def on_compile_start(self, *, n_kernels: int) -> None:
        self._write(f"compiling {n_kernels} kernel shape(s)")

    def on_compile_progress(
        self, *, index: int, n_kernels: int, label: str, seconds: float
    ) -> None:
        self._write(f"  compiled {index + 1}/{n_kernels} {label} ({seconds:.1f} s)")

    def on_compile_done(self, *, seconds: float) -> None:
        self._write(f"compiled in {seconds:.1f} s")

    def on_phase_start(
        self, *, phase_idx: int, phase_steps: int, lr: float, optimizer: Any, start_step: int
    ) -> None:
        self._phase_end = start_step + phase_steps
        self._write(f"phase {phase_idx}: {phase_steps} steps, lr={lr:g}, optimizer={optimizer!r}")

    def on_step_end(self, *, step: int, phase_idx: int, loss: float, penalty: float) -> None:
        self._clock.tick(step)
        if (step + 1) % self.every and step + 1 != self._phase_end:
            return
        effort = _format_effort(self._per_bucket)
        self._write(
            f"phase {phase_idx} step {step + 1}/{self._clock.total} loss={loss:.6g} "
            f"penalty={penalty:.4g} {self._clock.rate():.1f} steps/s "
            f"ETA {_format_eta(self._clock.eta())}" + (f" {effort}" if effort else "")
        )

    def on_bad_step(self, *, step: int, phase_idx: int, loss: float) -> None:
        self._write(f"phase {phase_idx} step {step + 1}: non-finite loss {loss}; step skipped")

    def on_failed_experiments(self, *, step: int, phase_idx: int, exp_ids: tuple[str, ...]) -> None:
        text = self._failures.describe(step, exp_ids)
        if text:
            self._write(f"phase {phase_idx} {text}")

    def on_validation(self, *, step: int, loss: float) -> None:
        self._write(f"validation after {step} steps: {loss:.6g}")

    def on_message(self, *, text: str) -> None:
        self._write(text)

    def on_run_end(self, *, final_loss: float) -> None:
        self._write(f"done: final loss {final_loss:.6g}")


_REDRAW_SECONDS = 0.05


class RichUI(TrainingUI):
    """A Rich live dashboard: phase, step/total, loss, penalty, steps/s and ETA.

    Before the first step it shows compile progress, one line per kernel shape.

    **Arguments:**

    - `console`: a `rich.console.Console`; `None` makes one on standard output.
    """

    def __init__(self, console: Any = None) -> None:
        self.console = console
        self._progress: Any = None
        self._compile_task: Any = None
        self._step_task: Any = None
        self._clock = _Clock()
        self._num_phases = 0
        self._failures = _Failures()
        self._per_bucket: tuple[tuple[float, ...], ...] = ()
        self._phase_end = 0
        self._drawn = 0.0

    def on_solver_steps(self, *, step: int, per_bucket: tuple[tuple[float, ...], ...]) -> None:
        self._per_bucket = per_bucket  # formatted only for the steps drawn

    def on_run_start(self, *, total_steps: int, num_phases: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = self.console if self.console is not None else Console()
        self._clock.reset(total_steps)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=False,
        )
        self._progress.start()
        self._step_task = self._progress.add_task(
            "starting", total=total_steps, info="waiting for the compile", visible=True
        )
        self._num_phases = num_phases

    def on_compile_start(self, *, n_kernels: int) -> None:
        if self._progress is not None:
            self._compile_task = self._progress.add_task(
                "compiling", total=n_kernels, info="first call per bucket shape"
            )

    def on_compile_progress(
        self, *, index: int, n_kernels: int, label: str, seconds: float
    ) -> None:
        if self._progress is not None and self._compile_task is not None:
            self._progress.update(
                self._compile_task, completed=index + 1, info=f"{label} ({seconds:.1f} s)"
            )
            self._progress.refresh()  # compiles are slow: show each one as it lands

    def on_compile_done(self, *, seconds: float) -> None:
        if self._progress is not None and self._compile_task is not None:
            self._progress.update(self._compile_task, info=f"done in {seconds:.1f} s")

    def on_phase_start(
        self, *, phase_idx: int, phase_steps: int, lr: float, optimizer: Any, start_step: int
    ) -> None:
        self._phase_end = start_step + phase_steps
        if self._progress is not None:
            self._progress.update(
                self._step_task,
                description=f"phase {phase_idx + 1}/{self._num_phases} lr={lr:g}",
                info=f"optimizer={optimizer!r}",
            )

    def on_step_end(self, *, step: int, phase_idx: int, loss: float, penalty: float) -> None:
        self._clock.tick(step)
        if self._progress is None:
            return
        # The display redraws 10 times a second: updating it at every millisecond step would
        # cost more than the step. A phase's last step is always drawn.
        now = time.perf_counter()
        if now - self._drawn < _REDRAW_SECONDS and step + 1 != self._phase_end:
            return
        self._drawn = now
        rate, eta = self._clock.rate(), _format_eta(self._clock.eta())
        effort = _format_effort(self._per_bucket)
        self._progress.update(
            self._step_task,
            completed=step + 1,
            info=f"loss {loss:.4e}  penalty {penalty:.3e}  {rate:.1f} steps/s  ETA {eta}"
            + (f"  {effort}" if effort else ""),
        )

    def on_bad_step(self, *, step: int, phase_idx: int, loss: float) -> None:
        self.on_message(text=f"step {step + 1}: non-finite loss {loss}; step skipped")

    def on_failed_experiments(self, *, step: int, phase_idx: int, exp_ids: tuple[str, ...]) -> None:
        text = self._failures.describe(step, exp_ids)
        if text:
            self.on_message(text=text)

    def on_validation(self, *, step: int, loss: float) -> None:
        self.on_message(text=f"validation after {step} steps: {loss:.4e}")

    def on_message(self, *, text: str) -> None:
        if self._progress is not None:
            self._progress.console.log(text)

    def on_run_end(self, *, final_loss: float) -> None:
        if self._progress is not None:
            self._progress.console.log(f"done: final loss {final_loss:.4e}")
            self._progress.stop()
            self._progress = None


def default_ui(verbose: bool) -> TrainingUI:
    """The UI `train_with_optax` uses when none is given.

    `RichUI` on an interactive terminal, `LogUI` elsewhere (CI, notebooks writing to files,
    redirected output), `SilentUI` when `verbose` is false. With several JAX processes, only
    process 0 shows progress; the others get `SilentUI` unless given a `ui` explicitly.
    """
    if not verbose or jax.process_index() != 0:
        return SilentUI()
    if sys.stdout.isatty():
        return RichUI()
    return LogUI()


def check_ui(ui: Any) -> TrainingUI:
    """Return `ui`, or raise `TypeError` naming the event methods it lacks."""
    missing = [name for name in _EVENTS if not callable(getattr(ui, name, None))]
    if missing:
        raise TypeError(
            f"ui={ui!r} lacks the TrainingUI methods {missing}; subclass "
            "hybrid_kernels.TrainingUI and override the events you need"
        )
    return ui
