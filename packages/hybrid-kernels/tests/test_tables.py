"""Long-format tables in and out, and splitting held-out experiments by id (issue 13)."""

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")


def y0_fn(covariates, channels):
    return jnp.array([covariates["x0"], 0.0])


def long_table():
    rows = [
        ("r1", 0.0, "X", 1.0, 0.1),
        ("r1", 1.0, "X", 2.0, 0.1),
        ("r1", 1.0, "X", 2.2, 0.1),  # a replicate
        ("r1", 1.0, "S", np.nan, 0.1),  # a missing cell
        ("r1", 2.0, "S", 5.0, np.nan),  # no standard deviation: variance 1
        ("r2", 0.0, "X", 3.0, 0.2),
        ("r2", 0.5, "S", 4.0, 0.2),
    ]
    return pd.DataFrame(rows, columns=["experiment", "time", "variable", "value", "std"])


COVS = pd.DataFrame({"experiment": ["r1", "r2"], "x0": [1.0, 3.0]})
FEEDS = pd.DataFrame(
    {
        "experiment": ["r1", "r1", "r2"],
        "time": [1.5, 0.0, 0.0],  # unsorted on purpose
        "variable": ["feed"] * 3,
        "value": [2.0, 0.0, 1.0],
    }
)


@pytest.fixture(scope="module")
def experiments():
    return hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=COVS, inputs=FEEDS)


def test_experiments_come_in_table_order_with_string_ids(experiments):
    assert [e.exp_id for e in experiments] == ["r1", "r2"]


def test_nan_is_missing_and_replicates_are_kept(experiments):
    r1 = experiments[0]
    np.testing.assert_array_equal(r1.channels["X"].ts, [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(r1.channels["S"].ts, [2.0])


def test_std_becomes_variance_and_a_missing_std_is_one(experiments):
    np.testing.assert_allclose(experiments[0].channels["X"].variance, [0.01] * 3)
    np.testing.assert_allclose(experiments[0].channels["S"].variance, [1.0])


def test_covariates_feed_y0_fn(experiments):
    np.testing.assert_array_equal(experiments[1].y0, [3.0, 0.0])


def test_input_tables_become_sorted_piecewise_constant_signals(experiments):
    feed = experiments[0].inputs["feed"]
    assert feed.kind == "constant"
    np.testing.assert_array_equal(feed.ts, [0.0, 1.5])


def test_a_variable_never_measured_in_an_experiment_is_an_empty_channel(experiments):
    assert experiments[1].channels["X"].ts.tolist() == [0.0]
    ds = hk.make_dataset(experiments, output_channel_names=["X", "S"])
    assert ds.n_experiments == 2


def test_a_csv_path_reads_like_the_frame(tmp_path):
    path = tmp_path / "obs.csv"
    long_table().to_csv(path, index=False)
    exps = hk.experiments_from_table(path, y0_fn=y0_fn, covariates=COVS)
    assert [e.exp_id for e in exps] == ["r1", "r2"]


def test_custom_column_names_are_used():
    table = long_table().rename(columns={"experiment": "run", "value": "y"})
    covs = COVS.rename(columns={"experiment": "run"})
    exps = hk.experiments_from_table(
        table, y0_fn=y0_fn, covariates=covs, exp_col="run", value_col="y"
    )
    assert len(exps) == 2


def test_a_covariate_repeated_on_every_row_of_its_experiment_is_read_once():
    covs = pd.concat([COVS, COVS.iloc[:1], COVS.iloc[1:], COVS.iloc[:1]])
    exps = hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=covs)
    assert [float(e.covariates["x0"]) for e in exps] == [1.0, 3.0]


def test_a_covariate_that_changes_within_an_experiment_names_experiment_and_column():
    covs = pd.concat([COVS, COVS.iloc[:1].assign(x0=9.0)])
    with pytest.raises(
        ValueError, match=r"experiment 'r1', column 'x0': takes the values \[1.0, 9.0\]"
    ):
        hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=covs)


def int_id_tables():
    table = long_table().assign(experiment=lambda d: d.experiment.str[1:].astype(int))
    covs = COVS.assign(experiment=[1.0, 2.0])  # floats, as pandas reads a column with gaps
    feeds = FEEDS.assign(experiment=["1", "1", "2"])  # text
    return table, covs, feeds


def test_integer_float_and_text_ids_name_the_same_experiment():
    table, covs, feeds = int_id_tables()
    exps = hk.experiments_from_table(
        table, y0_fn=y0_fn, covariates=covs, inputs=feeds, t0={1: 0.0, "2": 0.0}
    )
    assert [e.exp_id for e in exps] == ["1", "2"]
    assert [float(e.covariates["x0"]) for e in exps] == [1.0, 3.0]
    assert exps[0].inputs["feed"].ts.tolist() == [0.0, 1.5]


def test_a_fractional_experiment_id_is_refused():
    table = long_table().assign(experiment=1.5)
    with pytest.raises(ValueError, match=r"experiment id 1\.5 is not a whole number"):
        hk.experiments_from_table(table, y0_fn=y0_fn)


def test_split_dataset_by_ids_accepts_integer_ids_from_a_table():
    table, covs, _ = int_id_tables()
    exps = hk.experiments_from_table(table, y0_fn=y0_fn, covariates=covs)
    dataset = hk.make_dataset(exps, output_channel_names=["X", "S"])
    rest, held = hk.split_dataset_by_ids(dataset, [2])
    assert [e.exp_id for e in held.experiments] == ["2"]
    assert [e.exp_id for e in rest.experiments] == ["1"]


def test_a_missing_covariate_row_raises_naming_the_experiment():
    with pytest.raises(ValueError, match=r"no row for experiment\(s\) \['r2'\]"):
        hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=COVS.iloc[:1])


def test_a_non_numeric_value_names_experiment_variable_and_field():
    table = long_table().astype({"value": object})
    table.loc[1, "value"] = "n/a"
    with pytest.raises(ValueError, match="experiment 'r1', variable 'X', field 'value'"):
        hk.experiments_from_table(table, y0_fn=y0_fn, covariates=COVS)


def test_a_bad_observation_names_experiment_variable_and_field():
    table = long_table()
    table.loc[1, "std"] = 0.0  # a zero variance
    with pytest.raises(ValueError, match=r"experiment 'r1', variable 'X': .*'std'"):
        hk.experiments_from_table(table, y0_fn=y0_fn, covariates=COVS)


def test_input_rows_at_one_time_keep_the_last_row():
    feeds = pd.concat([FEEDS, FEEDS.iloc[:1].assign(value=7.0)])  # a second switch at 1.5
    exps = hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=COVS, inputs=feeds)
    assert exps[0].inputs["feed"].values.tolist() == [0.0, 7.0]


def test_a_bad_input_table_names_experiment_variable_and_field():
    feeds = FEEDS.assign(value=[2.0, np.inf, 1.0])
    with pytest.raises(ValueError, match="`inputs` experiment 'r1', variable 'feed'"):
        hk.experiments_from_table(long_table(), y0_fn=y0_fn, covariates=COVS, inputs=feeds)


def test_a_late_first_sample_without_t0_names_the_experiment():
    table = long_table()
    table = table[~((table.experiment == "r1") & (table.time == 0.0))]
    with pytest.raises(ValueError, match=r"make_experiment\('r1'\): no `t0` given"):
        hk.experiments_from_table(table, y0_fn=y0_fn, covariates=COVS)
    exps = hk.experiments_from_table(table, y0_fn=y0_fn, covariates=COVS, t0=0.0)
    assert exps[0].t0 == 0.0


# --- out ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(experiments):
    return hk.make_dataset(experiments, output_channel_names=["X", "S"])


def fake_predictions(dataset):
    return [np.asarray(bp.y_observed) + 0.5 for bp in dataset.bucket_payloads]


def test_predictions_table_has_one_row_per_measured_cell_with_the_same_columns(dataset):
    table = hk.predictions_table(dataset, fake_predictions(dataset))
    assert list(table.columns) == [
        "experiment",
        "time",
        "variable",
        "value",
        "prediction",
        "residual",
    ]
    assert len(table) == 6  # 7 rows minus the missing one; the replicate is its own row
    r1x = table[(table.experiment == "r1") & (table.variable == "X")]
    assert sorted(r1x.value) == [1.0, 2.0, 2.2]
    np.testing.assert_allclose(table.residual, 0.5)


def test_metrics_table_summarises_per_variable(dataset):
    table = hk.predictions_table(dataset, fake_predictions(dataset))
    metrics = hk.metrics_table(table)
    assert list(metrics.variable) == ["S", "X"]
    np.testing.assert_allclose(metrics.rmse, 0.5)
    assert list(metrics.n) == [2, 4]


def test_predictions_table_keeps_the_labs_times_and_values_in_a_float32_dataset():
    # float32 rounds 4.7 to 4.699999809...; the table must still join back onto the lab's.
    table = long_table()
    table.loc[1, ["time", "value"]] = [4.7, 0.1]
    table.loc[2, "time"] = 4.7
    exps = hk.experiments_from_table(table, y0_fn=y0_fn, covariates=COVS)
    data = hk.make_dataset(exps, output_channel_names=["X", "S"], dtype="float32")
    assert data.bucket_payloads[0].ts.dtype == jnp.float32
    out = hk.predictions_table(data, fake_predictions(data))
    measured = table.dropna(subset=["value"])
    joined = measured.merge(out, on=["experiment", "time", "variable", "value"])
    assert len(joined) == len(out) == len(measured)
    assert 4.7 in set(out.time) and 0.1 in set(out.value)


def test_predictions_table_rejects_a_wrong_bucket_count(dataset):
    with pytest.raises(ValueError, match="holds 0 arrays"):
        hk.predictions_table(dataset, [])


# --- split by ids ---------------------------------------------------------------------------


def test_split_dataset_by_ids_holds_out_the_named_experiments(dataset):
    rest, held = hk.split_dataset_by_ids(dataset, ["r2"])
    assert [e.exp_id for e in held.experiments] == ["r2"]
    assert [e.exp_id for e in rest.experiments] == ["r1"]


def test_split_dataset_by_ids_rejects_an_unknown_id(dataset):
    with pytest.raises(ValueError, match=r"id\(s\) \['r9'\] \(field `exp_ids`\)"):
        hk.split_dataset_by_ids(dataset, ["r9"])
