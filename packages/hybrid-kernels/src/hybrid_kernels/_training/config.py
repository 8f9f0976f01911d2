"""`OptaxTrainingConfig`: everything `train_with_optax` needs besides the model and the data.

A run is a sequence of *phases*: contiguous blocks of steps that share a learning rate, an
optimiser, a length-schedule fraction and a penalty weight. Phase-keyed fields are tuples with
one entry per phase. The configuration is validated on construction, so a bad value fails
where it is written rather than minutes into a run.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import optax

from hybrid_kernels._preflight import check_int
from hybrid_kernels._reductions import REDUCTIONS

OptimizerSpec = str | Callable[..., optax.GradientTransformation] | optax.GradientTransformation

# Names accepted in `OptaxTrainingConfig.optimizer`. Each is an optax alias taking
# `learning_rate`; anything else can be passed as a factory or a ready transformation.
OPTIMIZER_REGISTRY: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adam": optax.adam,
    "adamw": optax.adamw,
    "adabelief": optax.adabelief,
    "nadam": optax.nadam,
    "radam": optax.radam,
    "lion": optax.lion,
    "rmsprop": optax.rmsprop,
    "sgd": optax.sgd,
    "yogi": optax.yogi,
    "lbfgs": optax.lbfgs,
}
"""optax optimiser factories by name, each taking `learning_rate`. For `"lbfgs"` (optax's
L-BFGS with its zoom line search) the rate scales the direction before the line search;
`1.0` is optax's own default."""

_MONITORS = ("train", "val")


def _as_tuple(name: str, value: Any) -> tuple:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(
            f"OptaxTrainingConfig.{name} must be a tuple with one entry per phase; got {value!r}"
        )
    return tuple(value)


def _finite_nonneg(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"OptaxTrainingConfig.{name} must be a number; got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"OptaxTrainingConfig.{name} must be finite; got {value!r}")
    if number < 0.0:
        raise ValueError(f"OptaxTrainingConfig.{name} must be non-negative; got {value!r}")
    return number


def _multi(spec: Any) -> bool:
    return isinstance(spec, optax.MultiSteps)


def _normalise_optimizer(index: int, spec: Any, lr: float) -> OptimizerSpec:
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name not in OPTIMIZER_REGISTRY:
            raise ValueError(
                f"OptaxTrainingConfig.optimizer[{index}]={spec!r} is not a known name; expected "
                f"one of {sorted(OPTIMIZER_REGISTRY)}, a factory taking learning_rate, or an "
                "optax.GradientTransformation"
            )
        return name
    if isinstance(spec, optax.GradientTransformation):
        return spec
    if callable(spec):
        _check_factory(index, spec, lr)
        return spec
    raise ValueError(
        f"OptaxTrainingConfig.optimizer[{index}]={spec!r} is not a name, a factory taking "
        "learning_rate, or an optax.GradientTransformation"
    )


def _check_factory(index: int, factory: Callable[..., Any], lr: float) -> None:
    """A factory must take `learning_rate` and build an optax transformation (optax's
    factories only assemble functions, so calling one here is cheap)."""
    where = f"OptaxTrainingConfig.optimizer[{index}]={factory!r}"
    try:
        inspect.signature(factory).bind(learning_rate=lr)
    except TypeError:
        raise ValueError(
            f"{where} is a callable that cannot be called as factory(learning_rate=...); "
            "pass a factory taking learning_rate (such as optax.adam or optax.lbfgs), a "
            "ready optax.GradientTransformation, or a name"
        ) from None
    except ValueError:  # no signature to read (a builtin): the call below decides
        pass
    try:
        built = factory(learning_rate=lr)
    except Exception as exc:
        raise ValueError(
            f"{where} failed when called with learning_rate={lr}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(built, optax.GradientTransformation):
        raise ValueError(
            f"{where} returned {type(built).__name__}, not an optax.GradientTransformation; "
            "a factory must return one (init and update)"
        )


def _same_optimizer(a: OptimizerSpec, b: OptimizerSpec) -> bool:
    # Names compare by value; factories and transformations by identity (a transformation is a
    # tuple of closures, so two separately built ones are never the same optimiser).
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a is b


@dataclass(frozen=True)
class OptaxTrainingConfig:
    """Configuration of [`train_with_optax`][hybrid_kernels.train_with_optax].

    Phase-keyed fields (`steps`, `lr`, `optimizer`, `reset_optimiser_state`, `length_schedule`)
    hold one entry per phase and never broadcast; `None` for the last three means the default
    for every phase (`"adamw"`, reset where the optimiser changes, fraction 1).
    `penalty_weight` broadcasts from length 1.

    **Arguments:**

    - `steps`: optimiser steps per phase, each at least 1. A step is one pass over every bucket
        followed by exactly one update.
    - `lr`: learning rate per phase, finite and non-negative.
    - `optimizer`: per phase, a name from `OPTIMIZER_REGISTRY` (`"lbfgs"` included), a
        factory taking `learning_rate` (wrapped in `optax.inject_hyperparams`, so a phase can
        move the rate without a rebuild; its integer arguments stay plain), or a ready
        `optax.GradientTransformation` (used as given; its rate is baked in; an
        `optax.MultiSteps` is taken as its `gradient_transformation()`). A factory is
        called once here, and one that does not accept `learning_rate` or does not return a
        transformation is refused. Optimisers whose update takes `value`, `grad` and
        `value_fn` (`optax.lbfgs`, chains ending in `optax.scale_by_zoom_linesearch` or
        `optax.scale_by_backtracking_linesearch`) are given the step's objective (see
        [`build_objective`][hybrid_kernels.build_objective]); their line search's evaluations
        are part of one step. A phase that changes `lr` on a ready transformation must reset
        its state.
    - `reset_optimiser_state`: per phase, `True` starts that phase from a fresh optimiser
        state, `False` keeps the previous phase's, and `None` (the default) resets exactly
        where the optimiser changes. `False` at a change of optimiser is refused.
    - `length_schedule`: per phase, the fraction in `(0, 1]` of each time axis that the loss
        scores (the solve always covers the whole axis). Changing it never recompiles.
    - `penalty_weight`: weight of the once-per-step regulariser, length 1 or one per phase,
        finite and non-negative; `0` switches it off.
    - `penalty_points`: extra `[G, n_inputs]` points per bounded predictor for the default
        bound penalty, or `None`.
    - `penalty_fn`: `(predictors, points) -> scalar` regulariser; `None` is the bound penalty.
    - `trajectory_penalty_fn`, `trajectory_penalty_weight`: a `(full_state [N, T, S], bp) ->
        scalar` penalty charged per bucket inside the forward pass, and its weight.
    - `loss`: a loss name (`"mse"`, `"mle"`, `"bal_mse"`, `"bal_mle"`) or a callable
        `(pred_obs [N, T, D], bp) -> scalar`; `channel_idx` and `channel_weights` select and
        weight output channels.
    - `reduction`: how bucket losses and gradients combine into one step: `"per_bucket"`
        (every bucket weighs the same), `"per_experiment"` or `"per_observation"`.
    - `tournament_attempts`, `tournament_steps`, `tournament_lr`: before phase 0, re-initialise
        the trainable leaves `tournament_attempts` times, train each candidate for
        `tournament_steps` steps at `tournament_lr` and keep the best (on with attempts > 1 and
        steps > 0). If every attempt fails the original predictors are kept, with a warning.
    - `patience`: stop a phase after this many steps (validations, with `monitor="val"`)
        without a new best; 0 switches early stopping off. The counter restarts every phase.
    - `restore_best`: return the parameters of the best step rather than the last ones. The
        running minimum restarts whenever the length fraction changes, because losses over
        different horizons are not comparable.
    - `monitor`: `"train"` tracks the best step on the training loss, `"val"` on the
        validation score (needs `val_dataset`).
    - `val_every`: score `val_dataset` every this many steps.
    - `max_bad_steps`: a step whose loss or gradient is not finite is skipped; after this many
        in a row training stops with
        [`NonFiniteTrainingError`][hybrid_kernels.NonFiniteTrainingError].
    - `log_every`: read losses back to the host every this many steps (one transfer for the
        whole block). Early stopping and the bad-step limit are checked at those reads. With
        `hooks`, every step is read before the hook runs, whatever `log_every`: a hook acts
        on the parameters the run keeps, never on those of a step not yet checked.
    - `checkpoint_path`, `checkpoint_every`, `resume`: save a `TrainingState` atomically to
        `checkpoint_path` every `checkpoint_every` steps (0: only at the end) and at the end;
        with `resume=True` an existing file there is picked up and the run continues from it.
    - `verbose`: pick the default progress display when `ui` is not given (Rich on a terminal,
        plain log lines elsewhere); `False` is silent.
    """

    steps: tuple[int, ...]
    lr: tuple[float, ...]
    optimizer: tuple[OptimizerSpec, ...] | None = None
    reset_optimiser_state: tuple[bool | None, ...] | None = None
    length_schedule: tuple[float, ...] | None = None
    penalty_weight: tuple[float, ...] = (0.0,)
    penalty_points: tuple[Any, ...] | None = None
    penalty_fn: Callable[..., Any] | None = None
    trajectory_penalty_fn: Callable[..., Any] | None = None
    trajectory_penalty_weight: float = 0.0
    loss: str | Callable[..., Any] = "mse"
    channel_idx: tuple[int, ...] | None = None
    channel_weights: tuple[float, ...] | None = None
    reduction: str = "per_bucket"
    tournament_attempts: int = 1
    tournament_steps: int = 0
    tournament_lr: float = 1e-4
    patience: int = 0
    restore_best: bool = True
    monitor: str = "train"
    val_every: int = 10
    max_bad_steps: int = 10
    log_every: int = 1
    checkpoint_path: str | os.PathLike[str] | None = None
    checkpoint_every: int = 0
    resume: bool = True
    verbose: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once, here
        steps = _as_tuple("steps", self.steps)
        if not steps:
            raise ValueError("OptaxTrainingConfig.steps must contain at least one phase")
        n = len(steps)
        set_(
            self,
            "steps",
            tuple(check_int(s, f"OptaxTrainingConfig.steps[{i}]") for i, s in enumerate(steps)),
        )

        phase_fields = {
            "lr": self.lr,
            "optimizer": ("adamw",) * n if self.optimizer is None else self.optimizer,
            "reset_optimiser_state": (
                (None,) * n if self.reset_optimiser_state is None else self.reset_optimiser_state
            ),
            "length_schedule": (1.0,) * n if self.length_schedule is None else self.length_schedule,
        }
        for name, value in phase_fields.items():
            value = _as_tuple(name, value)
            if len(value) != n:
                raise ValueError(
                    f"OptaxTrainingConfig.{name} has {len(value)} entries but steps has {n} "
                    f"phases; phase-keyed fields need one entry per phase"
                )
            set_(self, name, value)

        set_(self, "lr", tuple(_finite_nonneg(f"lr[{i}]", v) for i, v in enumerate(self.lr)))
        # optax.MultiSteps is a class with init/update, not a GradientTransformation: its
        # transformation is built once per object, so phases that share it share its state.
        built = {id(s): s.gradient_transformation() for s in self.optimizer if _multi(s)}
        specs = (built.get(id(s), s) if _multi(s) else s for s in self.optimizer)
        set_(
            self,
            "optimizer",
            tuple(_normalise_optimizer(i, s, self.lr[i]) for i, s in enumerate(specs)),
        )
        set_(self, "reset_optimiser_state", self._resolve_resets())
        fractions = []
        for i, f in enumerate(self.length_schedule):
            f = float(f)
            if not 0.0 < f <= 1.0:
                raise ValueError(f"OptaxTrainingConfig.length_schedule[{i}]={f} must lie in (0, 1]")
            fractions.append(f)
        set_(self, "length_schedule", tuple(fractions))
        self._check_optimizer_switches()

        weights = _as_tuple("penalty_weight", self.penalty_weight)
        if len(weights) not in (1, n):
            raise ValueError(
                f"OptaxTrainingConfig.penalty_weight must have 1 entry (used for every phase) "
                f"or {n} (one per phase); got {len(weights)}"
            )
        set_(
            self,
            "penalty_weight",
            tuple(_finite_nonneg(f"penalty_weight[{i}]", w) for i, w in enumerate(weights)),
        )
        if self.penalty_points is not None:
            points = _as_tuple("penalty_points", self.penalty_points)
            for i, p in enumerate(points):
                if np.ndim(p) != 2:
                    raise ValueError(
                        f"OptaxTrainingConfig.penalty_points[{i}] must be a rank-2 "
                        f"[G, n_inputs] array; got shape {np.shape(p)}"
                    )
            set_(self, "penalty_points", points)
        if self.penalty_fn is not None and not callable(self.penalty_fn):
            raise ValueError("OptaxTrainingConfig.penalty_fn must be callable or None")
        set_(
            self,
            "trajectory_penalty_weight",
            _finite_nonneg("trajectory_penalty_weight", self.trajectory_penalty_weight),
        )
        if self.trajectory_penalty_weight > 0 and self.trajectory_penalty_fn is None:
            raise ValueError(
                "OptaxTrainingConfig.trajectory_penalty_weight is positive but "
                "trajectory_penalty_fn is None; pass a (full_state, bp) -> scalar function"
            )
        if not (isinstance(self.loss, str) or callable(self.loss)):
            raise ValueError(
                f"OptaxTrainingConfig.loss must be a loss name or a callable; got {self.loss!r}"
            )
        if self.channel_idx is not None:
            set_(self, "channel_idx", tuple(int(i) for i in self.channel_idx))
        if self.channel_weights is not None:
            set_(
                self,
                "channel_weights",
                tuple(
                    _finite_nonneg(f"channel_weights[{i}]", w)
                    for i, w in enumerate(self.channel_weights)
                ),
            )
        if self.reduction not in REDUCTIONS:
            raise ValueError(
                f"OptaxTrainingConfig.reduction={self.reduction!r}; expected one of {REDUCTIONS}"
            )
        check_int(self.tournament_attempts, "OptaxTrainingConfig.tournament_attempts")
        check_int(self.tournament_steps, "OptaxTrainingConfig.tournament_steps", minimum=0)
        set_(self, "tournament_lr", _finite_nonneg("tournament_lr", self.tournament_lr))
        check_int(self.patience, "OptaxTrainingConfig.patience", minimum=0)
        if self.monitor not in _MONITORS:
            raise ValueError(
                f"OptaxTrainingConfig.monitor={self.monitor!r}; expected one of {_MONITORS}"
            )
        check_int(self.val_every, "OptaxTrainingConfig.val_every")
        check_int(self.max_bad_steps, "OptaxTrainingConfig.max_bad_steps")
        check_int(self.log_every, "OptaxTrainingConfig.log_every")
        check_int(self.checkpoint_every, "OptaxTrainingConfig.checkpoint_every", minimum=0)
        if self.checkpoint_every > 0 and self.checkpoint_path is None:
            raise ValueError(
                "OptaxTrainingConfig.checkpoint_every is set but checkpoint_path is None; "
                "say where the training state should be saved"
            )

    def _resolve_resets(self) -> tuple[bool, ...]:
        """`None` entries become "reset where the optimiser changes" (its old state cannot fit
        the new optimiser); an explicit `False` there is refused."""
        resets = []
        for p, r in enumerate(self.reset_optimiser_state):
            changes = p > 0 and not _same_optimizer(self.optimizer[p - 1], self.optimizer[p])
            if r is None:
                resets.append(changes)
                continue
            if changes and not r:
                previous, current = self.optimizer[p - 1], self.optimizer[p]
                raise ValueError(
                    f"OptaxTrainingConfig: phase {p} changes optimizer from {previous!r} to "
                    f"{current!r} but reset_optimiser_state[{p}]=False asks to keep the old "
                    "state; optimiser state belongs to the optimiser that built it, so set "
                    f"reset_optimiser_state[{p}] to True or None (None resets on a change)"
                )
            resets.append(bool(r))
        return tuple(resets)

    def _check_optimizer_switches(self) -> None:
        for p in range(1, len(self.steps)):
            if self.reset_optimiser_state[p]:
                continue
            current = self.optimizer[p]
            if isinstance(current, optax.GradientTransformation) and self.lr[p] != self.lr[p - 1]:
                raise ValueError(
                    f"OptaxTrainingConfig: phase {p} changes lr from {self.lr[p - 1]} to "
                    f"{self.lr[p]} on a ready optax.GradientTransformation, whose rate is baked "
                    f"in; set reset_optimiser_state[{p}]=True, or pass a factory or a name"
                )

    @property
    def n_phases(self) -> int:
        """The number of phases."""
        return len(self.steps)

    @property
    def total_steps(self) -> int:
        """The step budget of the whole run (early stopping may use fewer)."""
        return sum(self.steps)

    def penalty_weight_for_phase(self, phase: int) -> float:
        """The penalty weight of `phase`, honouring the length-1 broadcast."""
        weights = self.penalty_weight
        return weights[0] if len(weights) == 1 else weights[phase]

    def tournament_enabled(self) -> bool:
        """Whether the tournament runs (more than one attempt, and some steps each)."""
        return self.tournament_attempts > 1 and self.tournament_steps > 0

    def fingerprint(self) -> str:
        """A text naming the settings a resumed run must share with the run that saved it."""
        parts = []
        for f in fields(self):
            if f.name in ("verbose", "checkpoint_path", "checkpoint_every", "resume", "log_every"):
                continue
            value = getattr(self, f.name)
            parts.append(f"{f.name}={_describe(value)}")
        return ";".join(parts)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(_describe(v) for v in value) + ")"
    if isinstance(value, optax.GradientTransformation):
        return "<transformation>"
    if callable(value):
        return getattr(value, "__qualname__", type(value).__name__)
    if hasattr(value, "shape"):
        return f"array{tuple(np.shape(value))}"
    return repr(value)
