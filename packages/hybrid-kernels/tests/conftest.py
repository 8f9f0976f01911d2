"""Shared tiny models for the hybrid-kernels tests.

Two models, each small enough that a diffrax kernel compiles in a couple of seconds:

- `decay`: `dy/dt = -k y`, one state, one observed channel; predictors `(Rate(k),)`.
- `oscillator`: `x'' = -ω² x`, state `[x, v]`, position observed; predictors `(Omega(ω),)`.

Each fixture returns a [`Model`][] with the predictors at their *true* values, `simulate_fn`,
`state_to_output`, a `solver`, and `experiments(lengths, ...)` that builds noise-free (or noisy)
experiments of the given union lengths from the analytic solution. Fixtures are session-scoped:
the callables are module-level functions, so kernels built from them in different test modules
share nothing but stay hashable and stable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

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


@pytest.fixture(scope="session")
def decay() -> Model:
    """Exponential decay with true rate k = 0.7."""
    return Model(
        predictors=(Rate(jnp.asarray(0.7)),),
        simulate_fn=decay_simulate,
        state_to_output=identity_output,
        solver=tiny_solver(),
        truth=_decay_truth(0.7),
        y0=lambda i: np.array([1.0 + 0.25 * i]),
    )


@pytest.fixture(scope="session")
def oscillator() -> Model:
    """Harmonic oscillator with true angular frequency ω = 1.3, position observed."""
    return Model(
        predictors=(Omega(jnp.asarray(1.3)),),
        simulate_fn=oscillator_simulate,
        state_to_output=position_output,
        solver=tiny_solver(),
        truth=_osc_truth(1.3),
        y0=lambda i: np.array([1.0, 0.2 * i]),
        channel="x",
    )
