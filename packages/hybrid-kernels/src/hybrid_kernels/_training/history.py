"""`LossHistory`, the per-step record a run returns, and the error a diverging run raises."""

from __future__ import annotations

from typing import Any


class LossHistory(list):
    """The per-step training loss (a `list[float]`), with the rest of the run's record.

    The list holds the raw data loss of every step (plus any trajectory penalty), as the
    optimiser saw it: it can go up, and it excludes the once-per-step regulariser. A skipped
    non-finite step keeps its non-finite value here and its index in `bad_steps`. Under
    `SolverConfig(throw=False)`, a step in which every experiment's solve failed measured
    nothing: its loss is recorded as NaN and it is skipped like any non-finite step.

    **Attributes:**

    - `penalties`: the unweighted regulariser value of every step (0 where it is off).
    - `val`: `(step, score)` pairs: the validation score after `step` steps.
    - `bad_steps`: indices of the steps that were not applied.
    - `phase_starts`: the step index at which each phase began.
    - `failed`: step → the `exp_id`s whose solve failed at that step's pre-update parameters
        and were masked out of its loss (`SolverConfig(throw=False)`), or, with `throw=True`,
        whose scored predictions were not finite (the step was then skipped); steps without a
        failure are absent. `failed.get(best_step, ())` names the experiments the best
        snapshot does not solve.
    - `best_step`: the step whose pre-update parameters are the best snapshot (-1: none).
    - `best_loss`: the loss (or validation score) of that snapshot.
    - `events`: what the `between_steps` hook reported (see
        [`BetweenStepsHook`][hybrid_kernels.BetweenStepsHook]), as JSON-ready dicts, each
        with at least a `"step"`: the number of steps done when the hook ran.
    - `solver_steps`: per step, per bucket, `(mean accepted, max accepted, mean rejected,
        max rejected)` solver steps over the bucket's experiments, from diffrax's `stats` of
        the training solve itself (no extra solve; NaN where `simulate_fn` does not solve
        through `solver.diffeqsolve`). A sudden rise says the model got stiff. Not kept in
        checkpoints.
    """

    def __init__(self, values: Any = ()) -> None:
        super().__init__(values)
        self.penalties: list[float] = []
        self.val: list[tuple[int, float]] = []
        self.bad_steps: list[int] = []
        self.phase_starts: list[int] = []
        self.failed: dict[int, tuple[str, ...]] = {}
        self.best_step: int = -1
        self.best_loss: float = float("inf")
        self.events: list[dict[str, Any]] = []
        self.solver_steps: list[tuple[tuple[float, float, float, float], ...]] = []


class NonFiniteTrainingError(RuntimeError):
    """Training stopped after `max_bad_steps` non-finite steps in a row.

    Nothing learned before is lost: the skipped steps were never applied, so `predictors` and
    `opt_state` are the last good ones, and `best_predictors` is the best snapshot so far.

    Also raised at once, without waiting for `max_bad_steps`, when an optimiser update would
    make a finite trainable parameter non-finite (an overflow: say, too large a learning rate):
    the update is not applied, and the message names the optimiser, the learning rate, the
    step and the parameter leaves.

    **Attributes:** `phase`, `step` (0-based global index of the step that hit the limit),
    `predictors`, `opt_state`, `best_predictors`, `history` (a `LossHistory`), `exp_ids`
    (the experiments whose predictions were non-finite or whose solve failed in those steps,
    also in `history.failed`), `leaves` (for an update that overflowed: the paths of the
    parameter leaves it made non-finite; otherwise empty).
    """

    def __init__(
        self,
        message: str,
        *,
        phase: int,
        step: int,
        predictors: Any,
        opt_state: Any,
        best_predictors: Any,
        history: LossHistory,
        exp_ids: tuple[str, ...] = (),
        leaves: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.exp_ids = exp_ids
        self.leaves = leaves
        self.phase = phase
        self.step = step
        self.predictors = predictors
        self.opt_state = opt_state
        self.best_predictors = best_predictors
        self.history = history
