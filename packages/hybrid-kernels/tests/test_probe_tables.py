"""Probe scenarios (issue 22): tables with bad cells are refused, naming where.

A negative or non-finite std, a missing experiment id or variable name, and a covariate that
is not a number each raise `ValueError` naming the experiment, the column and the rows. The
checks run before pandas converts anything, so pandas 2 and pandas 3 give the same answer
(CI runs the oldest supported pandas with the oldest jax, the newest with the newest).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")


def y0_fn(covariates, channels):
    return jnp.array([covariates.get("x0", 0.0)])


def observations(changes=None):
    table = pd.DataFrame(
        {
            "experiment": ["r1", "r1", "r1", "r2", "r2"],
            "time": [0.0, 1.0, 2.0, 0.0, 1.0],
            "variable": ["X", "X", "X", "X", "X"],
            "value": [1.0, 2.0, 3.0, 1.5, 2.5],
            "std": [0.1, 0.1, 0.1, 0.2, 0.2],
        }
    )
    for (column, row), value in (changes or {}).items():
        if table[column].dtype.kind == "f" and not isinstance(value, float):
            table[column] = table[column].astype(object)
        table.loc[row, column] = value
    return table


def covariates(cells=None):
    table = pd.DataFrame({"experiment": ["r1", "r2"], "x0": [1.0, 2.0]}, dtype=object)
    for (column, row), value in (cells or {}).items():
        table.loc[row, column] = value
    return table


def inputs(cells=None):
    table = pd.DataFrame(
        {
            "experiment": ["r1", "r1", "r2"],
            "time": [0.0, 1.0, 0.0],
            "variable": ["feed", "feed", "feed"],
            "value": [0.0, 1.0, 2.0],
        },
        dtype=object,
    )
    for (column, row), value in (cells or {}).items():
        table.loc[row, column] = value
    return table


def test_a_clean_table_reads():
    exps = hk.experiments_from_table(observations(), y0_fn=y0_fn)
    assert [e.exp_id for e in exps] == ["r1", "r2"]
    np.testing.assert_allclose(exps[0].channels["X"].variance, [0.01] * 3)


@pytest.mark.parametrize("std", [-0.1, 0.0, np.inf, -np.inf])
def test_a_std_that_is_not_finite_and_positive_is_refused(std):
    table = observations({("std", 1): std})
    with pytest.raises(ValueError) as info:
        hk.experiments_from_table(table, y0_fn=y0_fn)
    message = str(info.value)
    for words in ("experiment 'r1'", "variable 'X'", "'std'", "row(s) [1]", "finite and > 0"):
        assert words in message


def test_a_missing_std_still_means_variance_one():
    exps = hk.experiments_from_table(observations({("std", 1): np.nan}), y0_fn=y0_fn)
    np.testing.assert_allclose(exps[0].channels["X"].variance, [0.01, 1.0, 0.01])


@pytest.mark.parametrize("missing", [np.nan, None, "", "  "])
@pytest.mark.parametrize("column", ["experiment", "variable"])
def test_a_missing_id_or_variable_name_is_refused_with_its_rows(column, missing):
    table = observations({(column, 1): missing, (column, 3): missing})
    with pytest.raises(ValueError, match=rf"no '{column}' in row\(s\) \[1, 3\]"):
        hk.experiments_from_table(table, y0_fn=y0_fn)


def test_a_missing_id_in_a_csv_file_is_refused_with_its_row(tmp_path):
    path = tmp_path / "obs.csv"
    observations({("experiment", 2): None}).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"no 'experiment' in row\(s\) \[2\]"):
        hk.experiments_from_table(path, y0_fn=y0_fn)


def test_a_missing_id_in_the_covariates_is_refused_with_its_row():
    with pytest.raises(ValueError, match=r"`covariates` has no 'experiment' in row\(s\) \[1\]"):
        hk.experiments_from_table(
            observations(), y0_fn=y0_fn, covariates=covariates({("experiment", 1): np.nan})
        )


@pytest.mark.parametrize("column", ["experiment", "variable"])
def test_a_missing_id_or_name_in_the_inputs_is_refused_with_its_row(column):
    with pytest.raises(ValueError, match=rf"`inputs` has no '{column}' in row\(s\) \[2\]"):
        hk.experiments_from_table(observations(), y0_fn=y0_fn, inputs=inputs({(column, 2): None}))


@pytest.mark.parametrize(
    ("cell", "why"), [("abc", "is not a number"), (np.nan, "is missing"), (np.inf, "not finite")]
)
def test_a_bad_covariate_names_the_experiment_and_the_column(cell, why):
    with pytest.raises(ValueError) as info:
        hk.experiments_from_table(
            observations(), y0_fn=y0_fn, covariates=covariates({("x0", 1): cell})
        )
    message = str(info.value)
    for words in ("experiment 'r2'", "column 'x0'", why, "row(s) [1]"):
        assert words in message


def test_numeric_covariates_given_as_text_are_read():
    exps = hk.experiments_from_table(
        observations(), y0_fn=y0_fn, covariates=covariates({("x0", 1): "2.5"})
    )
    np.testing.assert_array_equal(exps[1].y0, [2.5])
