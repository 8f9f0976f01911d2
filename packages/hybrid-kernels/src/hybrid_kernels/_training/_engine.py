"""The trainer's compiled pieces, built only from the public kernels, and their cache.

One training step is: `bucket_step` on every bucket (one dispatch each, no host sync), then
`penalty_step` once, then one jitted *tail* that combines the bucket gradients with
`combine_bucket_grads`, adds the penalty gradient, calls `apply_update`, skips the update when
anything is non-finite, and tracks the best step. Nothing is read back to the host here.

Kernels live in small caches (the ODE kernels keyed on the model, loss and mask; the penalty
kernel on the penalty and mask; one update tail per optimiser), so the tournament, ensemble
members, a resumed run and repeated calls reuse compiled code instead of rebuilding closures
and recompiling, and changing the penalty or the optimiser never recompiles an ODE kernel.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from hybrid_kernels._kernels import (
    build_apply_update,
    build_bucket_step,
    build_penalty_step,
    build_score_bucket,
)
from hybrid_kernels._losses import resolve_loss_fn
from hybrid_kernels._penalties import bound_penalty
from hybrid_kernels._reductions import combine_bucket_grads
from hybrid_kernels._training.config import OPTIMIZER_REGISTRY, OptaxTrainingConfig

_CACHE_SIZE = 16


class Track(NamedTuple):
    """Device-side bookkeeping carried from step to step (no host reads needed)."""

    best_predictors: Any
    best_loss: jax.Array
    best_step: jax.Array
    since_best: jax.Array
    step: jax.Array


def strong(tree: Any) -> Any:
    """Strong-type weak array leaves once, so no jitted tail ever sees both kinds."""

    def fix(x: Any) -> Any:
        if isinstance(x, jax.Array) and x.weak_type:
            return jnp.asarray(x, dtype=x.dtype)
        return x

    return jax.tree_util.tree_map(fix, tree)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    def pick(a: Any, b: Any) -> Any:
        return jnp.where(pred, a, b) if eqx.is_array(a) else a

    return jax.tree_util.tree_map(pick, on_true, on_false)


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def _any_solved(failed: tuple[jax.Array, ...], row_weights: tuple[Any, ...]) -> jax.Array:
    """Whether at least one real (non-padding) row of any bucket solved."""
    ok = [
        (~f if w is None else ~f & (w > 0)).any() for f, w in zip(failed, row_weights, strict=True)
    ]
    return jnp.any(jnp.stack(ok))


def _make_tail(apply_update: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    @eqx.filter_jit
    def tail(
        predictors,
        opt_state,
        track,
        losses,
        grads,
        failed,
        row_weights,
        steps,
        weights,
        penalty,
        pen_grads,
        best_on_loss,
    ):
        loss, combined = combine_bucket_grads(losses, grads, weights)
        # Under throw=False a step whose every experiment failed has loss and gradient 0: it
        # measured nothing, so it is a non-finite step (skipped, never the best), not a perfect one.
        loss = jnp.where(_any_solved(failed, row_weights), loss, jnp.nan)
        if pen_grads is not None:
            combined = jax.tree_util.tree_map(jnp.add, combined, pen_grads)
        else:
            penalty = jnp.zeros((), loss.dtype)
        finite = jnp.isfinite(loss) & jnp.isfinite(penalty) & _all_finite(combined)
        updated, new_state = apply_update(predictors, combined, opt_state)
        # A non-finite step is not applied: parameters and optimiser state stay as they were.
        new_predictors = _select(finite, updated, predictors)
        new_state = _select(finite, new_state, opt_state)
        if best_on_loss:
            # The best snapshot is the pre-update parameters: `loss` was measured there.
            improved = finite & (loss < track.best_loss)
            track = track._replace(
                best_predictors=_select(improved, predictors, track.best_predictors),
                best_loss=jnp.where(improved, loss.astype(track.best_loss.dtype), track.best_loss),
                best_step=jnp.where(improved, track.step, track.best_step),
                since_best=jnp.where(improved, 0, track.since_best + 1),
            )
        track = track._replace(step=track.step + 1)
        # Everything the host may need about this step, in one array: one transfer per read.
        dtype = jnp.result_type(loss, penalty)
        stats = jnp.stack([loss, penalty, finite, track.since_best], dtype=dtype)
        report = ((stats, jnp.concatenate(failed)), _solver_effort(steps, row_weights))
        return new_predictors, new_state, track, report

    return tail


class Optimizer(NamedTuple):
    transformation: optax.GradientTransformation
    injectable: bool
    apply_update: Callable[..., Any]
    tail: Callable[..., Any]


_MODEL_KERNELS: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_PENALTY_KERNELS: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_OPTIMIZERS: collections.OrderedDict[Any, Any] = collections.OrderedDict()


def clear_caches() -> None:
    """Forget every cached kernel (the next run builds and compiles afresh)."""
    for table in (_MODEL_KERNELS, _PENALTY_KERNELS, _OPTIMIZERS):
        table.clear()


def _cached(table: collections.OrderedDict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
    try:
        hash(key)
    except TypeError:  # an unhashable callable or solver: no sharing, but still correct
        return build()
    if key in table:
        table.move_to_end(key)
        return table[key]
    value = table[key] = build()
    while len(table) > _CACHE_SIZE:
        table.popitem(last=False)
    return value


def _mask_key(trainable: Any) -> Any:
    if callable(trainable) and not isinstance(trainable, jax.Array):
        return ("filter", trainable)
    leaves, treedef = jax.tree_util.tree_flatten(trainable)
    return (treedef, tuple(bool(x) for x in leaves))


class Engine:
    """The kernels of one model, loss, penalty and mask.

    The pieces are cached separately, so changing the penalty never recompiles the ODE
    kernels and changing the optimiser only builds a new (cheap) update tail.
    """

    def __init__(
        self,
        *,
        simulate_fn: Callable[..., Any],
        state_to_output: Callable[..., Any],
        solver: Any,
        trainable: Any,
        config: OptaxTrainingConfig,
    ) -> None:
        self.trainable = trainable
        self._mask_key = _mask_key(trainable)
        tp_fn, tp_weight = config.trajectory_penalty_fn, config.trajectory_penalty_weight

        def model_kernels() -> tuple[Any, Any]:
            loss_fn = resolve_loss_fn(config.loss, config.channel_idx, config.channel_weights)
            bucket_step = build_bucket_step(
                simulate_fn,
                state_to_output,
                solver,
                loss_fn,
                trainable,
                tp_fn,
                tp_weight,
                return_status=True,
            )
            score_bucket = build_score_bucket(
                simulate_fn, state_to_output, solver, loss_fn, tp_fn, tp_weight, return_status=True
            )
            return bucket_step, score_bucket

        model_key = (
            simulate_fn,
            state_to_output,
            solver,
            self._mask_key,
            config.loss,
            config.channel_idx,
            config.channel_weights,
            tp_fn,
            tp_weight,
        )
        self.bucket_step, self.score_bucket = _cached(_MODEL_KERNELS, model_key, model_kernels)
        self.penalty_fn = bound_penalty if config.penalty_fn is None else config.penalty_fn
        self.penalty_step = _cached(
            _PENALTY_KERNELS,
            (self.penalty_fn, self._mask_key),
            lambda: build_penalty_step(self.penalty_fn, trainable),
        )

    def optimizer(self, spec: Any, lr: float) -> Optimizer:
        """The transformation for `spec` (names and factories get an injectable rate)."""
        # The spec itself is kept in the entry, so an id() key cannot be reused while cached.
        spec_key = ("name", spec) if isinstance(spec, str) else ("object", id(spec))
        return _cached(
            _OPTIMIZERS, (self._mask_key, spec_key), lambda: (spec, self._build_optimizer(spec, lr))
        )[1]

    def _build_optimizer(self, spec: Any, lr: float) -> Optimizer:
        if isinstance(spec, optax.GradientTransformation):
            transformation, injectable = spec, False
        else:
            factory = OPTIMIZER_REGISTRY[spec] if isinstance(spec, str) else spec
            try:
                transformation = optax.inject_hyperparams(factory)(learning_rate=lr)
            except TypeError as exc:
                raise ValueError(
                    f"optimizer factory {spec!r} failed when called with learning_rate=; a "
                    "factory must accept a keyword argument named learning_rate"
                ) from exc
            injectable = True
        apply_update = build_apply_update(transformation, self.trainable)
        return Optimizer(transformation, injectable, apply_update, _make_tail(apply_update))

    def step(
        self,
        opt: Optimizer,
        predictors: Any,
        opt_state: Any,
        track: Track,
        payloads: tuple[Any, ...],
        fraction: jax.Array,
        weights: jax.Array,
        penalty_weight: float,
        points: tuple[Any, ...],
        *,
        best_on_loss: bool,
    ) -> tuple[Any, Any, Track, jax.Array]:
        """Dispatch one training step; everything returned stays on the device.

        Returns the new predictors, optimiser state and tracker, and a report for the host to
        read when it needs to: `(([loss, penalty, finite, steps since the best], failed),
        effort)`, where `failed` holds every bucket's per-row failure flags, concatenated in
        bucket order, and `effort` is the solver effort `[B, 4]` (see `_solver_effort`).
        """
        losses, grads, failed, steps = [], [], [], []
        for bp in payloads:
            loss, g, f = self.bucket_step(predictors, bp, fraction)
            losses.append(loss)
            grads.append(g)
            failed.append(f)
            steps.append(self.bucket_step.last_solver_steps)
        if penalty_weight > 0:
            penalty, pen_grads = self.penalty_step(predictors, penalty_weight, points)
        else:  # a zero weight is exactly "off": no penalty kernel runs at all
            penalty, pen_grads = None, None
        *state, report = opt.tail(
            predictors,
            opt_state,
            track,
            tuple(losses),
            tuple(grads),
            tuple(failed),
            tuple(bp.row_weights for bp in payloads),
            tuple(steps),
            weights,
            penalty,
            pen_grads,
            best_on_loss,
        )
        return (*state, report)

    def score(self, predictors: Any, payloads: tuple[Any, ...], weights: jax.Array) -> jax.Array:
        """The forward-only objective over `payloads` at the full horizon (on the device).

        NaN when every experiment's solve failed (`throw=False`): such a score measured nothing.
        """
        one = jnp.ones((), weights.dtype)
        scored = [self.score_bucket(predictors, bp, one) for bp in payloads]
        losses, failed = tuple(s[0] for s in scored), tuple(s[1] for s in scored)
        row_weights = tuple(bp.row_weights for bp in payloads)
        return _weighted_sum(losses, failed, row_weights, weights)


def _solver_effort(steps: tuple[jax.Array, ...], row_weights: tuple[Any, ...]) -> jax.Array:
    """`[B, 4]`: per bucket, mean and max accepted steps, then mean and max rejected steps,
    over its real rows whose counts are known (NaN when none is)."""
    out = []
    for s, w in zip(steps, row_weights, strict=True):
        known = s[:, 0] >= 0
        if w is not None:
            known = known & (w > 0)
        n = known.sum()
        x = jnp.where(known[:, None], s, 0).astype(jnp.float32)
        mean = jnp.where(n > 0, x.sum(axis=0) / jnp.maximum(n, 1), jnp.nan)
        peak = jnp.where(n > 0, x.max(axis=0), jnp.nan)
        out.append(jnp.stack([mean[0], peak[0], mean[1], peak[1]]))
    return jnp.stack(out)


@eqx.filter_jit
def _weighted_sum(losses, failed, row_weights, weights) -> jax.Array:
    total = sum(weights[b].astype(loss.dtype) * loss for b, loss in enumerate(losses))
    return jnp.where(_any_solved(failed, row_weights), total, jnp.nan)


def get_engine(
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[..., Any],
    solver: Any,
    trainable: Any,
    config: OptaxTrainingConfig,
) -> Engine:
    """The `Engine` for this model and configuration, from cached kernels where possible."""
    return Engine(
        simulate_fn=simulate_fn,
        state_to_output=state_to_output,
        solver=solver,
        trainable=trainable,
        config=config,
    )
