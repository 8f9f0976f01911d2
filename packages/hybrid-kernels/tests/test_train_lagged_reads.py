"""The fused one-bucket step, as the loop drives it (issue 21, item 3).

- Reads trail the newest step by one, so the host's work overlaps the step in flight where
  dispatch is asynchronous; a stop, a non-finite streak or a failed solve found a step late
  puts the run back to the step it happened at, so the lag changes nothing a run does.
- The carry stays flat between fused steps; a small bucket is compiled into the program as
  constants, a large one stays an argument, and both train alike.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, decay_simulate, identity_output, osc_dataset, quiet, tiny_solver, train

import hybrid_kernels as hk
from hybrid_kernels._training import _fused, _loop

TIMES = np.linspace(0.0, 2.0, 6)


@pytest.fixture(scope="module")
def one_bucket(oscillator):
    return osc_dataset(oscillator)


def _decay(exp_id, scale=1.0):
    return hk.make_experiment(
        covariates={"scale": scale},
        channels={"y": hk.ChannelObs(TIMES, np.exp(-0.7 * TIMES))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=exp_id,
    )


def _decay_train(dataset, solver, **config):
    return hk.train_with_optax(
        (Rate(jnp.asarray(0.5)),),
        dataset,
        hk.OptaxTrainingConfig(verbose=False, **config),
        simulate_fn=decay_simulate,
        state_to_output=identity_output,
        solver=solver,
        key=jax.random.key(0),
    )


@pytest.fixture
def read_pattern(monkeypatch):
    """`(ui, seen)`: `seen` gets `(step, steps dispatched so far)` as each step is reported."""
    dispatched, seen = [], []
    original = _loop.take_step

    def counting(*args, **kwargs):
        dispatched.append(1)
        return original(*args, **kwargs)

    class UI(hk.TrainingUI):
        def on_step_end(self, *, step, **kwargs):
            seen.append((step, len(dispatched)))

    monkeypatch.setattr(_loop, "take_step", counting)
    return UI(), seen


def test_reads_trail_the_newest_step_by_one(oscillator, one_bucket, read_pattern):
    ui, seen = read_pattern
    train(oscillator, one_bucket, quiet(steps=(6,)), ui=ui)
    # step n is reported once step n + 1 is in flight; the last step at the phase end
    assert seen == [(n, n + 2) for n in range(5)] + [(5, 6)]


def test_a_run_with_a_hook_reads_every_step_before_the_next(oscillator, one_bucket, read_pattern):
    ui, seen = read_pattern
    hook = lambda step, predictors, opt_state: None  # noqa: E731
    train(oscillator, one_bucket, quiet(steps=(4,)), ui=ui, hooks=hook)
    assert seen == [(n, n + 1) for n in range(4)]


def test_a_run_with_a_hook_reads_every_step_whatever_log_every(
    oscillator, one_bucket, read_pattern
):
    ui, seen = read_pattern
    hook = lambda step, predictors, opt_state: None  # noqa: E731
    train(oscillator, one_bucket, quiet(steps=(4,), log_every=3), ui=ui, hooks=hook)
    assert seen == [(n, n + 1) for n in range(4)]


def test_a_hook_never_sees_the_parameters_of_a_failed_step():
    # sgd at 1e38 throws the rate far out after the first step, and the next solve runs out of
    # steps (`throw=True`). A quiet step's update is applied before its checks are read, so a
    # hook between the steps must wait for the read: it sees the parameters the run keeps, and
    # the run stops with the solver's error at the step that failed.
    data = hk.make_dataset([_decay("e0"), _decay("e1", 1.2)], output_channel_names=["y"])
    seen = []

    def hook(step, predictors, opt_state):
        seen.append((step, float(predictors[0].k)))

    with pytest.raises(
        eqx.EquinoxRuntimeError, match=r"the solve failed for experiment\(s\) \['e0', 'e1'\]"
    ):
        hk.train_with_optax(
            (Rate(jnp.asarray(0.5)),),
            data,
            hk.OptaxTrainingConfig(
                steps=(8,), lr=(1e38,), optimizer=("sgd",), max_bad_steps=3, log_every=10,
                verbose=False,
            ),
            simulate_fn=decay_simulate,
            state_to_output=identity_output,
            solver=tiny_solver(max_steps=64),
            key=jax.random.key(0),
            hooks=hook,
        )  # fmt: skip
    # step 1 is applied (a finite, huge rate); step 2's solve fails and ends the run there
    assert [step for step, _ in seen] == [1] and np.isfinite(seen[0][1])


def test_a_patience_stop_found_a_step_late_ends_where_an_unlagged_run_ends(
    oscillator, one_bucket, request
):
    config = quiet(steps=(10, 5), lr=(0.0, 0.05), reset_optimiser_state=(False, True), patience=3)
    lagged, a = train(oscillator, one_bucket, config)
    request.getfixturevalue("no_lag")
    plain, b = train(oscillator, one_bucket, config)
    assert lagged.phase_starts == plain.phase_starts == [0, 4]
    assert list(lagged) == list(plain)
    assert float(a[0].omega) == float(b[0].omega)


def test_a_non_finite_streak_found_a_step_late_keeps_the_last_good_parameters(request):
    # sgd at 1e38 overflows the rate: every later step is non-finite and none is applied
    data = hk.make_dataset([_decay("e0"), _decay("e1", 1.2)], output_channel_names=["y"])
    solver = tiny_solver(throw=False, max_steps=64)
    config = dict(steps=(8,), lr=(1e38,), optimizer=("sgd",), max_bad_steps=3)
    with pytest.raises(hk.NonFiniteTrainingError) as lagged:
        _decay_train(data, solver, **config)
    request.getfixturevalue("no_lag")
    with pytest.raises(hk.NonFiniteTrainingError) as plain:
        _decay_train(data, solver, **config)
    assert lagged.value.step == plain.value.step
    assert float(lagged.value.predictors[0].k) == float(plain.value.predictors[0].k)
    np.testing.assert_array_equal(lagged.value.history, plain.value.history)  # NaN == NaN
    assert lagged.value.history.bad_steps == plain.value.history.bad_steps


def test_the_loop_rebuilds_a_flat_carry_once_when_it_is_read(oscillator, one_bucket):
    _, (trained,) = train(oscillator, one_bucket, quiet(steps=(3,), restore_best=False))
    tree = _loop.new_carry((trained,), None)
    state = _loop.LoopState(raw=_fused.FlatCarry(*_fused.fj.flatten(tree)))
    rebuilt = state.carry
    assert float(rebuilt.predictors[0].omega) == float(trained.omega)
    assert state.raw is rebuilt  # rebuilt once, then kept


def test_a_large_bucket_stays_an_argument_and_trains_like_a_closed_one(
    oscillator, one_bucket, monkeypatch
):
    closed, a = train(oscillator, one_bucket, quiet(steps=(5,)))
    monkeypatch.setattr(_fused, "_CLOSED_BUCKET_BYTES", 0)
    assert not _fused._closable(one_bucket.bucket_payloads[0])
    argument, b = train(oscillator, one_bucket, quiet(steps=(5,)))
    np.testing.assert_allclose(list(argument), list(closed), rtol=1e-12)
    np.testing.assert_allclose(float(b[0].omega), float(a[0].omega), rtol=1e-12)


def test_a_small_bucket_is_closed_into_the_program(one_bucket):
    assert _fused._closable(one_bucket.bucket_payloads[0])
