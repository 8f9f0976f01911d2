"""`train_with_optax`: the stock trainer, composed only of the public kernels.

A step is `bucket_step` on every bucket, `penalty_step` once, then one jitted tail that calls
`combine_bucket_grads` and `apply_update` (see `_engine.py`). The Python loop here only
dispatches, and reads values back to the host once every `log_every` steps. Around that loop:
phases, the tournament, validation, the best-step snapshot, early stopping, safe steps,
between-steps hooks, progress events and atomic checkpoints.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from hybrid_kernels._dtypes import default_float
from hybrid_kernels._errors import RowSolveError
from hybrid_kernels._penalties import (
    data_penalty_points,
    validate_penalty_points,
)
from hybrid_kernels._reductions import bucket_weights
from hybrid_kernels._trainable import trainable_mask
from hybrid_kernels._training._engine import get_engine, strong
from hybrid_kernels._training._run import Run, name_failed_experiments
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.history import LossHistory
from hybrid_kernels._training.hooks import HookEvents, resolve_hook
from hybrid_kernels._training.reinit import fold_key
from hybrid_kernels._training.state import (
    TrainingState,
    load_training_state,
    read_training_meta,
)
from hybrid_kernels._training.tournament import run_tournament
from hybrid_kernels._training.ui import TrainingUI, check_ui, default_ui


class RunResult(NamedTuple):
    history: LossHistory
    predictors: Any
    final_loss: float


def resolve_trainable(predictors: Any, trainable: Any) -> Any:
    """A boolean mask over `predictors`: `None` is `trainable_mask(predictors)`, a function a
    filter."""
    if trainable is None:
        return trainable_mask(predictors)
    if isinstance(trainable, types.FunctionType | types.BuiltinFunctionType | functools.partial):
        return trainable_mask(predictors, trainable)  # an equinox-style filter function
    return trainable


def _check_key(key: Any) -> Any:
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a JAX random key (jax.random.key(...)); got {key!r}")
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape != (2,):
        raise TypeError(
            f"key must be a JAX random key; got an array of shape {key.shape} dtype {key.dtype}"
        )
    return key


def _replicate(tree: Any, mesh: Any) -> Any:
    if mesh is None:
        return tree
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x, sharding) if eqx.is_array(x) else x, tree
    )


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _fingerprint(config: OptaxTrainingConfig, dataset: Any, predictors: Any) -> str:
    shapes = [tuple(bp.ts.shape) + tuple(bp.mask.shape[2:]) for bp in dataset.bucket_payloads]
    structure = _ADDRESS.sub("", str(jax.tree_util.tree_structure(predictors)))
    return f"{config.fingerprint()}|buckets={shapes}|tree={structure}"


def run_training(
    predictors: Any,
    dataset: Any,
    config: OptaxTrainingConfig,
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[..., Any],
    solver: Any,
    trainable: Any,
    key: Any,
    ui: TrainingUI | None,
    val_dataset: Any,
    hooks: Any,
    tournament: bool = True,
    where: str = "train_with_optax",
) -> RunResult:
    """The body of `train_with_optax`, also used by the ensembles."""
    if not isinstance(config, OptaxTrainingConfig):
        raise TypeError(f"{where}: config must be an OptaxTrainingConfig; got {config!r}")
    payloads = tuple(getattr(dataset, "bucket_payloads", ()))
    if not payloads:
        raise ValueError(f"{where}: dataset has no buckets; nothing to train on")
    if val_dataset is not None and not tuple(val_dataset.bucket_payloads):
        raise ValueError(f"{where}: val_dataset has no buckets; pass None to skip validation")
    if config.monitor == "val" and val_dataset is None:
        raise ValueError(f"{where}: config.monitor='val' needs a val_dataset")
    key = _check_key(key)
    trainable = resolve_trainable(predictors, trainable)
    ui = default_ui(config.verbose) if ui is None else check_ui(ui)
    hook = resolve_hook(hooks)
    mesh = getattr(dataset, "mesh", None)
    predictors = _replicate(strong(predictors), mesh)
    engine = get_engine(
        simulate_fn=simulate_fn,
        state_to_output=state_to_output,
        solver=solver,
        trainable=trainable,
        config=config,
    )
    fingerprint = _fingerprint(config, dataset, predictors)
    sources, extras = None, ()
    if any(w > 0 for w in config.penalty_weight) or config.penalty_points is not None:
        sources = data_penalty_points(predictors, dataset)
        extras = tuple(config.penalty_points or ())
        validate_penalty_points(
            predictors,
            sources,
            extras,
            enabled=any(w > 0 for w in config.penalty_weight) and config.penalty_fn is None,
        )
    path = None if config.checkpoint_path is None else Path(config.checkpoint_path)
    run = Run(
        engine,
        config,
        dataset,
        val_dataset,
        ui=ui,
        hook=hook,
        key=key,
        fingerprint=fingerprint,
        path=path,
        sources=sources,
        extras=extras,
        hook_events=None if hook is None else HookEvents(hooks),
    )

    ui.on_run_start(total_steps=config.total_steps, num_phases=config.n_phases)
    try:
        saved = None
        if path is not None and config.resume and path.exists():
            saved = _load(path, fingerprint, engine, config, predictors, trainable, where)
        if saved is None:
            run.start(predictors)
            run.compile_kernels()
            if tournament and config.tournament_enabled():
                weights = bucket_weights(dataset, config.reduction)
                ranked = run_tournament(
                    engine,
                    predictors,
                    run.payloads,
                    jnp.asarray(weights, dtype=default_float()),
                    optimizer_spec=config.optimizer[0],
                    lr=config.tournament_lr,
                    n_attempts=config.tournament_attempts,
                    n_steps=config.tournament_steps,
                    key=fold_key(key, "tournament"),
                    ui=ui,
                )
                run.start(_replicate(ranked[0][1], mesh))
        else:
            for name in ("predictors", "opt_state", "best_predictors"):
                setattr(saved, name, _replicate(getattr(saved, name), mesh))
            run.resume(saved)
            ui.on_message(text=f"resumed from {str(path)!r} after step {run.done}")
            if run.p < config.n_phases:
                run.compile_kernels()
        run.train()
        final, final_loss = run.finish()
        run.end(final_loss)
        return RunResult(run.history, final, final_loss)
    except BaseException as error:
        if not run.ended:  # close a live display on any error (Ctrl-C included)
            run.end(float("nan"))
        if isinstance(error, RowSolveError):  # a throw=True solve: say which experiment failed
            named = name_failed_experiments(error, (dataset, val_dataset), where)
            if named is not error:
                raise named from error
        raise


def _load(path, fingerprint, engine, config, predictors, trainable, where) -> TrainingState:
    """The saved state at `path`, checked against this run's settings."""
    meta = read_training_meta(path)
    if meta["fingerprint"] != fingerprint:
        raise ValueError(
            f"{where}: the training state in {str(path)!r} was saved by a run with different "
            "settings, data shapes or model structure; delete it or pass resume=False to start "
            "afresh"
        )
    # The saved optimiser state belongs to the optimiser of the phase it was saved in.
    p = min(int(meta["phase"]), config.n_phases - 1)
    opt = engine.optimizer(config.optimizer[p], config.lr[p])
    template = strong(opt.transformation.init(eqx.filter(predictors, trainable)))
    return load_training_state(path, predictors=predictors, opt_state=template)


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
    `apply_update`. See [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig] for the
    phases, the tournament, early stopping and the best-step snapshot.

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
        [`BetweenStepsHook`][hybrid_kernels.BetweenStepsHook].

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
    result = run_training(
        predictors,
        dataset,
        config,
        simulate_fn=simulate_fn,
        state_to_output=state_to_output,
        solver=solver,
        trainable=trainable,
        key=key,
        ui=ui,
        val_dataset=val_dataset,
        hooks=hooks,
    )
    return result.history, result.predictors
