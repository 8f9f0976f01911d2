"""State jumps: every refused input raises an error naming the experiment and the jump."""

from __future__ import annotations

import numpy as np
import pytest

import hybrid_kernels as hk


def _y0(covariates, channels):
    return np.array([1.0, 0.0])


def _experiment(jumps, *, t0=0.0, exp_id="subject-7"):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(ts=[t0, t0 + 1.0], values=[1.0, 0.5])},
        y0_fn=_y0,
        exp_id=exp_id,
        t0=t0,
        jumps=jumps,
    )


def test_jumps_are_stored_sorted_by_time_keeping_list_order_at_equal_times():
    a, b, c = hk.StateJump(2.0, 0, add=1.0), hk.StateJump(1.0, 1, add=2.0), hk.StateJump(1.0, 0)
    assert _experiment([a, b, c]).jumps == (b, c, a)


def test_no_jumps_by_default():
    assert _experiment(()).jumps == ()


def test_jump_before_t0_names_experiment_jump_and_field():
    match = r"'subject-7'.*jump 1 .*StateJump\(time=0\.5.*`time`.*t0=1\.0"
    with pytest.raises(ValueError, match=match):
        _experiment([hk.StateJump(1.5, 0), hk.StateJump(0.5, 0)], t0=1.0)


def test_state_index_out_of_range_for_y0_names_the_state_size():
    with pytest.raises(ValueError, match=r"'subject-7'.*jump 0 .*`state` 2 .*S = 2"):
        _experiment([hk.StateJump(1.0, 2, add=1.0)])


def test_jump_time_too_large_for_float64_times():
    with pytest.raises(ValueError, match=r"'subject-7'.*jump 0 .*too large for float64"):
        _experiment([hk.StateJump(1e17, 0, add=1.0)])


def test_non_statejump_item_is_a_type_error_naming_its_index():
    with pytest.raises(TypeError, match=r"'subject-7'.*jump 1 in `jumps` must be a StateJump"):
        _experiment([hk.StateJump(1.0, 0), (1.0, 0, 1.0)])


def test_a_single_statejump_instead_of_a_list_is_a_type_error():
    with pytest.raises(TypeError, match=r"`jumps` must be a sequence of StateJump"):
        _experiment(hk.StateJump(1.0, 0))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"time": np.inf}, "time"), ({"add": np.nan}, "add"), ({"scale": -np.inf}, "scale")],
)
def test_statejump_refuses_non_finite_fields(kwargs, field):
    args = {"time": 1.0, "state": 0, **kwargs}
    with pytest.raises(ValueError, match=rf"`{field}` must be finite"):
        hk.StateJump(**args)


def test_statejump_refuses_a_negative_or_non_int_state():
    with pytest.raises(ValueError, match=r"`state` must be >= 0"):
        hk.StateJump(1.0, -1)
    with pytest.raises(TypeError, match=r"`state` must be an int"):
        hk.StateJump(1.0, 0.0)
