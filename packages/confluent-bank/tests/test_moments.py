"""Exact rational moments (spec 1.6) and the CB cluster row regression values."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from helpers import cluster_init

import confluent_bank as cb


def test_cluster_row_reproduces_the_spec_values_exactly():
    init = cluster_init(3)
    assert init.moments == (
        1.0,
        0.0003333333333333327,
        0.00013055555555555555,
        -1.1049382716049385e-07,
    )
    assert init.exact_moments[0] == Fraction(18014398509481983, 18014398509481984)
    assert float(init.center * -1) == 0.0033333333333333335


def test_moments_are_the_exact_taylor_normalised_sums():
    init = cb.initialize_moments((0.5, -0.25), (3.0, 2.0), order=3, center=0.125)
    offsets = (Fraction(3, 8), Fraction(-3, 8))
    assert init.offsets == offsets and init.coefficients == (3, 2)
    for k, moment in enumerate(init.exact_moments):
        assert moment == (3 * offsets[0] ** k + 2 * offsets[1] ** k) / math.factorial(k)


def test_floats_are_read_as_their_exact_binary_values():
    init = cb.initialize_moments((0.1,), (1.0,), order=1)
    assert init.exact_moments[1] == Fraction(0.1) != Fraction(1, 10)


def test_conversion_errors_enclose_exact_minus_rounded():
    init = cluster_init(4)
    for exact, rounded, interval in zip(
        init.exact_moments, init.moments, init.conversion_errors, strict=True
    ):
        error = exact - Fraction(rounded)
        assert Fraction(interval.lo) <= error <= Fraction(interval.hi)
        assert interval.hi == interval.lo or math.nextafter(interval.lo, math.inf) == interval.hi


def test_exactly_representable_moments_have_zero_conversion_error():
    init = cb.initialize_moments((1.0, -1.0), (2.0, -1.0), order=2)
    assert init.conversion_errors == (cb.Interval(0.0, 0.0),) * 3


@pytest.mark.parametrize(
    ("offsets", "coefficients", "order", "match"),
    [((0.0,), (1.0,), -1, "order"), ((), (), 1, "empty"), ((0.0, 1.0), (1.0,), 1, "length")],
)
def test_initialize_moments_validation(offsets, coefficients, order, match):
    with pytest.raises(ValueError, match=match):
        cb.initialize_moments(offsets, coefficients, order=order)


def test_non_finite_inputs_are_rejected():
    with pytest.raises(ValueError, match="finite"):
        cb.initialize_moments((float("nan"),), (1.0,), order=0)


def test_pair_moments_are_sum_and_half_spread_difference():
    init = cb.pair_moments(2.0, -1.0, 0.125)
    assert init.moments == (1.0, 0.375)
    assert init.exact_moments == (Fraction(1), Fraction(3, 8))


def test_pair_moments_reject_negative_half_spread():
    with pytest.raises(ValueError, match="half_spread"):
        cb.pair_moments(1.0, 1.0, -0.1)
