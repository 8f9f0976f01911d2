"""Prediction, compile caching and metrics."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_kernels import (
    ChannelObs,
    SolverConfig,
    build_bucket_step,
    compute_metrics,
    ensemble_predictions,
    make_dataset,
    make_experiment,
    masked_mse,
    predict_bucket,
    predict_dataset,
    predict_dense,
)

SOLVER = SolverConfig(diffrax.Tsit5(), rtol=1e-9, atol=1e-11, max_steps=1000, dt0=0.01)
TRUE_K = 0.7


class Decay(eqx.Module):
    k: jax.Array


def _vector_field(t, y, args):
    return -args * y


def _solve(predictors, ts, covariates, y0, solver):
    (p,) = predictors
    # The rate scales with a per-experiment covariate, so rows really differ.
    return solver.diffeqsolve(diffrax.ODETerm(_vector_field), ts, y0, p.k * covariates["g"]).ys


def counted_simulate():
    """A fresh simulate_fn (a new static cache key) that counts how often it is traced."""
    count = {"traces": 0}

    def simulate(predictors, ts, covariates, y0, solver):
        count["traces"] += 1
        return _solve(predictors, ts, covariates, y0, solver)

    return simulate, count


def state_to_output(state):
    return state[:, :1]


def _exact(y0, g, ts, k=TRUE_K):
    return y0 * np.exp(-k * g * np.asarray(ts))


def _experiment(times, g, y0, exp_id, observed=True):
    values = _exact(y0, g, times) if observed else []
    return make_experiment(
        covariates={"g": g},
        channels={"y": ChannelObs(times, values)},
        y0_fn=lambda cov, ch: jnp.array([y0]),
        exp_id=exp_id,
    )


EXPERIMENTS = [
    _experiment([0.0, 0.5, 1.0], 1.0, 2.0, "a"),
    _experiment([0.0, 0.3, 0.9, 1.5, 2.0], 2.0, 1.0, "b"),
    _experiment([0.0, 1.0, 2.0], 0.5, 3.0, "c"),
]


@pytest.fixture(scope="module")
def dataset():
    return make_dataset(EXPERIMENTS, output_channel_names=("y",), bucket_policy="exact")


@pytest.fixture(scope="module")
def predictors():
    return (Decay(jnp.asarray(TRUE_K)),)


SIMULATE, COUNT = counted_simulate()  # shared by most tests, so they share compiled copies


@pytest.fixture(scope="module")
def first_pass(dataset, predictors):
    preds = predict_dataset(predictors, dataset, SIMULATE, state_to_output, SOLVER)
    return preds, COUNT["traces"]


@pytest.fixture(scope="module")
def predictions(first_pass):
    return first_pass[0]


# --- compile caching ---------------------------------------------------------------------


def test_one_trace_per_bucket_shape_and_none_on_a_second_pass(dataset, predictors, first_pass):
    assert len(dataset.bucket_payloads) == 2 and first_pass[1] == 2
    before = COUNT["traces"]
    predict_dataset(predictors, dataset, SIMULATE, state_to_output, SOLVER)
    assert COUNT["traces"] == before


def test_new_parameter_values_and_weak_typed_leaves_do_not_retrace(dataset):
    simulate, count = counted_simulate()
    bp = dataset.bucket_payloads[0]
    for k in (0.1, 0.9):
        predict_bucket((Decay(jnp.asarray(k, jnp.float64)),), bp, simulate, state_to_output, SOLVER)
    weak = jnp.asarray(0.5)  # from a Python float: weakly typed
    assert weak.weak_type
    predict_bucket((Decay(weak),), bp, simulate, state_to_output, SOLVER)
    assert count["traces"] == 1


def test_training_kernel_and_predict_bucket_each_trace_their_own_copy(dataset, predictors):
    simulate, count = counted_simulate()
    bp = dataset.bucket_payloads[0]
    # A small direct adjoint keeps this test's gradient compile cheap.
    solver = SolverConfig(
        diffrax.Tsit5(),
        rtol=1e-6,
        atol=1e-8,
        max_steps=32,
        dt0=0.1,
        adjoint=diffrax.DirectAdjoint(),
    )
    step = build_bucket_step(simulate, state_to_output, solver, masked_mse, (True,))
    step(predictors, bp, 1.0)
    assert count["traces"] == 1
    predict_bucket(predictors, bp, simulate, state_to_output, solver)
    assert count["traces"] == 2  # prediction did not reuse the training trace...
    step(predictors, bp, 1.0)
    predict_bucket(predictors, bp, simulate, state_to_output, solver)
    assert count["traces"] == 2  # ...and neither cache evicted the other


# --- what is predicted -------------------------------------------------------------------


def test_predictions_have_the_observation_shape_in_bucket_order(dataset, predictions):
    assert isinstance(predictions, tuple) and len(predictions) == len(dataset.bucket_payloads)
    for pred, bp in zip(predictions, dataset.bucket_payloads, strict=True):
        assert pred.shape == bp.y_observed.shape
    assert [p.shape[1] for p in predictions] == [3, 5]  # ascending T
    with pytest.raises(ValueError):
        np.stack(predictions)  # buckets differ in T: a tuple, not one array


def test_vmapped_prediction_equals_a_per_experiment_loop(dataset, predictors, predictions):
    bp, pred = dataset.bucket_payloads[0], predictions[0]  # two rows of differing covariates
    assert bp.ts.shape[0] == 2
    for n in range(2):
        cov = {k: v[n] for k, v in bp.covariates.items()}
        one = _solve(predictors, bp.ts[n], cov, bp.y0[n], SOLVER)
        np.testing.assert_allclose(pred[n], state_to_output(one), rtol=1e-12)


def test_true_parameters_reproduce_the_generating_data(dataset, predictions):
    for pred, bp in zip(predictions, dataset.bucket_payloads, strict=True):
        mask = np.asarray(bp.mask)
        np.testing.assert_allclose(
            np.asarray(pred)[mask], np.asarray(bp.y_observed)[mask], rtol=1e-7
        )


def test_padded_buckets_predict_the_real_cells_like_exact_ones(predictors, predictions, dataset):
    padded = make_dataset(EXPERIMENTS, output_channel_names=("y",), max_shapes=1)
    (pred,) = predict_dataset(predictors, padded, SIMULATE, state_to_output, SOLVER)
    (bp,) = padded.bucket_payloads
    real = np.asarray(pred)[np.asarray(bp.mask)]
    exact = np.concatenate(
        [
            np.asarray(p)[np.asarray(b.mask)]
            for p, b in zip(predictions, dataset.bucket_payloads, strict=True)
        ]
    )
    np.testing.assert_allclose(np.sort(real), np.sort(exact), rtol=1e-9)


def test_predict_dense_on_a_shared_grid(dataset, predictors):
    grid = np.linspace(0.0, 2.0, 4)  # same shape as the default test: shared compiles
    out = predict_dense(predictors, dataset, SIMULATE, state_to_output, SOLVER, ts_grid=grid)
    for (ts, pred), bp in zip(out, dataset.bucket_payloads, strict=True):
        assert ts.shape == (bp.ts.shape[0], 4) and pred.shape == (bp.ts.shape[0], 4, 1)
        for n in range(bp.ts.shape[0]):
            expected = _exact(float(bp.y0[n, 0]), float(bp.covariates["g"][n]), grid)
            np.testing.assert_allclose(pred[n, :, 0], expected, rtol=1e-7)


def test_predict_dense_default_spans_each_rows_times(dataset, predictors):
    out = predict_dense(predictors, dataset, SIMULATE, state_to_output, SOLVER, n_points=4)
    for (ts, _), bp in zip(out, dataset.bucket_payloads, strict=True):
        np.testing.assert_allclose(ts[:, 0], bp.ts[:, 0])
        np.testing.assert_allclose(ts[:, -1], bp.ts[:, -1])
        assert ts.shape[1] == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_points": 1}, "`n_points` must be an int >= 2"),
        ({"ts_grid": [[0.0, 1.0]]}, "ts_grid must be a non-empty finite rank-1"),
        ({"ts_grid": [1.0, 0.0]}, "sorted"),
    ],
)
def test_predict_dense_rejects_bad_grids(dataset, predictors, kwargs, match):
    with pytest.raises(ValueError, match=match):
        predict_dense(predictors, dataset, SIMULATE, state_to_output, SOLVER, **kwargs)


def test_ensemble_predictions_average_the_members(dataset):
    members = [(Decay(jnp.asarray(0.5)),), (Decay(jnp.asarray(0.9)),)]
    mean = ensemble_predictions(members, dataset, SIMULATE, state_to_output, SOLVER)
    each = [predict_dataset(m, dataset, SIMULATE, state_to_output, SOLVER) for m in members]
    for b, avg in enumerate(mean):
        np.testing.assert_allclose(avg, (each[0][b] + each[1][b]) / 2, rtol=1e-12)
    with pytest.raises(ValueError, match="members is empty"):
        ensemble_predictions([], dataset, SIMULATE, state_to_output, SOLVER)


# --- metrics -----------------------------------------------------------------------------


def _reference_metrics(offset):
    """Metrics from the source experiments, one Python loop over observations."""
    obs = np.concatenate([np.asarray(e.channels["y"].values) for e in EXPERIMENTS])
    pred = obs + offset
    ss_tot = np.sum((obs - obs.mean()) ** 2)
    mse = np.mean((pred - obs) ** 2)
    return len(obs), mse, np.mean(np.abs(pred - obs)), 1 - len(obs) * mse / ss_tot


@pytest.mark.parametrize("offset", [0.0, 0.25])
def test_metrics_match_a_reference_over_the_source_observations(dataset, predictions, offset):
    shifted = tuple(
        np.where(np.asarray(bp.mask), np.asarray(bp.y_observed) + offset, np.nan)
        for bp in dataset.bucket_payloads
    )  # NaN in unmeasured cells must not leak into any statistic
    m = compute_metrics(shifted, dataset)["y"]
    n, mse, mae, r2 = _reference_metrics(offset)
    assert m.name == "y" and m.n == n == 11
    np.testing.assert_allclose(
        [m.mse, m.rmse, m.mae, m.r2], [mse, np.sqrt(mse), mae, r2], atol=1e-12
    )


def test_metrics_of_true_parameters_are_near_perfect(dataset, predictions):
    m = compute_metrics(predictions, dataset)["y"]
    assert m.mse < 1e-12 and m.r2 > 1 - 1e-10


def test_r2_is_nan_for_a_constant_channel_and_stats_nan_for_an_empty_one():
    flat = [
        make_experiment(
            covariates={"g": 1.0},
            channels={"y": ChannelObs([0.0, 1.0], [1.0, 1.0]), "z": ChannelObs([0.0, 1.0], [])},
            y0_fn=lambda cov, ch: jnp.ones(1),
        )
    ]
    ds = make_dataset(flat, output_channel_names=("y", "z"))
    (bp,) = ds.bucket_payloads
    metrics = compute_metrics((np.zeros(bp.y_observed.shape),), ds)
    assert metrics["y"].mse == pytest.approx(1.0) and np.isnan(metrics["y"].r2)
    assert metrics["z"].n == 0 and np.isnan(metrics["z"].mse) and np.isnan(metrics["z"].r2)


def test_metrics_reject_mismatched_predictions(dataset, predictions):
    with pytest.raises(ValueError, match="holds 1 arrays but dataset has 2 buckets"):
        compute_metrics(predictions[:1], dataset)
    with pytest.raises(ValueError, match=r"predictions\[1\] has shape"):
        compute_metrics((predictions[0], predictions[0]), dataset)


def test_predict_dense_needs_an_integer_point_count(dataset, predictors):
    with pytest.raises(TypeError, match=r"`n_points` must be an int, got 2\.5"):
        predict_dense(predictors, dataset, SIMULATE, state_to_output, SOLVER, n_points=2.5)
