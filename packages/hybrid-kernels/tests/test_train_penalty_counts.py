"""Where each penalty is charged: the trajectory penalty per bucket, the regulariser per step.

Calls are counted at run time with `jax.debug.callback` (a Python counter in the penalty
would count traces, not executions). Two runs that differ only in their step count share their
compiled kernels; the difference of their counts is what the extra steps cost, whatever the
trainer spends on warming up.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RATE_SOLVER, Rate

import hybrid_kernels as hk

CALLS = {"trajectory": 0, "regulariser": 0}
LENGTHS = (4, 5, 6)  # three bucket shapes under the exact policy
EXTRA_STEPS = 2


def _count(name):
    def bump():
        CALLS[name] += 1

    return bump


def simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors

    def vf(t, y, args):
        return -rate() * y

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def identity(full):
    return full


def trajectory(full, bp):
    jax.debug.callback(_count("trajectory"))
    return jnp.mean(full[:, -1] ** 2)


def regulariser(predictors, points):
    jax.debug.callback(_count("regulariser"))
    return predictors[0].k ** 2


def dataset():
    exps = []
    for i, n in enumerate(LENGTHS):
        ts = np.linspace(0.0, 2.0, n)
        exps.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, np.exp(-0.7 * ts))},
                y0_fn=lambda c, ch: jnp.asarray([1.0]),
                exp_id=f"e{i}",
            )
        )
    return hk.make_dataset(exps, output_channel_names=["y"], bucket_policy="exact")


def run(data, steps):
    config = hk.OptaxTrainingConfig(
        steps=(steps,),
        lr=(0.01,),
        penalty_weight=(1.0,),
        penalty_fn=regulariser,
        trajectory_penalty_fn=trajectory,
        trajectory_penalty_weight=1.0,
        restore_best=False,
        verbose=False,
    )
    for k in CALLS:
        CALLS[k] = 0
    history, _ = hk.train_with_optax(
        (Rate(jnp.asarray(0.5)),),
        data,
        config,
        simulate_fn=simulate,
        state_to_output=identity,
        solver=RATE_SOLVER,
        key=jax.random.key(0),
    )
    jax.effects_barrier()
    return dict(CALLS), history


@pytest.fixture(scope="module")
def extra():
    """Calls made by `EXTRA_STEPS` more steps, and the longer run's history."""
    data = dataset()
    assert len(data.bucket_payloads) == len(LENGTHS)
    short, _ = run(data, 1)
    long, history = run(data, 1 + EXTRA_STEPS)
    assert len(history) == 1 + EXTRA_STEPS
    return {k: long[k] - short[k] for k in CALLS}, history


def test_the_trajectory_penalty_is_charged_once_per_bucket_per_step(extra):
    calls, _ = extra
    assert calls["trajectory"] == len(LENGTHS) * EXTRA_STEPS


def test_the_regulariser_is_charged_once_per_step_whatever_the_bucket_count(extra):
    calls, history = extra
    assert calls["regulariser"] == EXTRA_STEPS
    assert all(p > 0 for p in history.penalties)
