"""`SolverConfig(jump_ts=...)` with a `simulate_fn` that calls `diffrax.diffeqsolve` itself:
refused unless the solve is given `solver.stepsize_controller()`, which clips at them."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

TS = np.linspace(0.0, 4.0, 9)
PULSE = (1.3, 1.4)  # 20 per unit time between them: most of the state at every later sample
TOL = 1e-6


def _term():
    def vf(t, y, args):
        return jnp.where((t >= PULSE[0]) & (t < PULSE[1]), 20.0, 0.0) - 0.1 * y

    return diffrax.ODETerm(vf)


def _direct(ts, y0, controller):
    return diffrax.diffeqsolve(
        _term(), diffrax.Tsit5(), ts[0], ts[-1], None, y0,
        saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller, max_steps=4096,
    ).ys  # fmt: skip


def own_controller(predictors, ts, covariates, y0, solver):
    return _direct(ts, y0, diffrax.PIDController(rtol=TOL, atol=TOL))


def solvers_controller(predictors, ts, covariates, y0, solver):
    return _direct(ts, y0, solver.stepsize_controller())


def through_solver(predictors, ts, covariates, y0, solver):
    return solver.diffeqsolve(_term(), ts, y0).ys


def exact(ts):
    a, b = PULSE
    lo, hi = np.minimum(ts, a), np.minimum(ts, b)
    return 20.0 / 0.1 * (np.exp(-0.1 * (ts - hi)) - np.exp(-0.1 * (ts - lo)))


SOLVER = hk.SolverConfig(
    diffrax.Tsit5(), rtol=TOL, atol=TOL, max_steps=4096, dt0=None, jump_ts=PULSE
)


@pytest.fixture(scope="module")
def dataset():
    jax.config.update("jax_enable_x64", True)
    experiment = hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(TS[1:], np.ones(8))},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id="pulsed",
        t0=0.0,
    )
    return hk.make_dataset([experiment], output_channel_names=["y"])


def _predict(simulate_fn, dataset):
    (pred,) = hk.predict_dataset((), dataset, simulate_fn, lambda s: s, SOLVER)
    return np.asarray(pred)[0, :, 0]


def test_a_direct_solve_that_ignores_the_solvers_jump_ts_is_refused(dataset):
    with pytest.raises(ValueError) as error:
        _predict(own_controller, dataset)
    message = str(error.value)
    assert "SolverConfig(jump_ts=(1.3, 1.4))" in message and "bucket N=1, T=9" in message
    assert "stepsize_controller=solver.stepsize_controller()" in message


def test_a_direct_solve_given_the_solvers_controller_steps_to_the_jumps(dataset):
    got = _predict(solvers_controller, dataset)
    np.testing.assert_allclose(got, exact(TS), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _predict(through_solver, dataset), rtol=1e-6)


def test_without_the_jumps_the_same_solve_steps_over_the_pulse():
    # Why the refusal: the same solve outside the kernels, where nothing can check it.
    jax.config.update("jax_enable_x64", True)
    ys = own_controller(None, jnp.asarray(TS), {}, jnp.zeros(1), SOLVER)
    assert abs(float(ys[-1, 0]) - exact(TS)[-1]) > 0.5
