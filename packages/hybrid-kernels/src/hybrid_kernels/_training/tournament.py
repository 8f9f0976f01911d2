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

from hybrid_kernels._dispatch import _strong
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._training._setup import Setup
from hybrid_kernels._training._step import StepInputs, new_carry, take_step
from hybrid_kernels._training.reinit import fold_key, reinitialise

TOURNAMENT_FAILURES: tuple[type[BaseException], ...] = (
    FloatingPointError,
    jax.errors.JaxRuntimeError,
    eqx.EquinoxRuntimeError,
)


def run_tournament(
    setup: Setup,
    predictors: Any,
    *,
    n_attempts: int,
    key: Any,
    top_k: int = 1,
    failed: list[int] | None = None,
) -> list[tuple[float, Any]]:
    """Train `n_attempts` re-initialised candidates briefly on `setup`'s data; return the best.

    Each candidate trains for `config.tournament_steps` steps of optimiser `config.optimizer[0]`
    at `config.tournament_lr`, at the full horizon and without the penalty, then is scored
    forward-only.

    **Returns:** up to `top_k` `(score, candidate)` pairs, best first (ties keep the earlier
    attempt). When every attempt fails: `[(inf, predictors)]` and a `RuntimeWarning`. The
    indices of the failed attempts are appended to `failed`, when given.
    """
    engine, c, ui = setup.engine, setup.config, setup.ui
    lr = c.tournament_lr
    opt = engine.optimizer(c.optimizer[0], lr)
    if not opt.injectable:
        warnings.warn(
            "tournament_lr has no effect: the optimiser is a ready optax transformation whose "
            "learning rate is baked in; pass a name or a factory to make it apply",
            RuntimeWarning,
            stacklevel=3,
        )
    inputs = StepInputs(jnp.ones((), default_float()), setup.weights, 0.0, ())
    scored: list[tuple[float, int, Any]] = []
    last_error: BaseException | None = None
    for attempt in range(n_attempts):
        attempt_key = fold_key(key, f"tournament_attempt_{attempt}")
        try:
            candidate = _strong(reinitialise(predictors, engine.trainable, attempt_key))
            carry = new_carry(candidate, engine.fresh_opt_state(opt, candidate, lr))
            for _ in range(c.tournament_steps):
                carry, _ = take_step(engine, opt, carry, setup.payloads, inputs, best_on_loss=False)
            candidate = carry.predictors
            score = float(engine.score(candidate, setup.payloads, setup.weights))
            if not math.isfinite(score):
                raise FloatingPointError(f"non-finite tournament score {score}")
        except TOURNAMENT_FAILURES as exc:
            last_error = exc
            if failed is not None:
                failed.append(attempt)
            ui.on_message(text=f"tournament attempt {attempt}: failed ({exc!r:.200})")
            continue
        scored.append((score, attempt, candidate))
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
