"""`train_with_optax`: the stock trainer, composed only of the public kernels.

The walk of a dataset: `prepare` (`_setup.py`) checks it and gathers the run's fixed parts in
a `Setup`; `train` (`_loop.py`) drives the phases over one `LoopState`, calling `take_step`
(`_step.py`) once per step, and returns the history and the predictors to hand back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybrid_kernels._training._engine import Model
from hybrid_kernels._training._loop import train
from hybrid_kernels._training._setup import prepare
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.history import LossHistory
from hybrid_kernels._training.ui import TrainingUI


def train_with_optax(
    predictors: Any,
    dataset: Any,
    config: OptaxTrainingConfig,
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[..., Any],
    solver: Any,
    trainable: Any = None,
    key: Any,
    ui: TrainingUI | None = None,
    val_dataset: Any = None,
    hooks: Any = None,
) -> tuple[LossHistory, Any]:
    """Train `predictors` on `dataset` with optax, phase by phase.

    Composed only of the public kernels: per step, `bucket_step` on every bucket,
    `penalty_step` once, and one jitted tail calling `combine_bucket_grads` and
    `apply_update`. With one bucket and no penalty in any phase (and no tournament), the
    bucket's `bucket_step` and the tail are traced into one program: one dispatch per step.
    See [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig] for the phases, the
    tournament, early stopping and the best-step snapshot.

    **Arguments:**

    - `predictors`: any pytree of `eqx.Module`s, passed to `simulate_fn` unchanged.
    - `dataset`: a [`Dataset`][hybrid_kernels.Dataset]. A dataset built with several
        devices visible (or a `mesh`) is sharded along each bucket's experiment axis; the
        parameters are then replicated over the same mesh.
    - `config`: an [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig].
    - `simulate_fn`: `(predictors, ts [T], covariates, y0 [S], solver) -> [T, S]`.
    - `state_to_output`: `[T, S] -> [T, D]`.
    - `solver`: a [`SolverConfig`][hybrid_kernels.SolverConfig].
    - `trainable`: a boolean mask over `predictors`; `None` trains every floating array leaf
        outside a `BoundScaler` (`trainable_mask(predictors)`).
    - `key`: a JAX random key (required; it seeds the tournament).
    - `ui`: a [`TrainingUI`][hybrid_kernels.TrainingUI]; `None` picks one from
        `config.verbose`.
    - `val_dataset`: optional validation data, scored forward-only at the full horizon after
        every `config.val_every` steps (and at the start and end).
    - `hooks`: an object with `between_steps(step, predictors, opt_state)` (or such a
        function), called between optimiser steps; see
        [`BetweenStepsHook`][hybrid_kernels.BetweenStepsHook]. A list or tuple of them runs
        in its order, each given what the one before returned.

    **Returns:** `(loss_history, trained_predictors)`. `loss_history` is a
    [`LossHistory`][hybrid_kernels.LossHistory], a `list[float]` with one raw data loss per
    step (penalty excluded) plus the validation scores, skipped steps and phase starts.
    `trained_predictors` is the best snapshot when `config.restore_best` (else the last
    parameters).

    **Raises:**

    - `TypeError` when `key` is missing or not a key, `config` is not a config, `ui` lacks
        event methods, or `hooks` is neither a hook nor callable.
    - `ValueError` on an empty dataset, `monitor="val"` without `val_dataset`, a hook that
        changes structure or shapes, or a checkpoint saved by a different run.
    - [`NonFiniteTrainingError`][hybrid_kernels.NonFiniteTrainingError] after
        `config.max_bad_steps` non-finite steps in a row.
    """
    setup, predictors = prepare(
        "train_with_optax",
        predictors,
        dataset,
        config,
        Model(simulate_fn, state_to_output, solver),
        trainable=trainable,
        key=key,
        ui=ui,
        val_dataset=val_dataset,
        hooks=hooks,
    )
    result = train(setup, predictors, tournament=True)
    return result.history, result.predictors
