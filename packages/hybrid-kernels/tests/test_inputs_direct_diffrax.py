"""Inputs that change in time, with a `simulate_fn` that calls `diffrax.diffeqsolve` itself.

Such a solve never sees the switch times that `solver.diffeqsolve` hands its controller, so
its steps can cross a switch or step over a pulse between two samples: the kernels refuse it
unless it read `InputSignal.jump_ts`, and with them it solves as `solver.diffeqsolve` does.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk
from hybrid_kernels._kernels import _simulate_with_steps

TS = np.linspace(0.0, 4.0, 9)
# A pulse of 0.1 between two samples, well inside the step a smooth field would allow.
PULSE = ([0.0, 1.3, 1.4], [0.0, 20.0, 0.0])
TOL = 1e-6


def _field(covariates):
    def vf(t, y, args):
        return jnp.ones_like(y) * covariates["feed"](t) - 0.1 * y

    return diffrax.ODETerm(vf)


def through_solver(predictors, ts, covariates, y0, solver):
    return solver.diffeqsolve(_field(covariates), ts, y0).ys


def _direct(term, ts, y0, controller):
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        ts[0],
        ts[-1],
        None,
        y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=controller,
        max_steps=4096,
    )
    return sol.ys


def direct(predictors, ts, covariates, y0, solver):
    """A user's habit: diffrax called directly, with its own controller."""
    return _direct(_field(covariates), ts, y0, diffrax.PIDController(rtol=TOL, atol=TOL))


def direct_with_jump_ts(predictors, ts, covariates, y0, solver):
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=TOL, atol=TOL), jump_ts=covariates["feed"].jump_ts
    )
    return _direct(_field(covariates), ts, y0, controller)


def exact(ts, switches, rates):
    """`dy/dt = u(t) - 0.1 y`, `y(0) = 0`, `u` piecewise constant."""
    edges = np.append(switches, np.inf)
    y = np.zeros_like(ts)
    for k, r in enumerate(rates):
        a, b = edges[k], edges[k + 1]
        # rate r on [a, b) adds r/0.1 (e^{-0.1 (t - min(t, b))} - e^{-0.1 (t - min(t, a))}) at t
        lo = np.minimum(ts, a)
        hi = np.minimum(ts, b)
        y += r / 0.1 * (np.exp(-0.1 * (ts - hi)) - np.exp(-0.1 * (ts - lo)))
    return y


def _experiment(name, inputs):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(TS[1:], np.ones(8))},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id=name,
        t0=0.0,
        inputs=inputs,
    )


SOLVER = hk.SolverConfig(diffrax.Tsit5(), rtol=TOL, atol=TOL, max_steps=4096, dt0=None)


@pytest.fixture(scope="module")
def pulsed():
    jax.config.update("jax_enable_x64", True)
    feed = hk.piecewise_constant(*PULSE)
    return hk.make_dataset([_experiment("pulsed", {"feed": feed})], output_channel_names=["y"])


def _predict(simulate_fn, dataset):
    (pred,) = hk.predict_dataset((), dataset, simulate_fn, lambda s: s, SOLVER)
    return np.asarray(pred)[0, :, 0]


def test_a_direct_solve_of_a_switching_input_is_refused_naming_the_bucket_and_inputs(pulsed):
    with pytest.raises(ValueError) as error:
        _predict(direct, pulsed)
    message = str(error.value)
    assert "bucket N=1, T=9" in message
    assert "('feed')" in message
    assert "solver.diffeqsolve" in message
    assert "ClipStepSizeController(controller, jump_ts=covariates['feed'].jump_ts)" in message


def test_a_direct_solve_given_jump_ts_matches_the_exact_solution_after_the_pulse(pulsed):
    got = _predict(direct_with_jump_ts, pulsed)
    want = exact(TS, *PULSE)
    assert want[-1] > 1.0  # the pulse (20 x 0.1) is most of the state at every later sample
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_direct_solve_given_jump_ts_matches_solver_diffeqsolve(pulsed):
    np.testing.assert_allclose(
        _predict(direct_with_jump_ts, pulsed), _predict(through_solver, pulsed), rtol=1e-6
    )


def test_without_the_switch_times_a_direct_solve_steps_over_the_pulse():
    # Why the refusal: the same solve outside the kernels, where nothing can check it.
    jax.config.update("jax_enable_x64", True)
    feed = hk.piecewise_constant(*PULSE).knots()
    signal = hk.InputSignal(diffrax.LinearInterpolation(ts=feed[0], ys=feed[1]))
    ys = direct(None, jnp.asarray(TS), {"feed": signal}, jnp.zeros(1), SOLVER)
    assert abs(float(ys[-1, 0]) - exact(TS, *PULSE)[-1]) > 0.5


def test_a_simulate_fn_that_solves_no_ode_says_so_by_reading_jump_ts(pulsed):
    def direct_response(predictors, ts, covariates, y0, solver):
        _ = covariates["feed"].jump_ts  # no solve here: nothing to step to
        return jax.vmap(covariates["feed"])(ts)[:, None]

    want = np.where((TS >= 1.3) & (TS < 1.4), 20.0, 0.0)
    np.testing.assert_array_equal(_predict(direct_response, pulsed), want)


def test_jump_ts_are_the_switch_times_of_every_input_padded_with_inf():
    jax.config.update("jax_enable_x64", True)
    step, ramp = hk.piecewise_constant, hk.piecewise_linear
    inputs = [
        {"feed": step(*PULSE), "ramp": ramp([0.5, 3.0], [0.0, 1.0])},
        {"feed": step([0.0, 2.0], [1.0, 0.0]), "ramp": ramp([0.0], [1.0])},
    ]
    dataset = hk.make_dataset(
        [_experiment(f"e{i}", x) for i, x in enumerate(inputs)], output_channel_names=["y"]
    )
    seen = {}

    def record(predictors, ts, covariates, y0, solver):
        seen["feed"], seen["ramp"] = covariates["feed"].jump_ts, covariates["ramp"].jump_ts
        return through_solver(predictors, ts, covariates, y0, solver)

    (bp,) = dataset.bucket_payloads
    jax.jit(lambda b: _simulate_with_steps((), b, simulate_fn=record, solver=SOLVER)[0])(bp)
    assert seen["feed"].shape == seen["ramp"].shape == (4,)  # traced per row: [J]
    np.testing.assert_array_equal(
        np.asarray(bp.jump_ts), [[0.5, 1.3, 1.4, 3.0], [0.0, 2.0, np.inf, np.inf]]
    )


def test_inputs_that_never_switch_need_no_jump_ts():
    jax.config.update("jax_enable_x64", True)
    held = hk.piecewise_constant([0.0], [2.0])  # one record: the same value throughout
    dataset = hk.make_dataset([_experiment("held", {"feed": held})], output_channel_names=["y"])
    assert dataset.bucket_payloads[0].jump_ts is None
    np.testing.assert_allclose(
        _predict(direct, dataset), 20.0 * (1.0 - np.exp(-0.1 * TS)), rtol=1e-5
    )


def test_a_signal_built_outside_the_kernels_gives_its_knot_times():
    ts, ys = hk.piecewise_constant(*PULSE).knots()
    signal = hk.InputSignal(diffrax.LinearInterpolation(ts=ts, ys=ys))
    np.testing.assert_array_equal(np.asarray(signal.jump_ts), ts)
