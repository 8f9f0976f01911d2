"""Bad data is refused with an error naming the experiment and the field, never stored silently."""

import numpy as np
import pytest

import hybrid_kernels as hk


def exp(exp_id="e1", channels=None, covariates=None, y0=(1.0,)):
    return hk.make_experiment(
        covariates={"c": 1.0} if covariates is None else covariates,
        channels=channels or {"a": hk.ChannelObs([0.0, 1.0], [1.0, 2.0])},
        y0_fn=lambda cov, ch: np.asarray(y0),
        exp_id=exp_id,
    )


def dataset(experiment, names=("a",), dtype="float32"):
    return hk.make_dataset([experiment], output_channel_names=list(names), dtype=dtype)


# --- channels of one experiment in different float dtypes ------------------------------------


def test_mixed_dtype_channels_keep_every_distinct_time_and_value():
    a = hk.ChannelObs(np.array([0.0, 1.0, 1.0 + 1e-9]), np.array([1.0, 2.0, 3.0]))
    b = hk.ChannelObs(np.array([0.0], np.float32), np.array([5.0], np.float32))
    bp = dataset(exp(channels={"a": a, "b": b}), ("a", "b"), "float64").bucket_payloads[0]
    assert int(bp.n_obs) == 4
    observed = np.asarray(bp.y_observed[0, :, 0])[np.asarray(bp.mask[0, :, 0])]
    np.testing.assert_array_equal(observed, [1.0, 2.0, 3.0])


def test_mixed_dtype_channels_still_share_a_row_for_one_decimal_time():
    a = hk.ChannelObs(np.array([0.0, 0.1]), np.array([1.0, 2.0]))
    b = hk.ChannelObs(np.array([0.1], np.float32), np.array([5.0], np.float32))
    bp = dataset(exp(channels={"a": a, "b": b}), ("a", "b"), "float64").bucket_payloads[0]
    assert bp.ts.shape == (1, 2)
    assert int(bp.n_obs) == 3


# --- values the storage dtype cannot hold --------------------------------------------------


@pytest.mark.parametrize(
    ("experiment", "match"),
    [
        (
            lambda: exp(channels={"a": hk.ChannelObs([0.0, 1e300], [1.0, 2.0])}),
            r"'e1' channel 'a' `ts` holds .*1e\+300.* becomes inf in float32",
        ),
        (
            lambda: exp(channels={"a": hk.ChannelObs([0.0, 1.0], [1.0, -1e300])}),
            r"'e1' channel 'a' `values` .* becomes inf",
        ),
        (
            lambda: exp(channels={"a": hk.ChannelObs([0.0, 1.0], [1.0, 2.0], 1e300)}),
            r"'e1' channel 'a' `variance` .* becomes inf",
        ),
        (
            lambda: exp(channels={"a": hk.ChannelObs([0.0, 1.0], [1.0, 2.0], 1e-300)}),
            r"'e1' channel 'a' `variance` .*1e-300.* becomes 0 in float32",
        ),
        (lambda: exp(y0=(1e300,)), r"'e1' `y0` .* becomes inf"),
        (lambda: exp(covariates={"c": np.float64(1e300)}), r"'e1' covariate 'c' .* becomes inf"),
    ],
)
def test_float32_storage_refuses_values_it_would_turn_into_inf_or_zero(experiment, match):
    e = experiment()
    with pytest.raises(ValueError, match=match):
        dataset(e)


def test_float64_storage_keeps_values_float32_cannot_hold():
    e = exp(channels={"a": hk.ChannelObs([0.0, 1.0], [1.0, 2.0], 1e-300)})
    bp = dataset(e, dtype="float64").bucket_payloads[0]
    assert float(bp.yvar[0, 0, 0]) == 1e-300


# --- make_experiment ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, [1.0, np.nan]])
def test_make_experiment_refuses_a_non_finite_covariate(bad):
    with pytest.raises(ValueError, match=r"make_experiment\('e1'\): covariate 'c' must be finite"):
        exp(covariates={"c": bad})


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_make_experiment_refuses_a_non_finite_y0(bad):
    with pytest.raises(ValueError, match=r"make_experiment\('e1'\): `y0` must be finite"):
        exp(y0=(1.0, bad))


@pytest.mark.parametrize("bad", [None, 3, b"e1"])
def test_make_experiment_requires_a_str_exp_id(bad):
    with pytest.raises(TypeError, match="`exp_id` must be a str"):
        exp(exp_id=bad)


@pytest.mark.parametrize("bad", [object(), "text", np.array([object()])])
def test_make_experiment_refuses_an_object_or_text_covariate(bad):
    with pytest.raises(TypeError, match=r"covariate 'c' must be numeric"):
        exp(covariates={"c": bad})


def test_make_experiment_refuses_a_ragged_covariate():
    with pytest.raises(TypeError, match=r"covariate 'c' must be a numeric array, not a ragged"):
        exp(covariates={"c": [[1.0, 2.0], [3.0]]})


def test_make_experiment_refuses_a_non_numeric_y0():
    with pytest.raises(TypeError, match=r"'e1'.*y0_fn must return a numeric state"):
        exp(y0=("a",))


def test_make_experiment_refuses_covariates_that_are_not_a_mapping():
    with pytest.raises(TypeError, match="`covariates` must be a mapping"):
        exp(covariates=[1.0])


# --- ChannelObs and make_dataset arguments --------------------------------------------------


@pytest.mark.parametrize("field", ["ts", "values", "variance"])
def test_channel_obs_names_a_ragged_argument(field):
    kwargs = dict(ts=[0.0, 1.0], values=[1.0, 2.0], variance=1.0)
    kwargs[field] = [[0.0, 1.0], [2.0]]
    with pytest.raises(TypeError, match=f"ChannelObs: `{field}` must be a numeric array"):
        hk.ChannelObs(**kwargs)


def test_channel_obs_names_an_object_argument():
    with pytest.raises(TypeError, match="ChannelObs: `values` must be numeric"):
        hk.ChannelObs([0.0, 1.0], [object(), object()])


@pytest.mark.parametrize("bad", [None, "a", ["a", 3]])
def test_make_dataset_names_bad_output_channel_names(bad):
    with pytest.raises(TypeError, match="`output_channel_names` must"):
        hk.make_dataset([exp()], output_channel_names=bad)


def test_make_dataset_names_experiments_that_are_not_a_sequence():
    with pytest.raises(TypeError, match="`experiments` must be a sequence"):
        hk.make_dataset(exp(), output_channel_names=["a"])
