"""Under `throw=False` a line search's trials are scored on the experiments its step solved.

`y' = -e^θ y + a sin t` on three rigs under a `max_steps` that binds: two short rigs (t to 5)
made with θ = 2.3 and a long one (t to 20) with θ = 1.5, whose solve runs out of steps above
θ ≈ 2.05. The fit of all three lies at θ ≈ 2.2, where the long rig fails. Scored as a step is
(failed rows masked out), a trial there leaves the long rig's loss out and looks like a
descent: Adam then L-BFGS settled at θ = 2.3 with a best loss of 1.7e-7 on the two short
rigs, and L-BFGS alone (run here) lost the long rig from its step 8 on. Scored on the rows its
step solved, such a trial is NaN, as under `throw=True`, and the run keeps every experiment
it started with, stopping at the edge of the region where the long rig fails."""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Forced, forced_simulate, identity_output

import hybrid_kernels as hk
from hybrid_kernels._objective import _failed_rows

SOLVER = hk.SolverConfig(
    diffrax.Tsit5(), rtol=1e-6, atol=1e-8, max_steps=250, dt0=None, throw=False
)
RIGS = [(2.3, 5.0, 0.5), (2.3, 5.0, 1.2), (1.5, 20.0, 2.0)]  # (θ, last time, y0)
LBFGS_STEPS = 12


def at(theta, a=1.0):
    return (Forced(jnp.asarray(theta), jnp.asarray(a)),)


@pytest.fixture(scope="module")
def dataset():
    rng = np.random.default_rng(0)
    unbounded = dataclasses.replace(SOLVER, max_steps=4096)
    exps = []
    for i, (theta, last, y0) in enumerate(RIGS):
        ts = np.concatenate([[0.0], np.sort(rng.uniform(0.0, last, 12))])
        ys = np.asarray(
            forced_simulate(at(theta), jnp.asarray(ts), {}, jnp.asarray([y0]), unbounded)
        )
        exps.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, ys[:, 0], 0.01)},
                y0_fn=lambda c, ch, y0=y0: np.asarray([y0]),
                exp_id=f"rig{i}",
            )
        )
    return hk.make_dataset(exps, output_channel_names=["y"])


@pytest.fixture(scope="module")
def objective(dataset):
    return hk.build_objective(
        dataset, simulate_fn=forced_simulate, state_to_output=identity_output, solver=SOLVER
    )


@pytest.fixture(scope="module")
def lbfgs_run(dataset):
    config = hk.OptaxTrainingConfig(
        steps=(LBFGS_STEPS,), lr=(1.0,), optimizer=("lbfgs",), verbose=False
    )
    return hk.train_with_optax(
        at(-3.0, 0.0),
        dataset,
        config,
        simulate_fn=forced_simulate,
        state_to_output=identity_output,
        solver=SOLVER,
        key=jax.random.key(0),
    )


def _no_rows(objective):
    return tuple(jnp.zeros(bp.ts.shape[:1], bool) for bp in objective.payloads)


def _long_rig(dataset):
    return tuple(jnp.asarray([i == "rig2" for i in ids]) for ids in dataset.exp_ids)


def test_the_long_rig_fails_where_the_fit_of_all_three_lies(objective):
    # The premise: past θ ≈ 2.05 the throw=False objective drops the long rig and falls.
    assert float(objective(at(2.3))) < 0.1 * float(objective(at(2.0)))


def test_a_trial_at_which_a_solved_experiment_fails_is_nan(objective):
    assert np.isnan(float(objective._trials_on(_no_rows(objective))(at(2.3))))


def test_a_trial_where_every_row_solves_is_the_objective(objective):
    trials = objective._trials_on(_no_rows(objective))
    assert float(trials(at(1.8))) == float(objective(at(1.8)))


def test_rows_that_failed_at_the_start_are_left_out_of_every_trial(objective, dataset):
    # Started where the long rig fails: trials are scored on the short rigs, as the step was.
    trials = objective._trials_on(_long_rig(dataset))
    assert float(trials(at(2.3))) == float(objective(at(2.3)))
    # Where it solves again it is still left out: the value is the short rigs' alone.
    assert np.isfinite(float(trials(at(1.8))))
    assert float(trials(at(1.8))) != float(objective(at(1.8)))


def test_lbfgs_keeps_every_experiment_solving(lbfgs_run, objective):
    history, (fitted,) = lbfgs_run
    assert history.failed == {}
    assert np.all(np.isfinite(history)) and history[-1] < 0.05 * history[0]
    # Its best loss is the objective of all three rigs there, not of the two short ones.
    assert float(objective((fitted,))) == pytest.approx(history.best_loss, rel=1e-9)
    assert float(fitted.theta) < 2.1


def _custom_lbfgs(objective, start, *, anchored):
    """The custom-loop guide's L-BFGS loop; its trials anchored at each step's start or not."""
    opt = optax.lbfgs()

    @eqx.filter_jit
    def step(params, state):
        trials = objective.for_trials(at=params) if anchored else objective.for_trials()
        value, grad = optax.value_and_grad_from_state(trials)(params, state=state)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=trials)
        return optax.apply_updates(params, updates), state

    params, state = start, opt.init(start)
    for _ in range(LBFGS_STEPS):
        params, state = step(params, state)
    return params


def test_trials_anchored_at_a_point_leave_out_the_rows_failing_there(objective):
    trials = objective.for_trials(at=at(2.3))  # the long rig fails at 2.3
    assert float(trials(at(2.3))) == float(objective(at(2.3)))
    assert np.isnan(float(objective.for_trials(at=at(1.8))(at(2.3))))


def test_a_custom_lbfgs_loop_with_anchored_trials_keeps_every_experiment(objective, lbfgs_run):
    (fitted,) = _custom_lbfgs(objective, at(-3.0, 0.0), anchored=True)
    assert not any(bool(f.any()) for f in _failed_rows(objective, (fitted,)))
    assert float(fitted.theta) < 2.1
    _, (trained,) = lbfgs_run
    assert float(fitted.theta) == pytest.approx(float(trained.theta), rel=1e-6)


@pytest.mark.slow
def test_a_custom_lbfgs_loop_without_an_anchor_walks_into_the_failing_region(objective):
    (fitted,) = _custom_lbfgs(objective, at(-3.0, 0.0), anchored=False)
    assert bool(_failed_rows(objective, (fitted,))[0].any())
