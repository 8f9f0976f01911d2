"""The set-up of a training run: check the arguments once, and gather what every step needs.

`prepare` is the one set-up shared by `train_with_optax`, the tournament and both ensembles:
it validates the arguments, resolves the mask, the UI and the hook, fetches the cached
`Engine`, strong-types and places the parameters, and bundles the rest in a `Setup`, so that
later code passes one object instead of a dozen values. `phase_inputs` turns a phase into the
`StepInputs` of its steps, `load_saved` reads a checkpoint back for a resume, and
`compile_kernels` runs every kernel once before the first step.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
import types
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from hybrid_kernels._dispatch import _strong
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._paths import file_to_write
from hybrid_kernels._penalties import (
    data_penalty_points,
    select_penalty_points,
    validate_penalty_points,
)
from hybrid_kernels._reductions import bucket_weights
from hybrid_kernels._trainable import trainable_mask
from hybrid_kernels._training._engine import Engine, Model, check_update
from hybrid_kernels._training._events import check_ui
from hybrid_kernels._training._step import Carry, StepInputs, quiet_step, take_step
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.hooks import HookEvents, resolve_hook
from hybrid_kernels._training.state import (
    TrainingState,
    load_training_state,
    read_training_meta,
)
from hybrid_kernels._training.ui import TrainingUI, default_ui


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything about one run that stays fixed from the first step to the last.

    - `where`: the public function's name, for error messages.
    - `payloads`, `weights`: the training buckets and their full-horizon weights `[B]`;
        `row_splits` says where each bucket's rows end in a step's concatenated flags.
    - `val_payloads`, `val_weights`: the validation buckets (or `()` and `None`).
    - `sources`, `extras`: the penalty points drawn from the data and the configured ones.
    - `path`: the checkpoint file or `None`; `fingerprint` names the settings it was saved by.
    """

    where: str
    config: OptaxTrainingConfig
    engine: Engine
    dataset: Any
    val_dataset: Any
    payloads: tuple[Any, ...]
    weights: jax.Array
    row_splits: np.ndarray
    val_payloads: tuple[Any, ...]
    val_weights: jax.Array | None
    ui: TrainingUI
    hook: Callable[..., Any] | None
    hook_events: HookEvents | None
    key: Any
    fingerprint: str
    path: Path | None
    sources: Any
    extras: tuple[Any, ...]
    mesh: Any

    @property
    def best_on_loss(self) -> bool:
        """Whether the best step is judged on the training loss (else on validation)."""
        return self.config.monitor == "train"


def check_config(config: Any, where: str) -> OptaxTrainingConfig:
    if not isinstance(config, OptaxTrainingConfig):
        raise TypeError(f"{where}: config must be an OptaxTrainingConfig; got {config!r}")
    return config


def resolve_ui(config: OptaxTrainingConfig, ui: TrainingUI | None) -> TrainingUI:
    return default_ui(config.verbose) if ui is None else check_ui(ui)


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


def replicate(tree: Any, mesh: Any) -> Any:
    """`tree` with its arrays replicated over `mesh` (unchanged without one)."""
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


def _weights(dataset: Any, config: OptaxTrainingConfig, fraction: float = 1.0) -> jax.Array:
    return jnp.asarray(bucket_weights(dataset, config.reduction, fraction), dtype=default_float())


def _check_optimizers(
    engine: Engine, config: OptaxTrainingConfig, predictors: Any, trainable: Any
) -> None:
    """Every phase's optimiser, tried abstractly on the trainable leaves before the first step
    (`check_update`), so that one that cannot take them is named before hours of an earlier
    phase, not when its own phase begins."""
    checked: set[Any] = set()
    for p, spec in enumerate(config.optimizer):
        key = spec if isinstance(spec, str) else id(spec)
        if key in checked:
            continue
        checked.add(key)
        named = spec if isinstance(spec, str) else getattr(spec, "__qualname__", "")
        where = f"OptaxTrainingConfig.optimizer[{p}]" + (f" ({named!r})" if named else "")
        check_update(engine.optimizer(spec, config.lr[p]), predictors, trainable, where)


def prepare(
    where: str,
    predictors: Any,
    dataset: Any,
    config: OptaxTrainingConfig,
    model: Model,
    *,
    trainable: Any,
    key: Any,
    ui: TrainingUI | None,
    val_dataset: Any = None,
    hooks: Any = None,
) -> tuple[Setup, Any]:
    """Check the arguments of a run and gather them; returns the `Setup` and the predictors,
    strong-typed and replicated over the dataset's mesh.

    The arguments are those of [`train_with_optax`][hybrid_kernels.train_with_optax], with
    `where` (the public function's name, for errors) first and the model in one `Model`.
    """
    config = check_config(config, where)
    payloads = tuple(getattr(dataset, "bucket_payloads", ()))
    if not payloads:
        raise ValueError(f"{where}: dataset has no buckets; nothing to train on")
    if val_dataset is not None and not tuple(val_dataset.bucket_payloads):
        raise ValueError(f"{where}: val_dataset has no buckets; pass None to skip validation")
    if config.monitor == "val" and val_dataset is None:
        raise ValueError(f"{where}: config.monitor='val' needs a val_dataset")
    key = _check_key(key)
    trainable = resolve_trainable(predictors, trainable)
    ui = resolve_ui(config, ui)
    hook = resolve_hook(hooks)
    mesh = getattr(dataset, "mesh", None)
    predictors = replicate(_strong(predictors), mesh)
    engine = Engine(model, trainable, config)
    _check_optimizers(engine, config, predictors, trainable)
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
    setup = Setup(
        where=where,
        config=config,
        engine=engine,
        dataset=dataset,
        val_dataset=val_dataset,
        payloads=payloads,
        weights=_weights(dataset, config),
        row_splits=np.cumsum([bp.ts.shape[0] for bp in payloads])[:-1],
        val_payloads=() if val_dataset is None else tuple(val_dataset.bucket_payloads),
        val_weights=None if val_dataset is None else _weights(val_dataset, config),
        ui=ui,
        hook=hook,
        hook_events=None if hook is None else HookEvents(hooks),
        key=key,
        fingerprint=_fingerprint(config, dataset, predictors),
        path=(
            None
            if config.checkpoint_path is None
            else file_to_write(config.checkpoint_path, "checkpoint_path")  # before any step
        ),
        sources=sources,
        extras=extras,
        mesh=mesh,
    )
    return setup, predictors


def phase_inputs(setup: Setup, p: int) -> StepInputs:
    """Fraction, bucket weights, penalty weight and penalty points of phase `p`."""
    c = setup.config
    fraction = c.length_schedule[p]
    weight = c.penalty_weight_for_phase(p)
    points: tuple[Any, ...] = ()
    if weight > 0 and setup.sources is not None:
        points = select_penalty_points(setup.sources, setup.extras, fraction)
    dtype = default_float()
    # One bucket and no penalty in any phase: the step is one program, as a hand-written
    # loop's is. (With a tournament the separate bucket kernel is compiled anyway, and the
    # fused one would be a second compile of the same solve.)
    fused = (
        len(setup.payloads) == 1
        and not any(c.penalty_weight_for_phase(q) > 0 for q in range(c.n_phases))
        and not c.tournament_enabled()
    )
    return StepInputs(
        jnp.asarray(fraction, dtype),
        _weights(setup.dataset, c, fraction),
        weight,
        points,
        fused,
        jnp.asarray(weight, dtype),
    )


def load_saved(setup: Setup, predictors: Any) -> TrainingState | None:
    """The state saved at `setup.path` when resuming, checked against this run's settings and
    placed like `predictors`; `None` when there is none to resume."""
    c, path = setup.config, setup.path
    if path is None or not c.resume or not path.exists():
        return None
    meta = read_training_meta(path)
    if meta["fingerprint"] != setup.fingerprint:
        raise ValueError(
            f"{setup.where}: the training state in {str(path)!r} was saved by a run with "
            "different settings, data shapes or model structure; delete it or pass "
            "resume=False to start afresh"
        )
    # The saved optimiser state belongs to the optimiser of the phase it was saved in.
    p = min(int(meta["phase"]), c.n_phases - 1)
    opt = setup.engine.optimizer(c.optimizer[p], c.lr[p])
    template = setup.engine.fresh_opt_state(opt, predictors, c.lr[p])
    saved = load_training_state(path, predictors=predictors, opt_state=template)
    for name in ("predictors", "opt_state", "best_predictors"):
        setattr(saved, name, replicate(getattr(saved, name), setup.mesh))
    return saved


def compile_kernels(setup: Setup, carry: Carry, opt: Any, phase: int) -> None:
    """Run every kernel once before the first step of `phase`, reporting progress per shape."""
    engine, c, ui = setup.engine, setup.config, setup.ui
    predictors = carry.predictors
    inputs = phase_inputs(setup, min(phase, c.n_phases - 1))
    items: list[tuple[str, Callable[[], Any]]] = []
    lowerings: list[Callable[[], Any]] = []
    for bp in () if inputs.fused else setup.payloads:
        N, T = bp.ts.shape
        items.append(
            (
                f"bucket_step N={N} T={T}",
                lambda bp=bp: engine.bucket_step(predictors, bp, inputs.fraction),
            )
        )
        lowerings.append(lambda bp=bp: engine.bucket_step.lower(predictors, bp, inputs.fraction))
    one = jnp.ones((), default_float())
    scored = list(setup.payloads) if c.tournament_enabled() else []
    for bp in scored + list(setup.val_payloads):
        N, T = bp.ts.shape
        items.append(
            (f"score_bucket N={N} T={T}", lambda bp=bp: engine.score_bucket(predictors, bp, one))
        )
    if inputs.penalty_weight > 0:
        items.append(
            (
                "penalty_step",
                lambda: engine.penalty_step(predictors, inputs.penalty_weight, inputs.points),
            )
        )

    def update() -> Any:  # one whole step on a copy of the carry, then discarded
        return take_step(
            engine,
            opt,
            carry,
            setup.payloads,
            inputs,
            best_on_loss=setup.best_on_loss,
            quiet=quiet_step(engine, opt, inputs),  # the program the first step runs
        )

    if inputs.fused:  # the bucket's solve is compiled inside the step
        N, T = setup.payloads[0].ts.shape
        items.append((f"bucket_step N={N} T={T} + update", update))
    else:
        items.append(("update", update))
    ui.on_compile_start(n_kernels=len(items))
    start = time.perf_counter()
    ahead = _compile_ahead(lowerings) if len(lowerings) > 1 else []
    for index, (label, call) in enumerate(items):
        t0 = time.perf_counter()
        traced = 0.0
        if index < len(ahead):
            traced, compiling = ahead[index]
            if compiling is not None:
                compiling.exception()  # wait; a failed compile fails again, and is told, below
        jax.block_until_ready(call())
        seconds = traced + time.perf_counter() - t0
        ui.on_compile_progress(index=index, n_kernels=len(items), label=label, seconds=seconds)
    ui.on_compile_done(seconds=time.perf_counter() - start)
    notice = engine.bucket_step.sensitivity_notice  # said once per run, never per step
    if notice is not None:
        ui.on_message(text=notice)


def _compile_ahead(lowerings: list[Callable[[], Any]]) -> list[tuple[float, Future | None]]:
    """Trace every bucket kernel here and compile each in a worker thread as soon as it is
    traced: `[(seconds traced, compile future or None)]`, one per lowering, in order.

    XLA compiles without Python's lock, so the next kernel's trace (Python) overlaps the last
    one's compile, and kernels compile side by side on several cores. The kernel's own first
    call then finds its program compiled (jit's caches are keyed by the same arguments). On
    two bucket shapes of the integration example, on a 2-core CPU, this took the first step
    from 18.0 to 13.2 s with a confluent bank and from 13.7 to 10.9 s with an MLP
    (`benchmarks/bank_in_ode.py`). A lowering that fails is left to the kernel's call, which
    raises the error with its own explanation.
    """
    pool = ThreadPoolExecutor(max_workers=min(len(lowerings), os.cpu_count() or 1))
    ahead: list[tuple[float, Future | None]] = []
    for lower in lowerings:
        t0 = time.perf_counter()
        try:
            lowered = lower()
        except Exception:  # raised again, and explained, by the kernel's own call
            ahead.append((time.perf_counter() - t0, None))
            continue
        ahead.append((time.perf_counter() - t0, pool.submit(lowered.compile)))
    pool.shutdown(wait=False)
    return ahead
