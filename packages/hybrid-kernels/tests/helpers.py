"""Tiny models and helpers shared by the hybrid-kernels tests (`from helpers import ...`).

Each model is small enough that a diffrax kernel compiles in a couple of seconds:

- `decay`: `dy/dt = -k y`, one state, one observed channel; predictors `(Rate(k),)`.
- `oscillator`: `x'' = -ω² x`, state `[x, v]`, position observed; predictors `(Omega(ω),)`.
- `FlagModel`: the oscillator plus an int32 metadata leaf and a trace counter; a penalty that
  is NaN while the flag is set makes chosen steps non-finite (safe steps, hooks, recompiles).
- `rate_*`: a `BoundedPredictor` rate in a decay model, for the bound penalty.
- `lbfgs_loop`: the custom-loop page's hand-written optax L-BFGS loop.

A [`Model`][] holds the predictors at their *true* values, `simulate_fn`, `state_to_output`,
a `solver`, and `experiments(lengths, ...)` that builds noise-free (or noisy) experiments of
the given union lengths from the analytic solution. The callables are module-level functions,
so kernels built from them in different test modules share one compile cache.

Every distinct (model, bucket shape) pair costs one ODE kernel compile (seconds on a 2-core
CPU), so the training tests reuse few models and one bucket shape: three oscillator
experiments of ten points each (`osc_dataset`: one bucket, N=3, T=10).

This module never changes jax's configuration: float64 is switched on in `conftest.py`, so
subprocess tests that import these helpers keep jax's defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import hybrid_kernels as hk


class Rate(eqx.Module):
    """A single trainable rate constant `k`."""

    k: Any

    def __call__(self):
        return self.k


class Omega(eqx.Module):
    """A single trainable angular frequency `omega`."""

    omega: Any

    def __call__(self):
        return self.omega


class Forced(eqx.Module):
    """`y' = -e^θ y + a sin t`: a decay whose solve needs more steps the larger `θ` is."""

    theta: Any
    a: Any

    def field(self):
        return lambda t, y, args: -jnp.exp(self.theta) * y + self.a * jnp.sin(t)


def forced_simulate(predictors, ts, covariates, y0, solver):
    (m,) = predictors
    return solver.diffeqsolve(diffrax.ODETerm(m.field()), ts, y0).ys


def decay_simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors

    def vf(t, y, args):
        return -rate() * covariates["scale"] * y

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def oscillator_simulate(predictors, ts, covariates, y0, solver):
    (omega,) = predictors

    def vf(t, y, args):
        return jnp.stack([y[1], -(omega() ** 2) * y[0]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def oscillator_simulate_args(predictors, ts, covariates, y0, solver):
    """The oscillator with predictors threaded through diffrax `args` (BacksolveAdjoint-safe)."""

    def vf(t, y, args):
        (omega,) = args
        return jnp.stack([y[1], -(omega() ** 2) * y[0]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0, args=predictors).ys


def identity_output(full):
    return full


def position_output(full):
    return full[:, :1]


@dataclasses.dataclass(frozen=True)
class Model:
    """A tiny test model: true predictors, callables, a solver and an experiment factory."""

    predictors: Any
    simulate_fn: Callable
    state_to_output: Callable
    solver: hk.SolverConfig
    truth: Callable[[np.ndarray, dict, np.ndarray], np.ndarray]
    y0: Callable[[int], np.ndarray]
    channel: str = "y"

    def experiments(
        self,
        lengths: Sequence[int],
        *,
        t1: float = 2.0,
        noise: float = 0.0,
        seed: int = 0,
        dtype: Any = np.float64,
    ) -> list[hk.Experiment]:
        """One experiment per entry of `lengths`, with that many distinct observation times."""
        rng = np.random.default_rng(seed)
        exps = []
        for i, L in enumerate(lengths):
            ts = np.linspace(0.0, t1 * (0.5 + 0.5 * (i % 3) / 2), int(L)).astype(dtype)
            covs = {"scale": np.asarray(1.0 + 0.1 * (i % 4), dtype)}
            y0 = self.y0(i).astype(dtype)
            ys = self.truth(ts, covs, y0) + noise * rng.standard_normal(int(L))
            exps.append(
                hk.make_experiment(
                    covariates=covs,
                    channels={self.channel: hk.ChannelObs(ts, ys.astype(dtype), 0.01)},
                    y0_fn=lambda c, ch, y0=y0: y0,
                    exp_id=f"exp{i}",
                )
            )
        return exps

    def dataset(self, lengths: Sequence[int], **kwargs: Any) -> hk.Dataset:
        make_kw = {k: kwargs.pop(k) for k in ("bucket_policy", "max_shapes", "mesh") if k in kwargs}
        return hk.make_dataset(
            self.experiments(lengths, **kwargs), output_channel_names=[self.channel], **make_kw
        )


def tiny_solver(**kwargs: Any) -> hk.SolverConfig:
    """Tsit5 with loose-but-meaningful tolerances and the fast-compiling DirectAdjoint."""
    opts: dict[str, Any] = dict(
        solver=diffrax.Tsit5(),
        rtol=1e-6,
        atol=1e-8,
        max_steps=512,
        dt0=0.05,
        adjoint=diffrax.DirectAdjoint(),
    )
    opts.update(kwargs)
    return hk.SolverConfig(**opts)


def _decay_truth(k):
    def truth(ts, covs, y0):
        return y0[0] * np.exp(-k * covs["scale"] * ts)

    return truth


def _osc_truth(omega):
    def truth(ts, covs, y0):
        return y0[0] * np.cos(omega * ts) + y0[1] / omega * np.sin(omega * ts)

    return truth


# --- shared by the training tests ------------------------------------------------------

LENGTHS = (10, 10, 10)
OMEGA_TRUE = 1.3


def decay_model() -> Model:
    """Exponential decay with true rate k = 0.7 (the `decay` fixture)."""
    return Model(
        predictors=(Rate(jnp.asarray(0.7)),),
        simulate_fn=decay_simulate,
        state_to_output=identity_output,
        solver=tiny_solver(),
        truth=_decay_truth(0.7),
        y0=lambda i: np.array([1.0 + 0.25 * i]),
    )


def oscillator_model() -> Model:
    """Harmonic oscillator, true ω = 1.3, position observed (the `oscillator` fixture).

    Subprocess tests, which cannot use fixtures, call it directly.
    """
    return Model(
        predictors=(Omega(jnp.asarray(OMEGA_TRUE)),),
        simulate_fn=oscillator_simulate,
        state_to_output=position_output,
        solver=tiny_solver(),
        truth=_osc_truth(OMEGA_TRUE),
        y0=lambda i: np.array([1.0, 0.2 * i]),
        channel="x",
    )


def osc_dataset(oscillator: Any, *, noise: float = 0.0, seed: int = 0) -> hk.Dataset:
    """The shared bucket shape: three oscillator experiments of ten points on [0, 4]."""
    return oscillator.dataset(LENGTHS, t1=4.0, noise=noise, seed=seed)


def omega_start(value: float = 1.0) -> tuple[Omega]:
    return (Omega(jnp.asarray(value, dtype=jnp.result_type(float))),)


def quiet(steps=(30,), lr=(0.05,), **kwargs: Any) -> hk.OptaxTrainingConfig:
    return hk.OptaxTrainingConfig(steps=steps, lr=lr, verbose=False, **kwargs)


def train(oscillator: Any, dataset: Any, config: Any, start: Any = None, **kwargs: Any):
    kwargs.setdefault("key", jax.random.key(0))
    return hk.train_with_optax(
        omega_start() if start is None else start,
        dataset,
        config,
        simulate_fn=oscillator.simulate_fn,
        state_to_output=oscillator.state_to_output,
        solver=oscillator.solver,
        **kwargs,
    )


# --- FlagModel ----------------------------------------------------------------------------

TRACES = {"simulate": 0, "penalty": 0}


class Flag(eqx.Module):
    """Integer metadata: a traced int32 array, as a bank's slot bookkeeping would be."""

    flag: jax.Array


def flag_simulate(predictors, ts, covariates, y0, solver):
    TRACES["simulate"] += 1  # runs once per trace, never per call
    return oscillator_simulate(predictors[:1], ts, covariates, y0, solver)


def nan_while_flagged(predictors, points):
    """0 normally; NaN (value and gradient) while the flag is set."""
    TRACES["penalty"] += 1
    omega, flag = predictors[0].omega, predictors[1].flag
    # omega times (NaN or exactly 0): value and gradient are NaN only while flagged.
    return omega * jnp.where(flag > 0, jnp.nan, 0.0).astype(omega.dtype)


FLAG_SOLVER = tiny_solver()


def flag_start(omega: float = 1.0, flag: int = 0) -> tuple[Omega, Flag]:
    return (
        Omega(jnp.asarray(omega, dtype=jnp.result_type(float))),
        Flag(jnp.asarray(flag, dtype=jnp.int32)),
    )


def set_flag(predictors: Any, value: int) -> Any:
    return eqx.tree_at(lambda p: p[1].flag, predictors, jnp.asarray(value, dtype=jnp.int32))


def flag_config(**kwargs: Any) -> hk.OptaxTrainingConfig:
    kwargs.setdefault("steps", (8,))
    kwargs.setdefault("lr", (0.05,) * len(kwargs["steps"]))
    return hk.OptaxTrainingConfig(
        penalty_weight=(1.0,), penalty_fn=nan_while_flagged, verbose=False, **kwargs
    )


def flag_train(dataset: Any, config: Any, start: Any = None, **kwargs: Any):
    kwargs.setdefault("key", jax.random.key(0))
    return hk.train_with_optax(
        flag_start() if start is None else start,
        dataset,
        config,
        simulate_fn=flag_simulate,
        state_to_output=position_output,
        solver=FLAG_SOLVER,
        **kwargs,
    )


# --- a bounded rate, for the bound penalty ------------------------------------------------


class Affine(eqx.Module):
    """latent_out = w * latent_in + b: enough for a bounded rate to saturate or not."""

    w: jax.Array
    b: jax.Array

    def __call__(self, z):
        return self.w * z + self.b


def bounded_rate(b: float = 0.0, keys: tuple[str, ...] = ("scale",)) -> hk.BoundedPredictor:
    return hk.BoundedPredictor(
        Affine(jnp.ones((1,)) * 0.1, jnp.full((1,), b)),
        in_scaler=hk.BoundScaler([(0.5, 2.0)]),
        out_scaler=hk.BoundScaler([(0.0, 2.0)]),
        input_keys=keys,
    )


def rate_simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors
    k = rate(jnp.reshape(covariates["scale"], (1,)))[0]  # positional: input_keys are free

    def vf(t, y, args):
        return -k * y

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


RATE_SOLVER = tiny_solver()


def rate_dataset(k: float = 0.7) -> hk.Dataset:
    exps = []
    for i in range(3):
        ts = np.linspace(0.0, 3.0, LENGTHS[i])
        scale = 1.0 + 0.1 * i
        y0 = np.array([1.0 + 0.25 * i])
        ys = y0[0] * np.exp(-k * ts)
        exps.append(
            hk.make_experiment(
                covariates={"scale": np.asarray(scale)},
                channels={"y": hk.ChannelObs(ts, ys, 0.01)},
                y0_fn=lambda c, ch, y0=y0: y0,
                exp_id=f"rate{i}",
            )
        )
    return hk.make_dataset(exps, output_channel_names=["y"])


def rate_mask(predictors: Any) -> Any:
    """Train the inner weights; the scalers' temperatures stay frozen (the convention)."""
    mask = hk.trainable_mask(predictors)
    return hk.freeze_modules_of_type(mask, predictors, hk.BoundScaler)


def rate_train(dataset: Any, config: Any, start: Any = None, **kwargs: Any):
    kwargs.setdefault("key", jax.random.key(0))
    start = (bounded_rate(4.0),) if start is None else start
    kwargs.setdefault("trainable", rate_mask(start))
    return hk.train_with_optax(
        start,
        dataset,
        config,
        simulate_fn=rate_simulate,
        state_to_output=identity_output,
        solver=RATE_SOLVER,
        **kwargs,
    )


# --- a two-parameter decay, fitted to the truth (L-BFGS) -------------------------------------


class Decay(eqx.Module):
    """`y = a · exp(-k t)`: the rate and the initial amplitude, both trained."""

    k: jax.Array
    a: jax.Array


def amplitude_simulate(predictors, ts, covariates, y0, solver):
    (m,) = predictors
    term = diffrax.ODETerm(lambda t, y, args: -m.k * y)
    return solver.diffeqsolve(term, ts, m.a * y0).ys


TIGHT = hk.SolverConfig(solver=diffrax.Tsit5(), rtol=1e-10, atol=1e-12, dt0=0.05, max_steps=256)


def amplitude_dataset(k: float = 0.7, a: float = 2.0) -> hk.Dataset:
    """Two noise-free experiments of `a · exp(-k t)`, twelve points each (one bucket)."""
    exps = []
    for i, t1 in enumerate((2.0, 3.0)):
        ts = np.linspace(0.0, t1, 12)
        exps.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, a * np.exp(-k * ts), 0.01)},
                y0_fn=lambda c, ch: np.ones(1),
                exp_id=f"amp{i}",
            )
        )
    return hk.make_dataset(exps, output_channel_names=["y"])


def lbfgs_loop(value_fn: Callable[[Any], Any], params: Any, steps: int) -> tuple[Any, list[float]]:
    """The custom-loop page's hand-written optax L-BFGS loop: `steps` updates of `params` on
    `value_fn`, reusing the line search's value (`optax.value_and_grad_from_state`). Returns
    the last parameters and the value at each step's starting point."""
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(value_fn)

    @eqx.filter_jit
    def step(params, opt_state):
        value, grad = value_and_grad(params, state=opt_state)
        updates, opt_state = opt.update(
            grad, opt_state, params, value=value, grad=grad, value_fn=value_fn
        )
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, values = opt.init(params), []
    for _ in range(steps):
        params, opt_state, value = step(params, opt_state)
        values.append(float(value))
    return params, values
