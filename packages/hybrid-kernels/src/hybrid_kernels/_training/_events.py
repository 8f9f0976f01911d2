"""The trainer's progress protocol: the events, `TrainingUI` (every event a no-op), the
`SilentUI` and `RecordingUI` implementations, and the check of a duck-typed UI."""

from __future__ import annotations

from typing import Any

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
    `k`, but there is still exactly one per step; each block is announced by
    `on_steps_read`, when it reaches the host (a display times the run by these).
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

    def on_steps_read(self, *, first_step: int, last_step: int) -> None:
        """Steps `first_step` to `last_step` (0-based, inclusive) reached the host in one read
        now; their `on_step_end` events follow. Optional for a duck-typed UI."""

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


for _name in (*_EVENTS, "on_solver_steps", "on_steps_read"):
    setattr(RecordingUI, _name, _recorder(_name))


def check_ui(ui: Any) -> TrainingUI:
    """Return `ui`, or raise `TypeError` naming the event methods it lacks."""
    missing = [name for name in _EVENTS if not callable(getattr(ui, name, None))]
    if missing:
        raise TypeError(
            f"ui={ui!r} lacks the TrainingUI methods {missing}; subclass "
            "hybrid_kernels.TrainingUI and override the events you need"
        )
    return ui
