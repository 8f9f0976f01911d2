"""The trainer under SolverConfig(throw=False): failed experiments are named, and a step in
which every experiment fails is skipped, never recorded as a perfect loss or kept as the best."""

import io
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Rate, decay_simulate, identity_output, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels._training.state import TrainingState, load_training_state, save_training_state

# A healthy solve needs about 20 steps; a rate of 1e36 or a growing exponential never finishes.
SOLVER = tiny_solver(throw=False, max_steps=64)
TIMES = np.linspace(0.0, 2.0, 6)
OPTS = dict(output_channel_names=["y"])


def experiment(exp_id, scale=1.0):
    return hk.make_experiment(
        covariates={"scale": scale},
        channels={"y": hk.ChannelObs(TIMES, np.exp(-0.7 * TIMES))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=exp_id,
    )


@pytest.fixture(scope="module")
def healthy():
    return hk.make_dataset([experiment(f"e{i}", 1.0 + 0.1 * i) for i in range(3)], **OPTS)


@pytest.fixture(scope="module")
def one_exploding():
    # dy/dt = +1500 y: the solve cannot finish. Same bucket shape as `healthy`.
    exps = [experiment("e0"), experiment("exploding", -3000.0), experiment("e2", 1.2)]
    return hk.make_dataset(exps, **OPTS)


def train(dataset, *, start=0.5, **config):
    config.setdefault("verbose", False)
    ui, val_dataset = config.pop("ui", None), config.pop("val_dataset", None)
    return hk.train_with_optax(
        (Rate(jnp.asarray(start)),),
        dataset,
        hk.OptaxTrainingConfig(**config),
        simulate_fn=decay_simulate,
        state_to_output=identity_output,
        solver=SOLVER,
        key=jax.random.key(0),
        ui=ui,
        val_dataset=val_dataset,
    )


# --- every experiment fails ----------------------------------------------------------------


@pytest.mark.parametrize("restore_best", [True, False])
def test_a_step_where_every_experiment_fails_is_skipped_not_scored_zero(healthy, restore_best):
    # sgd at lr=1e38: step 0 sends the rate to ~1e36, after which no solve can finish.
    history, _ = train(
        healthy, steps=(4,), lr=(1e38,), optimizer=("sgd",), restore_best=restore_best
    )
    assert math.isfinite(history[0]) and history[0] > 0
    assert all(math.isnan(v) for v in history[1:])
    assert history.bad_steps == [1, 2, 3]
    assert history.best_step == 0 and history.best_loss == history[0]


def test_the_exploding_rate_is_not_returned_as_the_best_fit(healthy):
    _, best = train(healthy, steps=(4,), lr=(1e38,), optimizer=("sgd",))
    assert float(best[0].k) == 0.5  # step 0's pre-update parameters


def test_a_run_where_every_experiment_keeps_failing_stops_as_non_finite(healthy):
    with pytest.raises(hk.NonFiniteTrainingError, match="no experiment that solved") as info:
        train(healthy, steps=(8,), lr=(1e38,), optimizer=("sgd",), max_bad_steps=3)
    assert float(info.value.best_predictors[0].k) == 0.5


def test_a_validation_score_where_every_experiment_fails_is_nan_not_zero(healthy):
    # lr 0 keeps the rate at 1e36: every validation solve fails.
    history, _ = train(healthy, start=1e36, steps=(1,), lr=(0.0,), val_dataset=healthy)
    assert history.val and all(math.isnan(score) for _, score in history.val)


# --- some experiments fail -----------------------------------------------------------------


@pytest.fixture(scope="module")
def exploding_run(one_exploding):
    ui = hk.RecordingUI()
    history, _ = train(one_exploding, steps=(3,), lr=(0.01,), ui=ui)
    return history, ui


def test_the_history_names_the_failed_experiment_at_every_step(exploding_run):
    history, _ = exploding_run
    assert history.failed == {0: ("exploding",), 1: ("exploding",), 2: ("exploding",)}
    assert history.bad_steps == []


def test_the_ui_gets_one_failure_event_per_step_naming_the_experiment(exploding_run):
    _, ui = exploding_run
    events = ui.of("on_failed_experiments")
    assert [e["step"] for e in events] == [0, 1, 2]
    assert all(e["exp_ids"] == ("exploding",) for e in events)


def test_a_healthy_run_reports_no_failures(healthy):
    ui = hk.RecordingUI()
    history, _ = train(healthy, steps=(2,), lr=(0.01,), ui=ui)
    assert history.failed == {}
    assert ui.count("on_failed_experiments") == 0


def test_log_ui_names_a_failing_experiment_once_while_the_set_is_unchanged(one_exploding):
    stream = io.StringIO()
    train(one_exploding, steps=(3,), lr=(0.01,), ui=hk.LogUI(stream=stream))
    lines = [line for line in stream.getvalue().splitlines() if "failed to solve" in line]
    assert len(lines) == 1
    assert "'exploding'" in lines[0] and "step 1" in lines[0]


def test_log_ui_names_the_failures_again_when_the_set_changes():
    stream = io.StringIO()
    ui = hk.LogUI(stream=stream)
    for step, ids in enumerate([("a",), ("a",), ("a", "b"), ("a", "b")]):
        ui.on_failed_experiments(step=step, phase_idx=0, exp_ids=ids)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "'b'" in lines[1]


def test_failed_ids_survive_a_save_and_load(tmp_path):
    predictors = (Rate(jnp.asarray(0.5)),)
    opt_state = optax.sgd(0.1).init(predictors)
    state = TrainingState(
        predictors=predictors,
        opt_state=opt_state,
        step=2,
        phase=0,
        phase_step=2,
        key=jax.random.key(0),
        best_predictors=predictors,
        best_loss=1.0,
        best_step=0,
        history=[1.0, 2.0],
        penalties=[0.0, 0.0],
        val_history=[],
        bad_steps=[],
        failed={1: ("exploding", "e2")},
    )
    path = tmp_path / "state.npz"
    save_training_state(path, state)
    loaded = load_training_state(path, predictors=predictors, opt_state=opt_state)
    assert loaded.failed == {1: ("exploding", "e2")}
    np.testing.assert_array_equal(loaded.history, [1.0, 2.0])


# --- throw=True: the error names the experiment ---------------------------------------------

THROWING = tiny_solver(throw=True, max_steps=64)


def test_a_throwing_bucket_step_names_the_failed_row(one_exploding):
    step = hk.build_bucket_step(decay_simulate, identity_output, THROWING, hk.masked_mse, True)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"row\(s\) \[1\] of bucket N=3, T=6") as info:
        step((Rate(jnp.asarray(0.5)),), one_exploding.bucket_payloads[0], 1.0)
    assert "maximum number of solver steps" in str(info.value)
    assert info.value.rows == (1,)


def test_a_throwing_training_run_names_the_failed_experiment(one_exploding):
    with pytest.raises(
        eqx.EquinoxRuntimeError,
        match=r"train_with_optax: the solve failed for experiment\(s\) "
        r"\['exploding'\]",
    ) as info:
        hk.train_with_optax(
            (Rate(jnp.asarray(0.5)),),
            one_exploding,
            hk.OptaxTrainingConfig(steps=(1,), lr=(0.01,), verbose=False),
            simulate_fn=decay_simulate,
            state_to_output=identity_output,
            solver=THROWING,
            key=jax.random.key(0),
        )
    assert info.value.exp_ids == ("exploding",)
