"""Forward and reverse sensitivities agree on the rest of what a bucket kernel does.

`test_sensitivity.py` covers the models, a frozen leaf, failed rows and sharding. Here: a
trajectory penalty, an input that switches at each experiment's own time (the solver steps to
the switch), irregular lengths padded into one bucket, and several buckets combined under each
reduction, on a two-state reactor as a modeller would write it.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import hybrid_kernels as hk

AGREE = 1e-10  # relative, float64: both modes differentiate the same discrete solve


class Reactor(eqx.Module):
    """Growth rate `mu_max * s / (k_s + s)` and a yield, all three trainable."""

    mu_max: jax.Array
    k_s: jax.Array
    yield_: jax.Array


def reactor_simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors

    def vf(t, y, args):
        x, s = y[0], y[1]
        growth = p.mu_max * s / (p.k_s + s) * x
        return jnp.stack([growth, -growth / p.yield_ + covariates["feed"](t)])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def both(full):
    return full


def final_substrate(full, bp):
    """A trajectory penalty weighing each row by `bp.row_weights` (padding rows weigh 0)."""
    return jnp.sum(bp.row_weights * full[:, -1, 1] ** 2) / jnp.sum(bp.row_weights)


def _experiments(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ts = np.sort(np.concatenate([[0.0], rng.uniform(0.1, 4.0, n - 1)]))
        switch = float(rng.uniform(0.5, 3.0))
        out.append(
            hk.make_experiment(
                covariates={},
                inputs={"feed": hk.piecewise_constant([0.0, switch], [0.0, 0.4])},
                channels={
                    "X": hk.ChannelObs(ts, 0.2 * np.exp(0.3 * ts)),
                    "S": hk.ChannelObs(ts[::2], 2.0 - 0.2 * ts[::2]),
                },
                y0_fn=lambda c, ch: jnp.array([0.2, 2.0]),
                exp_id=f"run{i}",
            )
        )
    return out


@pytest.fixture(scope="module")
def predictors():
    return (Reactor(jnp.asarray(0.5), jnp.asarray(1.0), jnp.asarray(0.5)),)


def _steps(solver, **kwargs):
    steps = {}
    for mode in ("forward", "reverse"):
        s = dataclasses.replace(solver, sensitivity=mode)
        steps[mode] = hk.build_bucket_step(
            reactor_simulate, both, s, hk.masked_mse, True, return_status=True, **kwargs
        )
    return steps


def _flat(grads):
    return np.asarray(ravel_pytree(eqx.filter(grads, eqx.is_inexact_array))[0])


def _assert_agree(forward, reverse):
    (lf, gf), (lr, gr) = forward, reverse
    assert float(lf) == pytest.approx(float(lr), rel=1e-13)
    gf, gr = _flat(gf), _flat(gr)
    assert np.linalg.norm(gr) > 0
    assert np.linalg.norm(gf - gr) <= AGREE * np.linalg.norm(gr)


SOLVER = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-8, atol=1e-10, max_steps=4096, dt0=None)


@pytest.fixture(scope="module")
def padded():
    """Irregular lengths padded into one bucket (masked cells), each with its own switch."""
    data = hk.make_dataset(_experiments([4, 7, 9]), output_channel_names=["X", "S"], max_shapes=1)
    (bp,) = data.bucket_payloads
    assert not bool(np.all(bp.mask)), "the bucket should have padded cells"
    return bp


@pytest.fixture(scope="module")
def steps_with_penalty():
    return _steps(SOLVER, trajectory_penalty_fn=final_substrate, trajectory_penalty_weight=0.3)


def test_agree_with_a_switching_input_on_a_padded_bucket(predictors, padded, steps_with_penalty):
    out = {m: step(predictors, padded, 1.0, 0.0) for m, step in steps_with_penalty.items()}
    _assert_agree(out["forward"][:2], out["reverse"][:2])


def test_agree_with_a_trajectory_penalty(predictors, padded, steps_with_penalty):
    out = {m: step(predictors, padded, 1.0) for m, step in steps_with_penalty.items()}
    plain = steps_with_penalty["reverse"](predictors, padded, 1.0, 0.0)
    assert float(out["reverse"][0]) > float(plain[0])  # the penalty is charged
    _assert_agree(out["forward"][:2], out["reverse"][:2])


def test_agree_under_a_length_mask(predictors, padded, steps_with_penalty):
    out = {m: step(predictors, padded, 0.5) for m, step in steps_with_penalty.items()}
    _assert_agree(out["forward"][:2], out["reverse"][:2])


@pytest.mark.parametrize("reduction", ["per_bucket", "per_experiment", "per_observation"])
def test_agree_after_combining_several_buckets(predictors, steps_with_penalty, reduction):
    # Two buckets of different shapes; the larger has `padded`'s shape, so its kernels are
    # the ones compiled above (only the (2, 5) bucket compiles here).
    data = hk.make_dataset(
        _experiments([4, 5, 9, 9, 9], seed=1),
        output_channel_names=["X", "S"],
        bucket_policy="padded",
        max_shapes=2,
    )
    shapes = [bp.mask.shape for bp in data.bucket_payloads]
    assert shapes == [(2, 5, 2), (3, 9, 2)]
    weights = hk.bucket_weights(data, reduction)
    combined = {}
    for mode, step in steps_with_penalty.items():
        results = [step(predictors, bp, 1.0)[:2] for bp in data.bucket_payloads]
        combined[mode] = hk.combine_bucket_grads(
            [r[0] for r in results], [r[1] for r in results], weights
        )
    _assert_agree(combined["forward"], combined["reverse"])
