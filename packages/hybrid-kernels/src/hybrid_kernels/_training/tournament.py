"""The tournament: several fresh starts, each trained briefly, ranked by a forward-only score.

A hybrid ODE model can be unrecoverable from a bad start. The tournament re-initialises the
trainable leaves once per attempt (named key folds, so attempt `a` is the same whatever the
attempt count: more attempts can only find a better winner), trains each candidate for a few
steps with the run's own compiled kernels, and scores it with the forward-only scorer at the
full horizon. An attempt fails on a solver error or a non-finite score; only those errors are
caught, so a bug in user code still reaches the user.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from hybrid_kernels._dtypes import default_float
from hybrid_kernels._training._engine import Engine, Track, strong
from hybrid_kernels._training.reinit import fold_key, reinitialise

TOURNAMENT_FAILURES: tuple[type[BaseException], ...] = (
    FloatingPointError,
    jax.errors.JaxRuntimeError,
    eqx.EquinoxRuntimeError,
)


def set_learning_rate(opt_state: Any, lr: float) -> Any:
    """`opt_state` with its injected learning rate replaced (same dtype, so no recompile)."""
    old = opt_state.hyperparams["learning_rate"]
    hyper = dict(opt_state.hyperparams)
    hyper["learning_rate"] = jnp.asarray(lr, dtype=jnp.asarray(old).dtype)
    return opt_state._replace(hyperparams=hyper)


def new_track(predictors: Any, step: int = 0) -> Track:
    """A fresh best-step tracker: nothing seen yet."""
    return Track(
        best_predictors=predictors,
        best_loss=jnp.asarray(jnp.inf, dtype=default_float()),
        best_step=jnp.asarray(-1, dtype=jnp.int32),
        since_best=jnp.asarray(0, dtype=jnp.int32),
        step=jnp.asarray(step, dtype=jnp.int32),
    )


def run_tournament(
    engine: Engine,
    predictors: Any,
    payloads: tuple[Any, ...],
    weights: jax.Array,
    *,
    optimizer_spec: Any,
    lr: float,
    n_attempts: int,
    n_steps: int,
    key: Any,
    top_k: int = 1,
    ui: Any = None,
) -> list[tuple[float, Any]]:
    """Train `n_attempts` re-initialised candidates for `n_steps` steps; return the best.

    **Returns:** up to `top_k` `(score, candidate)` pairs, best first (ties keep the earlier
    attempt). When every attempt fails: `[(inf, predictors)]` and a `RuntimeWarning`.
    """
    opt = engine.optimizer(optimizer_spec, lr)
    if not opt.injectable:
        warnings.warn(
            "tournament_lr has no effect: the optimiser is a ready optax transformation whose "
            "learning rate is baked in; pass a name or a factory to make it apply",
            RuntimeWarning,
            stacklevel=3,
        )
    fraction = jnp.ones((), default_float())
    scored: list[tuple[float, int, Any]] = []
    last_error: BaseException | None = None
    for attempt in range(n_attempts):
        attempt_key = fold_key(key, f"tournament_attempt_{attempt}")
        try:
            candidate = strong(reinitialise(predictors, engine.trainable, attempt_key))
            opt_state = strong(opt.transformation.init(eqx.filter(candidate, engine.trainable)))
            if opt.injectable:
                opt_state = set_learning_rate(opt_state, lr)
            track = new_track(candidate)
            for _ in range(n_steps):
                candidate, opt_state, track, *_ = engine.step(
                    opt,
                    candidate,
                    opt_state,
                    track,
                    payloads,
                    fraction,
                    weights,
                    0.0,
                    (),
                    best_on_loss=False,
                )
            score = float(engine.score(candidate, payloads, weights))
            if not math.isfinite(score):
                raise FloatingPointError(f"non-finite tournament score {score}")
        except TOURNAMENT_FAILURES as exc:
            last_error = exc
            if ui is not None:
                ui.on_message(text=f"tournament attempt {attempt}: failed ({exc!r:.200})")
            continue
        scored.append((score, attempt, candidate))
        if ui is not None:
            ui.on_message(text=f"tournament attempt {attempt}: score {score:.6g}")
    if not scored:
        warnings.warn(
            "tournament: every attempt failed; training continues from the initial "
            f"predictors. Last failure: {last_error!r}",
            RuntimeWarning,
            stacklevel=3,
        )
        return [(math.inf, predictors)]
    scored.sort(key=lambda item: (item[0], item[1]))
    return [(score, candidate) for score, _, candidate in scored[:top_k]]
