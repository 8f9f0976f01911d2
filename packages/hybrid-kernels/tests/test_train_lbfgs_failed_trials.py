"""A line search's trial whose solve fails is a rejected trial, not the end of the run.

The field's recipe, Adam then L-BFGS, with `throw=True` (the default) and a `max_steps` that
the data's own parameters respect but a long trial step does not: `y' = -e^θ y + a sin t`,
whose solve needs more steps the larger `θ` is. From a slow decay (`θ = -3`) L-BFGS's first
quasi-Newton steps are long, a line-search trial lands near `θ = 9` and runs out of
`max_steps`, and before this was handled that trial's error ended the run inside the
optimiser's update, losing every step before it. Now the trial is NaN, the line search
shrinks its step, and every parameter the run keeps still solved under `throw=True`.

Both habits are covered: the trainer with `diffrax.diffeqsolve` called directly (whose own
`throw=True` the trainer cannot switch off), and a hand-written optax loop with
`solver.diffeqsolve`.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Forced, forced_simulate, identity_output, lbfgs_loop

import hybrid_kernels as hk

THETA, A = 2.0, 1.0
MAX_STEPS = 90  # the data's θ = 2 needs about 70 steps, θ = 2.6 about 100
ADAM_STEPS, LBFGS_STEPS = 30, 8
START = -3.0  # a slow decay: the first quasi-Newton steps are long
SOLVER = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-6, atol=1e-8, max_steps=MAX_STEPS, dt0=None)


SEEN: list[bool] = []


def _failed_trials(ys):
    # Records whether each solve failed (a trial's failed solve leaves NaN states), so that a
    # test can check it provoked one.
    jax.debug.callback(lambda bad: SEEN.append(bool(np.any(bad))), ~jnp.isfinite(ys).all())
    return ys


def library_simulate(predictors, ts, covariates, y0, solver):
    return _failed_trials(forced_simulate(predictors, ts, covariates, y0, solver))


def plain_simulate(predictors, ts, covariates, y0, solver):
    """diffrax called directly, `throw=True` by its own default."""
    (m,) = predictors
    ys = diffrax.diffeqsolve(
        diffrax.ODETerm(m.field()),
        diffrax.Tsit5(),
        ts[0],
        ts[-1],
        None,
        y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=MAX_STEPS,
    ).ys
    return _failed_trials(ys)


@pytest.fixture(scope="module")
def dataset():
    truth = (Forced(jnp.asarray(THETA), jnp.asarray(A)),)
    rng = np.random.default_rng(0)
    exps = []
    for i, y0 in enumerate((0.5, 1.2, 2.0)):
        ts = np.concatenate([[0.0], np.sort(rng.uniform(0.0, 5.0, 9))])
        ys = np.asarray(library_simulate(truth, jnp.asarray(ts), {}, jnp.asarray([y0]), SOLVER))
        exps.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, ys[:, 0], 0.01)},
                y0_fn=lambda c, ch, y0=y0: np.asarray([y0]),
                exp_id=f"rig{i}",
            )
        )
    return hk.make_dataset(exps, output_channel_names=["y"])


def fit(dataset, simulate_fn, steps=(ADAM_STEPS, LBFGS_STEPS), start=START, a=0.0):
    config = hk.OptaxTrainingConfig(
        steps=steps,
        lr=(0.05, 1.0)[-len(steps) :],
        optimizer=("adam", "lbfgs")[-len(steps) :],
        verbose=False,
    )
    SEEN.clear()
    return hk.train_with_optax(
        (Forced(jnp.asarray(start), jnp.asarray(a)),),
        dataset,
        config,
        simulate_fn=simulate_fn,
        state_to_output=identity_output,
        solver=SOLVER,
        key=jax.random.key(0),
    )


# `solver.diffeqsolve` takes the same path (the hand-written loop below runs it), and costs
# another compile of the whole run.
@pytest.mark.slow
def test_a_trial_whose_solve_fails_is_rejected_and_the_run_goes_on(dataset):
    simulate_fn = plain_simulate
    history, (fitted,) = fit(dataset, simulate_fn)
    assert any(SEEN), "no line-search trial failed: the test no longer provokes one"
    assert len(history) == ADAM_STEPS + LBFGS_STEPS
    assert np.all(np.isfinite(history)) and history.bad_steps == []
    # L-BFGS still descended from where Adam left it.
    assert history[-1] < 0.5 * history[ADAM_STEPS - 1]
    # What the run kept solves under throw=True: scoring it raises nothing.
    objective = hk.build_objective(
        dataset, simulate_fn=simulate_fn, state_to_output=identity_output, solver=SOLVER
    )
    assert np.isfinite(float(objective((fitted,))))


def test_a_failed_solve_at_the_parameters_the_run_holds_still_raises(dataset):
    # θ = 3: the solve fails at the start itself, which no line search chose.
    with pytest.raises(eqx.EquinoxRuntimeError, match="rig0"):
        fit(dataset, library_simulate, steps=(2,), start=3.0, a=A)


def _objectives(dataset, solver=SOLVER):
    loud = hk.build_objective(
        dataset, simulate_fn=library_simulate, state_to_output=identity_output, solver=solver
    )
    return loud, loud.for_trials()


def test_for_trials_equals_the_objective_where_every_solve_succeeds(dataset):
    loud, trial = _objectives(dataset)
    at = (Forced(jnp.asarray(1.5), jnp.asarray(0.5)),)
    assert float(trial(at)) == float(loud(at))


def test_for_trials_is_nan_where_a_solve_fails_and_the_objective_raises(dataset):
    loud, trial = _objectives(dataset)
    at = (Forced(jnp.asarray(3.0), jnp.asarray(0.5)),)
    assert np.isnan(float(trial(at)))
    with pytest.raises(eqx.EquinoxRuntimeError):
        float(loud(at))


def test_for_trials_of_a_throw_false_objective_is_that_objective(dataset):
    loud, trial = _objectives(dataset, dataclasses.replace(SOLVER, throw=False))
    assert trial.body is loud.body


def test_a_hand_written_lbfgs_loop_with_for_trials_survives_a_failed_trial(dataset):
    # The custom-loop page's L-BFGS loop, from the start whose first steps are long.
    objective, trials = _objectives(dataset)
    SEEN.clear()
    start = (Forced(jnp.asarray(START), jnp.asarray(0.0)),)
    params, values = lbfgs_loop(trials, start, LBFGS_STEPS)
    assert any(SEEN), "no line-search trial failed: the test no longer provokes one"
    assert np.all(np.isfinite(values)) and values[-1] < 0.01 * values[0]
    assert np.isfinite(float(objective(params)))
