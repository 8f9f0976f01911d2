"""NONMEM-style record tables into experiments: rows, doses, resets, covariates (issue 23)."""

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")

COLUMNS = ["ID", "TIME", "DV", "AMT", "RATE", "EVID", "MDV", "CMT"]
MAP = {1: 0, 2: 1}


def y0_fn(covariates, channels):
    return jnp.array([0.5, 0.0])


def read(rows, columns=COLUMNS, **kwargs):
    kwargs = {"y0_fn": y0_fn, "cmt_to_state": MAP, **kwargs}
    return hk.experiments_from_nonmem(pd.DataFrame(rows, columns=columns), **kwargs)


def one(rows, **kwargs):
    (exp,) = read(rows, **kwargs)
    return exp


# ID, TIME, DV, AMT, RATE, EVID, MDV, CMT
OBS = [(1, 0.5, 3.0, 0, 0, 0, 0, 2), (1, 2.0, 1.0, 0, 0, 0, 0, 2)]


def test_dose_rows_with_dv_zero_are_not_observations():
    exp = one([(1, 0.0, 0.0, 100, 0, 1, 1, 1), OBS[0], (1, 1.0, 0.0, 50, 0, 1, 0, 1), OBS[1]])
    np.testing.assert_array_equal(exp.channels["DV"].ts, [0.5, 2.0])
    np.testing.assert_array_equal(exp.channels["DV"].values, [3.0, 1.0])


def test_mdv_one_hides_an_evid_zero_row_and_channel_names_the_output():
    rows = [(1, 0.0, 9.0, 0, 0, 0, 1, 2), *OBS]
    exp = one(rows, channel="conc")
    np.testing.assert_array_equal(exp.channels["conc"].ts, [0.5, 2.0])


def test_a_bolus_is_a_state_jump_on_its_compartment():
    exp = one([(1, 0.0, 0, 100, 0, 1, 1, 1), OBS[0], (1, 1.0, 0, 7, 0, 1, 1, 2), OBS[1]])
    assert exp.jumps == (hk.StateJump(0.0, 0, add=100.0), hk.StateJump(1.0, 1, add=7.0))


def test_an_infusion_is_a_rate_input_of_amt_over_amt_over_rate():
    exp = one([(1, 0.0, 0, 100, 50, 1, 1, 1), *OBS])
    table = exp.inputs["rate1"]
    assert table.ts.tolist() == [0.0, 2.0]
    assert table.values.tolist() == [50.0, 0.0]
    assert exp.jumps == ()


def test_overlapping_infusions_into_one_compartment_add():
    exp = one([(1, 0.0, 0, 20, 10, 1, 1, 1), OBS[0], (1, 1.0, 0, 12, 4, 1, 1, 1), OBS[1]])
    table = exp.inputs["rate1"]
    assert table.ts.tolist() == [0.0, 1.0, 2.0, 4.0]
    assert table.values.tolist() == [10.0, 14.0, 4.0, 0.0]


def test_back_to_back_infusions_join_without_a_gap():
    exp = one([(1, 0.0, 0, 10, 10, 1, 1, 1), OBS[0], (1, 1.0, 0, 30, 30, 1, 1, 1), OBS[1]])
    table = exp.inputs["rate1"]
    assert table.ts.tolist() == [0.0, 1.0, 2.0]
    assert table.values.tolist() == [10.0, 30.0, 0.0]


def test_a_finished_infusion_leaves_exactly_zero():
    exp = one([(1, 0.0, 0, 0.3, 0.1, 1, 1, 1), OBS[0], (1, 1.0, 0, 0.2, 0.1, 1, 1, 1), OBS[1]])
    assert exp.inputs["rate1"].values[-1] == 0.0


def test_every_subject_gets_every_infusion_input():
    rows = [
        (1, 0.0, 0, 10, 10, 1, 1, 1),
        *OBS,
        (2, 0.0, 0, 5, 0, 1, 1, 1),
        (2, 1.0, 2, 0, 0, 0, 0, 2),
    ]
    first, second = read(rows)
    assert set(first.inputs) == set(second.inputs) == {"rate1"}
    assert second.inputs["rate1"].values.tolist() == [0.0]


COLUMNS_II = [*COLUMNS, "II", "ADDL"]


def test_ii_and_addl_expand_into_repeated_doses():
    rows = [(1, 0.0, 0, 10, 0, 1, 1, 1, 12, 2), *((*r, 0, 0) for r in OBS)]
    exp = one(rows, columns=COLUMNS_II)
    assert [j.time for j in exp.jumps] == [0.0, 12.0, 24.0]
    assert {j.add for j in exp.jumps} == {10.0}


def test_addl_infusions_repeat_and_add_where_they_overlap():
    rows = [(1, 0.0, 0, 30, 10, 1, 1, 1, 2, 1), *((*r, 0, 0) for r in OBS)]
    table = one(rows, columns=COLUMNS_II).inputs["rate1"]
    assert table.ts.tolist() == [0.0, 2.0, 3.0, 5.0]
    assert table.values.tolist() == [10.0, 20.0, 10.0, 0.0]


def test_a_reset_sets_every_state_back_to_y0():
    exp = one([(1, 0.0, 0, 10, 0, 1, 1, 1), *OBS, (1, 3.0, 0, 0, 0, 3, 1, 1)])
    resets = [j for j in exp.jumps if j.time == 3.0]
    assert resets == [hk.StateJump(3.0, 0, add=0.5, scale=0.0), hk.StateJump(3.0, 1, scale=0.0)]


def test_evid_4_resets_then_doses():
    exp = one([*OBS, (1, 3.0, 0, 10, 0, 4, 1, 2)])
    assert [(j.state, j.add, j.scale) for j in exp.jumps] == [
        (0, 0.5, 0.0),
        (1, 0.0, 0.0),
        (1, 10.0, 1.0),
    ]


def test_a_sample_recorded_after_a_dose_at_its_time_is_kept():
    exp = one([(1, 0.0, 0, 10, 0, 1, 1, 1), (1, 0.0, 4.0, 0, 0, 0, 0, 1), *OBS])
    assert exp.channels["DV"].ts.tolist() == [0.0, 0.5, 2.0]


def test_a_sample_recorded_before_a_dose_at_its_time_is_refused_naming_both_rows():
    rows = [*OBS, (1, 2.0, 0, 10, 0, 1, 1, 1)]
    with pytest.raises(ValueError, match=r"observation at row 1 .* dose or reset of row 2"):
        read(rows)


def test_a_sample_at_the_time_of_an_additional_dose_is_refused():
    rows = [(1, 0.0, 0, 10, 0, 1, 1, 1, 2, 1), *((*r, 0, 0) for r in OBS)]
    with pytest.raises(ValueError, match=r"row 2 .* an additional \(ADDL\) dose of row 0"):
        read(rows, columns=COLUMNS_II)


def test_an_infusion_running_at_a_reset_is_refused():
    rows = [(1, 0.0, 0, 10, 1, 1, 1, 1), *OBS, (1, 3.0, 0, 0, 0, 3, 1, 1)]
    with pytest.raises(
        ValueError, match=r"an infusion of row 0 .* still run at the reset of row 3"
    ):
        read(rows)


@pytest.mark.parametrize(
    ("extra", "columns", "words"),
    [
        ((1, 0.0, 0, 10, 0, 1, 1, 1, 1), [*COLUMNS, "SS"], r"row 0 .*SS=1; steady-state"),
        ((1, 0.0, 0, 10, -1, 1, 1, 1), COLUMNS, r"row 0 .*RATE=-1 \(a rate or duration"),
        ((1, 0.0, 0, 10, -2, 1, 1, 1), COLUMNS, r"row 0 .*RATE=-2"),
        ((1, 0.0, 0, 10, 0, 5, 1, 1), COLUMNS, r"row 0 .*EVID 5 is not supported"),
        ((1, 0.0, 0, 10, 0, 1, 1, 3), COLUMNS, r"row 0 .*CMT 3, which `cmt_to_state`"),
        ((1, 0.0, 0, 0, 0, 1, 1, 1), COLUMNS, r"row 0 .*needs AMT > 0"),
        ((1, 0.0, 0, np.inf, 0, 1, 1, 1), COLUMNS, r"row 0 .*needs AMT > 0"),
        ((1, 0.0, 0, 10, 0, 1, 1, 1.5), COLUMNS, r"row 0 .*CMT 1.5, which"),
        ((1, np.inf, 0, 10, 0, 1, 1, 1), COLUMNS, r"row 0 .*TIME must be a finite number"),
        ((1, 0.0, 0, 10, 0, 1, 1, 1, 0, 2), COLUMNS_II, r"row 0 .*ADDL=2 with II=0"),
    ],
)
def test_an_unsupported_row_is_refused_naming_it(extra, columns, words):
    pad = (0,) * (len(columns) - len(COLUMNS))
    rows = [extra, *(r + pad for r in OBS)]
    with pytest.raises(ValueError, match=f"experiments_from_nonmem: {words}"):
        read(rows, columns=columns)


def test_an_observation_without_dv_is_refused():
    with pytest.raises(ValueError, match=r"row 0 .*an observation \(EVID 0, MDV 0\) with no DV"):
        read([(1, 0.5, ".", 0, 0, 0, 0, 2)])


def test_time_going_back_within_a_subject_is_refused():
    with pytest.raises(ValueError, match=r"row 1 .*TIME goes back"):
        read(OBS[::-1])


def test_a_subject_split_by_another_is_refused():
    rows = [OBS[0], (2, 0.5, 1.0, 0, 0, 0, 0, 2), OBS[1]]
    with pytest.raises(ValueError, match=r"row 2 .*starts subject '1' again"):
        read(rows)


COV_COLUMNS = [*COLUMNS, "WT", "ALB"]


def test_a_constant_column_is_a_covariate_and_a_changing_one_an_input():
    rows = [
        (1, 0.0, 0, 10, 0, 1, 1, 1, 70, 4.0),
        (1, 0.5, 3.0, 0, 0, 0, 0, 2, 70, 4.0),
        (1, 1.0, 0, 0, 0, 2, 1, 2, 70, 3.5),
        (1, 2.0, 1.0, 0, 0, 0, 0, 2, 70, 3.0),
    ]
    exp = one(rows, columns=COV_COLUMNS, covariates=("WT", "ALB"))
    assert float(exp.covariates["WT"]) == 70.0
    assert exp.inputs["ALB"].ts.tolist() == [0.0, 1.0, 2.0]
    assert exp.inputs["ALB"].values.tolist() == [4.0, 3.5, 3.0]


def test_a_missing_covariate_cell_is_refused():
    rows = [(1, 0.5, 3.0, 0, 0, 0, 0, 2, ".", 4.0)]
    with pytest.raises(ValueError, match=r"row 0 .*covariate 'WT': the cell is missing"):
        read(rows, columns=COV_COLUMNS, covariates=("WT",))


def test_integer_and_text_ids_read_as_text_and_split_by_either():
    rows = [*OBS, *((2, *r[1:]) for r in OBS)]
    assert [e.exp_id for e in read(rows)] == ["1", "2"]
    text = [("a", *r[1:]) for r in OBS]
    assert [e.exp_id for e in read(text)] == ["a"]
    dataset = hk.make_dataset(read(rows), output_channel_names=["DV"])
    _, held = hk.split_dataset_by_ids(dataset, [2])
    assert [e.exp_id for e in held.experiments] == ["2"]


def test_t0_defaults_to_the_first_record_and_may_be_given_per_id():
    rows = [(1, 0.25, 0, 10, 0, 1, 1, 1), *OBS]
    assert one(rows).t0 == 0.25
    assert one(rows, t0={1: 0.0}).t0 == 0.0


def test_a_csv_with_dots_for_missing_cells_is_read(tmp_path):
    path = tmp_path / "pk.csv"
    path.write_text("ID,TIME,DV,AMT,RATE,EVID,MDV,CMT\n1,0,.,100,0,1,1,1\n1,0.5,3,.,.,0,0,2\n")
    exp = hk.experiments_from_nonmem(path, y0_fn=y0_fn, cmt_to_state=MAP)[0]
    assert exp.channels["DV"].ts.tolist() == [0.5]
    assert exp.jumps == (hk.StateJump(0.0, 0, add=100.0),)


def test_without_evid_a_row_with_an_amount_is_a_dose():
    rows = [(1, 0.0, 0.0, 100, 0, 1, 1), (1, 0.5, 3.0, 0, 0, 0, 2)]
    exp = one(rows, columns=["ID", "TIME", "DV", "AMT", "RATE", "MDV", "CMT"])
    assert exp.channels["DV"].ts.tolist() == [0.5]
    assert len(exp.jumps) == 1


def test_a_missing_file_and_a_wrong_type_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match=r"table='.*nope\.csv' does not exist"):
        hk.experiments_from_nonmem(tmp_path / "nope.csv", y0_fn=y0_fn, cmt_to_state=MAP)
    with pytest.raises(TypeError, match="experiments_from_nonmem: `table` must be a pandas"):
        hk.experiments_from_nonmem([1, 2], y0_fn=y0_fn, cmt_to_state=MAP)
