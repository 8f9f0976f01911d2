"""The progress displays: `LogUI` (plain lines, for logs and CI) and `RichUI` (a live
dashboard on a terminal)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from hybrid_kernels._training._events import TrainingUI


def _format_effort(per_bucket: tuple[tuple[float, ...], ...]) -> str:
    """`solver steps b0 12/15 r0/1 | b1 ...`: per bucket, mean/max accepted, mean/max rejected."""
    parts = [
        f"b{b} {a:.0f}/{am:.0f} r{r:.0f}/{rm:.0f}"
        for b, (a, am, r, rm) in enumerate(per_bucket)
        if a == a  # NaN: the counts are unknown for this bucket
    ]
    return ("solver steps " + " | ".join(parts)) if parts else ""


class _Clock:
    """Steps per second and ETA, measured between reads of steps from the device.

    With `log_every=k` the trainer reads `k` steps in one transfer and their step events
    arrive together: timing the events themselves would count a block that took seconds as
    done in microseconds. The clock therefore times blocks, by the `on_steps_read` event that
    precedes each: the rate is the steps read since the first block over the time since it
    (0, unknown, until a second block arrives). A step event with no read announced (a caller
    other than the trainer) is a block of its own.
    """

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, total: int) -> None:
        self.total, self.done = total, 0
        self._first: tuple[float, int] | None = None  # (time, steps done) at the first block
        self._block: tuple[float, int] | None = None  # the same at the newest block

    def read(self, last_step: int) -> None:
        self._block = (time.perf_counter(), last_step + 1)

    def tick(self, step: int) -> None:
        self.done = step + 1
        if self._block is None or self.done > self._block[1]:
            self._block = (time.perf_counter(), self.done)
        if self._first is None:
            self._first = self._block

    def rate(self) -> float:
        if self._first is None or self._block is None:
            return 0.0
        (start, first), (now, newest) = self._first, self._block
        return (newest - first) / (now - start) if newest > first and now > start else 0.0

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

    def on_steps_read(self, *, first_step: int, last_step: int) -> None:
        self._clock.read(last_step)

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
        self._write(_end_line(final_loss, ".6g"))


def _end_line(final_loss: float, spec: str) -> str:
    """The display's last line; a run stopped by an error has no final loss (NaN)."""
    if math.isnan(final_loss):
        return "stopped: no final loss"
    return f"done: final loss {final_loss:{spec}}"


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

    def on_steps_read(self, *, first_step: int, last_step: int) -> None:
        self._clock.read(last_step)

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
            self._progress.console.log(_end_line(final_loss, ".4e"))
            self._progress.stop()
            self._progress = None
