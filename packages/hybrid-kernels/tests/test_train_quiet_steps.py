"""One-program steps of a `throw=True` solve, traced without host callbacks (`_quiet`).

On CPU a program holding host callbacks runs synchronously, so the trainer's one-bucket step
is traced with equinox's checks as NaN poisoning instead, and a step whose report may hide a
failed check (a row not finite, a non-finite step) is replayed with the callbacks. A run then
raises and records exactly what a run of callback-holding steps does.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, decay_simulate, identity_output, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels._training import _fused, _loop, _reads, _setup

TIMES = np.linspace(0.0, 2.0, 6)
THROWING = tiny_solver(throw=True, max_steps=64)


def _data():
    exp = hk.make_experiment(
        covariates={"scale": 1.0},
        channels={"y": hk.ChannelObs(TIMES, np.exp(-0.7 * TIMES))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id="decay",
    )
    return hk.make_dataset([exp], output_channel_names=["y"])


def _nan_above(limit):
    """A decay whose predictions are NaN once its rate passes `limit` (the solve succeeds)."""

    def simulate(predictors, ts, covariates, y0, solver):
        (rate,) = predictors

        def vf(t, y, args):
            return -rate() * covariates["scale"] * y

        ys = diffrax.diffeqsolve(
            diffrax.ODETerm(vf),
            solver.solver,
            t0=ts[0],
            t1=ts[-1],
            dt0=solver.dt0,
            y0=y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=solver.rtol, atol=solver.atol),
            adjoint=solver.adjoint,
            max_steps=solver.max_steps,
        ).ys
        return jnp.where(rate() > limit, jnp.nan, ys)

    return simulate


def _train(simulate, ui=None, **config):
    config.setdefault("verbose", False)
    return hk.train_with_optax(
        (Rate(jnp.asarray(0.5)),),
        _data(),
        hk.OptaxTrainingConfig(**config),
        simulate_fn=simulate,
        state_to_output=identity_output,
        solver=THROWING,
        key=jax.random.key(0),
        ui=ui,
    )


@pytest.fixture
def loud(monkeypatch):
    """The next run's steps hold the solver's callbacks, as before quiet steps existed."""
    for module in (_loop, _setup):  # the steps, and the warm-up step before them
        monkeypatch.setattr(module, "quiet_step", lambda *args: False)


@pytest.fixture
def programs(monkeypatch):
    """The HLO text of every fused step program the next run dispatches."""
    texts = []
    original = _fused.fj.call

    def spy(run, static, dynamic, *args, wait):
        texts.append(run.lower(static, dynamic, *args).as_text())
        return original(run, static, dynamic, *args, wait=wait)

    monkeypatch.setattr(_fused.fj, "call", spy)
    return texts


@pytest.fixture
def replays(monkeypatch):
    """The steps the next run replays with the callbacks."""
    seen = []
    original = _reads._replay

    def spy(setup, st, p):
        seen.append(p.step)
        return original(setup, st, p)

    monkeypatch.setattr(_reads, "_replay", spy)
    return seen


class _Steps(hk.TrainingUI):
    def __init__(self):
        self.reported = []

    def on_step_end(self, *, step, loss, **kwargs):
        self.reported.append((step, loss))


def test_a_one_bucket_throwing_step_holds_no_host_callbacks(programs):
    _train(decay_simulate, steps=(3,), lr=(0.05,))
    assert programs and not any("callback" in text for text in programs)


def test_with_quiet_steps_off_the_step_holds_the_solvers_callbacks(programs, loud):
    _train(decay_simulate, steps=(3,), lr=(0.05,))
    assert programs and all("callback" in text for text in programs)


def test_a_healthy_run_replays_no_step_and_matches_a_loud_run(replays, request):
    history, (fit,) = _train(decay_simulate, steps=(20,), lr=(0.05,))
    assert replays == []
    request.getfixturevalue("loud")
    loud_history, (loud_fit,) = _train(decay_simulate, steps=(20,), lr=(0.05,))
    np.testing.assert_allclose(list(history), list(loud_history), rtol=1e-12)
    np.testing.assert_allclose(float(fit.k), float(loud_fit.k), rtol=1e-12)


def _failing_run(ui):
    # sgd at 1e4 throws the rate to about 3000 at the second step: that solve needs more than
    # max_steps=64 steps, so a throwing run fails there, after one good step.
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        _train(decay_simulate, ui=ui, steps=(6,), lr=(1e4,), optimizer=("sgd",))
    return info.value


def test_a_solve_failing_mid_run_raises_at_its_step_what_a_loud_run_raises(replays, request):
    quiet_ui = _Steps()
    error = _failing_run(quiet_ui)
    assert replays == [1]
    request.getfixturevalue("loud")
    request.getfixturevalue("no_lag")  # so that the loud run reads its good step too
    loud_ui = _Steps()
    loud_error = _failing_run(loud_ui)
    assert type(error) is type(loud_error)
    assert str(error) == str(loud_error)
    assert "maximum number of solver steps" in str(error)
    assert error.exp_ids == ("decay",)
    assert quiet_ui.reported == loud_ui.reported
    assert [step for step, _ in quiet_ui.reported] == [0]


def _non_finite_run():
    # Adam moves the rate from 0.5 past 0.52 within a few steps; from then on every step is
    # non-finite (and skipped), until max_bad_steps stops the run.
    with pytest.raises(hk.NonFiniteTrainingError) as info:
        _train(_nan_above(0.52), steps=(30,), lr=(0.01,), max_bad_steps=5)
    return info.value


def test_non_finite_steps_are_recorded_as_a_loud_run_records_them(replays, request):
    error = _non_finite_run()
    request.getfixturevalue("loud")
    loud_error = _non_finite_run()
    assert error.step == loud_error.step
    assert error.history.bad_steps == loud_error.history.bad_steps
    assert len(error.history.bad_steps) == 5
    np.testing.assert_array_equal(error.history, loud_error.history)  # NaN == NaN
    assert float(error.predictors[0].k) == float(loud_error.predictors[0].k)


def test_after_max_replays_that_raise_nothing_steps_hold_callbacks_again(replays, programs):
    _non_finite_run()
    assert len(replays) == _reads.MAX_REPLAYS
    # the steps after the last replay were dispatched with the callbacks
    assert "callback" in programs[-1] and "callback" not in programs[0]
