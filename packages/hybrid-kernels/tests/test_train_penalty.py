"""The once-per-step regulariser, wired through the trainer."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import bounded_rate, rate_dataset, rate_train

import hybrid_kernels as hk

BASE = dict(steps=(12,), lr=(0.1,), verbose=False)


@pytest.fixture(scope="module")
def data():
    return rate_dataset()


def latent(predictors, dataset):
    """The bounded rate's output latent at the data's covariates."""
    rate = predictors[0]
    scales = np.asarray(dataset.bucket_payloads[0].covariates["scale"])
    return np.array([float(rate.latent(jnp.asarray([s]))[0]) for s in scales])


@pytest.fixture(scope="module")
def off(data):
    return rate_train(data, hk.OptaxTrainingConfig(**BASE))


def test_zero_weight_is_bit_identical_to_no_penalty(data, off):
    zero = rate_train(data, hk.OptaxTrainingConfig(penalty_weight=(0.0,), **BASE))
    assert list(zero[0]) == list(off[0])
    assert np.array_equal(zero[1][0].inner.b, off[1][0].inner.b)
    assert zero[0].penalties == [0.0] * 12


def test_history_excludes_the_penalty(data, off):
    heavy, _ = rate_train(data, hk.OptaxTrainingConfig(penalty_weight=(1e3,), **BASE))
    assert heavy[0] == off[0][0]  # step 0: same parameters, same data loss
    assert heavy.penalties[0] > 0


def test_penalty_changes_the_trajectory_and_reduces_saturation(data):
    # plain SGD, so the step follows the gradient's size: at saturation the data gradient
    # nearly vanishes, and only the penalty pulls the latent back inside the knee
    sgd = dict(steps=(6,), lr=(0.05,), optimizer=("sgd",), verbose=False)
    off = rate_train(data, hk.OptaxTrainingConfig(**sgd))
    on = rate_train(data, hk.OptaxTrainingConfig(penalty_weight=(10.0,), **sgd))
    assert list(on[0]) != list(off[0])
    knee = bounded_rate().out_scaler.z_knee
    assert np.all(np.abs(latent((bounded_rate(4.0),), data)) > knee)  # the start saturates
    excess_on = np.maximum(np.abs(latent(on[1], data)) - knee, 0).sum()
    excess_off = np.maximum(np.abs(latent(off[1], data)) - knee, 0).sum()
    assert excess_on < 0.5 * excess_off
    assert on[0].penalties[-1] < on[0].penalties[0]


def test_ui_receives_the_penalty_every_step(data):
    ui = hk.RecordingUI()
    history, _ = rate_train(data, hk.OptaxTrainingConfig(penalty_weight=(1.0,), **BASE), ui=ui)
    reported = [e["penalty"] for e in ui.of("on_step_end")]
    assert reported == history.penalties and all(p > 0 for p in reported[:3])


def test_per_phase_weights(data):
    config = hk.OptaxTrainingConfig(steps=(3, 3), lr=(0.1, 0.1), penalty_weight=(0.0, 5.0))
    history, _ = rate_train(data, config)
    assert history.penalties[:3] == [0.0] * 3
    assert all(p > 0 for p in history.penalties[3:])


def test_broadcast_weight_applies_to_every_phase(data):
    config = hk.OptaxTrainingConfig(steps=(2, 2), lr=(0.1, 0.1), penalty_weight=(5.0,))
    history, _ = rate_train(data, config)
    assert all(p > 0 for p in history.penalties)


def test_uncovered_bounded_predictor_with_penalty_on_raises(data):
    start = (bounded_rate(4.0, keys=("temperature",)),)  # not a covariate of the data
    with pytest.raises(ValueError, match="temperature"):
        rate_train(data, hk.OptaxTrainingConfig(penalty_weight=(1.0,), **BASE), start=start)


def test_extra_points_cover_an_uncovered_predictor(data):
    start = (bounded_rate(4.0, keys=("temperature",)),)
    extras = (np.array([[1.0], [1.2]]),)
    config = hk.OptaxTrainingConfig(penalty_weight=(1.0,), penalty_points=extras, **BASE)
    history, _ = rate_train(data, config, start=start)
    assert all(p > 0 for p in history.penalties[:3])


def test_disabled_penalty_needs_no_coverage(data):
    start = (bounded_rate(4.0, keys=("temperature",)),)
    history, _ = rate_train(data, hk.OptaxTrainingConfig(**BASE), start=start)
    assert len(history) == 12


def test_extra_points_count_mismatch_raises(data):
    extras = (np.array([[1.0]]), np.array([[1.0]]))
    config = hk.OptaxTrainingConfig(penalty_weight=(1.0,), penalty_points=extras, **BASE)
    with pytest.raises(ValueError, match="one entry per"):
        rate_train(data, config)


def test_extra_points_column_mismatch_raises(data):
    config = hk.OptaxTrainingConfig(
        penalty_weight=(1.0,), penalty_points=(np.ones((2, 3)),), **BASE
    )
    with pytest.raises(ValueError, match="column"):
        rate_train(data, config)


def test_custom_penalty_fn_is_used_without_recompiling_the_ode_kernels(data, off):
    calls = []

    def l2_on_inner(predictors, points):
        calls.append(points)
        return jnp.sum(predictors[0].inner.b ** 2)

    config = hk.OptaxTrainingConfig(penalty_weight=(1.0,), penalty_fn=l2_on_inner, **BASE)
    history, _ = rate_train(data, config)
    assert calls  # traced into penalty_step
    assert history.penalties[0] == pytest.approx(16.0)  # b = 4 at the start
    assert history[0] == off[0][0]
