"""State jumps from a lab table: `experiments_from_table(jumps=...)` (doses, withdrawals).

The reference for the solved trajectory is the closed form of `dy/dt = -k y` with the jumps
applied right-continuously (`test_jumps.closed_form`).
"""

import numpy as np
import pytest
from helpers import identity_output
from test_jumps import SOLVER, TRUE, closed_form, simulate

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")

TS = [0.0, 0.4, 0.8, 1.2, 1.6, 2.0]
OBS = pd.DataFrame(
    [(e, t, "y", 0.0) for e in ("r1", "r2") for t in TS],
    columns=["experiment", "time", "variable", "value"],
)
# r1: a bolus, then a tenth withdrawn and a dose at one time (table order); r2: nothing.
DOSES = pd.DataFrame(
    {
        "experiment": ["r1", "r1", "r1"],
        "time": [0.5, 1.0, 1.0],
        "state": [0, 0, 0],
        "add": [2.0, np.nan, 0.5],  # an empty cell adds nothing
        "scale": [np.nan, 0.9, np.nan],  # an empty cell keeps the state
    }
)
WANT = [
    hk.StateJump(0.5, 0, add=2.0),
    hk.StateJump(1.0, 0, scale=0.9),
    hk.StateJump(1.0, 0, add=0.5),
]


def y0_fn(covariates, channels):
    return np.array([1.0])


def read(jumps=DOSES, observations=OBS, **kwargs):
    return hk.experiments_from_table(observations, y0_fn=y0_fn, jumps=jumps, **kwargs)


def test_jump_rows_become_state_jumps_in_table_order():
    r1, r2 = read()
    assert list(r1.jumps) == WANT
    assert r2.jumps == ()


def test_the_solve_applies_the_table_doses_before_at_and_after_each_jump():
    (bp,) = hk.make_dataset(read(), output_channel_names=["y"]).bucket_payloads
    pred = np.asarray(hk.predict_bucket(TRUE, bp, simulate, identity_output, SOLVER))[..., 0]
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, WANT), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(pred[1], closed_form(TS, 1.0, []), rtol=1e-8, atol=1e-8)


def test_an_add_only_table_and_integer_ids_are_read():
    obs = OBS.assign(experiment=OBS.experiment.str[1:].astype(int))
    doses = DOSES.drop(columns="scale").assign(experiment=[1.0, 1.0, 1.0])
    r1, _ = read(doses, obs)
    got = [(j.time, j.add, j.scale) for j in r1.jumps]
    assert got == [(0.5, 2.0, 1.0), (1.0, 0.0, 1.0), (1.0, 0.5, 1.0)]


def test_a_csv_path_reads_like_the_frame(tmp_path):
    path = tmp_path / "doses.csv"
    DOSES.to_csv(path, index=False)
    assert list(read(path)[0].jumps) == WANT


def test_a_jump_for_an_experiment_without_observations_is_refused_not_dropped():
    doses = DOSES.assign(experiment=["r1", "R1", "r1"])
    with pytest.raises(ValueError, match=r"`jumps` names experiment\(s\) \['R1'\] .*no obs"):
        read(doses)


def test_a_table_without_add_or_scale_is_refused():
    with pytest.raises(ValueError, match="neither an 'add' nor a 'scale' column"):
        read(DOSES.drop(columns=["add", "scale"]))


def test_a_missing_state_column_names_it():
    with pytest.raises(ValueError, match=r"`jumps` has no column\(s\) \['state'\]"):
        read(DOSES.drop(columns="state"))


@pytest.mark.parametrize(("state", "shown"), [(np.nan, "empty"), (-1, "-1.0"), (0.5, "0.5")])
def test_a_state_that_is_not_an_index_names_the_experiment_and_rows(state, shown):
    doses = DOSES.assign(state=[0, state, 0])
    message = rf"`jumps` experiment 'r1', field 'state': {shown} in row\(s\) \[1\]"
    with pytest.raises(ValueError, match=message):
        read(doses)


def test_a_state_beyond_the_state_size_names_the_experiment():
    with pytest.raises(ValueError, match=r"make_experiment\('r1'\).*state"):
        read(DOSES.assign(state=[0, 3, 0]))


def test_a_non_finite_add_names_the_experiment_row_and_field():
    doses = DOSES.assign(add=[2.0, np.inf, 0.5])
    message = r"`jumps` experiment 'r1', row 1 .*`add` must be finite, got inf"
    with pytest.raises(ValueError, match=message):
        read(doses)


def test_a_non_numeric_add_names_the_experiment_and_field():
    doses = DOSES.astype({"add": object})
    doses.loc[0, "add"] = "two"
    with pytest.raises(ValueError, match=r"`jumps` experiment 'r1', field 'add': 'two'"):
        read(doses)


def test_a_missing_time_names_the_experiment_and_row():
    doses = DOSES.assign(time=[0.5, np.nan, 1.0])
    with pytest.raises(ValueError, match=r"`jumps` experiment 'r1', row 1 .*field 'time'"):
        read(doses)


def test_a_jump_before_t0_is_refused_naming_the_experiment():
    with pytest.raises(ValueError, match=r"make_experiment\('r1'\)"):
        read(DOSES.assign(time=[-1.0, 1.0, 1.0]))
