"""Before the first step, the trainer traces the bucket kernels one after the other and
compiles each in a worker thread as soon as it is traced; the kernels' first calls reuse that
work. Counted, never timed."""

import threading

import jax
import jax.numpy as jnp
import pytest
from helpers import Rate, tiny_solver
from test_recompiles import dataset

import hybrid_kernels as hk

TRACES = []


def counting_simulate(predictors, ts, covariates, y0, solver):
    TRACES.append(ts.shape)
    (rate,) = predictors
    return y0[None, :] * jnp.exp(-rate() * (ts - ts[0]))[:, None]


def _train(simulate, data, steps=2):
    return hk.train_with_optax(
        (Rate(jnp.asarray(0.3, jnp.float64)),),
        data,
        hk.OptaxTrainingConfig(steps=(steps,), lr=(0.05,), verbose=False),
        simulate_fn=simulate,
        state_to_output=lambda full: full,
        solver=tiny_solver(),
        key=jax.random.key(0),
    )


@pytest.fixture
def compiles(monkeypatch):
    """The threads `jax.stages.Lowered.compile` ran on during a run."""
    threads = []
    real = jax.stages.Lowered.compile

    def spy(self, *args, **kwargs):
        threads.append(threading.current_thread())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    return threads


def test_each_bucket_kernel_compiles_off_the_main_thread_once(compiles):
    TRACES.clear()
    history, _ = _train(counting_simulate, dataset([5, 5, 9]))
    assert len(history) == 2
    # Two bucket shapes: each traced once (the first call reused the trace) ...
    assert sorted(TRACES) == [(5,), (9,)]
    # ... and each compiled ahead, in a worker.
    assert len(compiles) == 2
    assert all(thread is not threading.main_thread() for thread in compiles)


def test_one_bucket_is_compiled_by_its_first_call(compiles):
    TRACES.clear()
    _train(counting_simulate, dataset([5, 5]))
    assert TRACES == [(5,)] and compiles == []


def test_a_kernel_that_fails_to_trace_raises_the_users_error():
    def failing(predictors, ts, covariates, y0, solver):
        if ts.shape[0] == 9:
            raise ValueError("simulate_fn cannot handle 9 points")
        return counting_simulate(predictors, ts, covariates, y0, solver)

    with pytest.raises(ValueError, match="cannot handle 9 points"):
        _train(failing, dataset([5, 5, 9]))
