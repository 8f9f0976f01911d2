"""`sensitivity="auto"` with a `simulate_fn` that forward mode cannot differentiate.

A `simulate_fn` that calls `diffrax.diffeqsolve` itself (no `adjoint=solver.adjoint`) solves
through diffrax's default `RecursiveCheckpointAdjoint`, a `custom_vjp`: forward mode cannot push
tangents through it. `"auto"` then trains in reverse mode and says so once; an explicit
`"forward"` refuses with a message naming the fix.
"""

import logging

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, decay_simulate, identity_output

import hybrid_kernels as hk

K_TRUE = 0.7
LOGGER = "hybrid_kernels._sensitivity"


def plain_diffrax_simulate(predictors, ts, covariates, y0, solver):
    """The habit: diffrax called directly, with its own controller and default adjoint."""
    (rate,) = predictors

    def vf(t, y, args):
        return -rate() * covariates["scale"] * y

    return diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        solver.solver,
        t0=ts[0],
        t1=ts[-1],
        dt0=0.05,
        y0=y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=512,
    ).ys


def readme_solver(**kwargs):
    """The README quick start's config: every default, `sensitivity="auto"` included."""
    opts = dict(rtol=1e-6, atol=1e-8, max_steps=512, dt0=None) | kwargs
    return hk.SolverConfig(diffrax.Tsit5(), **opts)


@pytest.fixture(scope="module")
def dataset():
    ts = np.linspace(0.0, 2.0, 8)
    exps = [
        hk.make_experiment(
            covariates={"scale": np.asarray(s)},
            channels={"y": hk.ChannelObs(ts, y0 * np.exp(-K_TRUE * s * ts), 0.01)},
            y0_fn=lambda c, ch, y0=y0: np.array([y0]),
            exp_id=f"e{i}",
        )
        for i, (y0, s) in enumerate([(1.0, 1.0), (2.0, 1.2)])
    ]
    return hk.make_dataset(exps, output_channel_names=["y"])


def fallback_records(capture):
    return [r for r in capture.records if r.name == LOGGER and "reverse mode" in r.getMessage()]


def test_auto_trains_a_plain_diffrax_simulate_fn_and_says_so_once(dataset, caplog):
    ui = hk.RecordingUI()
    config = hk.OptaxTrainingConfig(steps=(30, 10), lr=(0.05, 0.01), verbose=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        history, trained = hk.train_with_optax(
            (Rate(jnp.asarray(0.3)),),
            dataset,
            config,
            simulate_fn=plain_diffrax_simulate,
            state_to_output=identity_output,
            solver=readme_solver(),
            key=jax.random.key(0),
            ui=ui,
        )
    assert history[-1] < 0.05 * history[0]
    assert abs(float(trained[0].k) - K_TRUE) < 0.02
    assert len(fallback_records(caplog)) == 1
    notices = [m["text"] for m in ui.of("on_message") if "reverse mode" in m["text"]]
    assert len(notices) == 1
    assert "solver.diffeqsolve" in notices[0] and "adjoint=solver.adjoint" in notices[0]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def fallback_calls(dataset):
    """One `"auto"` kernel called on two bucket shapes, twice each, and near k = 0.4."""
    short = hk.make_dataset(dataset.experiments[:1], output_channel_names=["y"])
    step = hk.build_bucket_step(
        plain_diffrax_simulate, identity_output, readme_solver(rtol=1e-9), hk.masked_mse, True
    )
    handler, logger = Records(), logging.getLogger(LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        calls = {
            (n, k): step((Rate(jnp.asarray(k)),), bp, 1.0)
            for n, bp in ((2, dataset.bucket_payloads[0]), (1, short.bucket_payloads[0]))
            for k in (0.4, 0.4 - 1e-5, 0.4 + 1e-5)
        }
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return step, calls, fallback_records(handler)


def test_a_fallback_is_decided_and_logged_once_per_kernel_not_per_shape_or_call(fallback_calls):
    step, _, records = fallback_calls
    assert len(records) == 1
    assert step.sensitivity_notice == records[0].getMessage()


def test_the_fallback_gradient_is_the_loss_derivative(fallback_calls):
    _, calls, _ = fallback_calls
    for n in (1, 2):
        fd = (float(calls[n, 0.4 + 1e-5][0]) - float(calls[n, 0.4 - 1e-5][0])) / 2e-5
        assert float(calls[n, 0.4][1][0].k) == pytest.approx(fd, rel=1e-4)


def test_explicit_forward_that_cannot_run_raises_a_value_error_naming_the_fix(dataset):
    step = hk.build_bucket_step(
        plain_diffrax_simulate,
        identity_output,
        readme_solver(sensitivity="forward"),
        hk.masked_mse,
        True,
    )
    with pytest.raises(ValueError, match="sensitivity='forward'") as info:
        step((Rate(jnp.asarray(0.4)),), dataset.bucket_payloads[0], 1.0)
    message = str(info.value)
    assert "solver.diffeqsolve" in message and "adjoint=solver.adjoint" in message
    assert "custom_vjp" in message


def test_auto_with_solver_diffeqsolve_keeps_forward_mode(dataset, caplog):
    seen = []

    def recording_simulate(predictors, ts, covariates, y0, solver):
        seen.append(solver.sensitivity)
        return decay_simulate(predictors, ts, covariates, y0, solver)

    step = hk.build_bucket_step(
        recording_simulate, identity_output, readme_solver(), hk.masked_mse, True
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, grads = step((Rate(jnp.asarray(0.4)),), dataset.bucket_payloads[0], 1.0)
    assert set(seen) == {"forward"}
    assert fallback_records(caplog) == []
    assert step.sensitivity_notice is None
    assert np.isfinite(float(grads[0].k))


def test_a_model_that_fails_in_both_modes_raises_its_own_error(dataset, caplog):
    def broken(predictors, ts, covariates, y0, solver):
        raise RuntimeError("the model's own bug")

    step = hk.build_bucket_step(broken, identity_output, readme_solver(), hk.masked_mse, True)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with pytest.raises(RuntimeError, match="the model's own bug"):
            step((Rate(jnp.asarray(0.4)),), dataset.bucket_payloads[0], 1.0)
    assert fallback_records(caplog) == []


def test_a_model_that_fails_in_reverse_mode_too_raises_that_error_not_forward_modes(
    dataset, caplog
):
    # Plain diffrax fails forward mode for being a custom_vjp; the model's own fault (here a
    # state_to_output that raises) is what reverse mode meets, and what the user must see.
    def broken_output(full):
        raise RuntimeError("the output's own bug")

    step = hk.build_bucket_step(
        plain_diffrax_simulate, broken_output, readme_solver(), hk.masked_mse, True
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with pytest.raises(RuntimeError, match="the output's own bug"):
            step((Rate(jnp.asarray(0.4)),), dataset.bucket_payloads[0], 1.0)
    assert fallback_records(caplog) == []
