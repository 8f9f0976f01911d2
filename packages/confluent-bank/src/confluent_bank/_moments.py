"""Exact (rational) Taylor-normalised moments of atom clusters, computed on the host.

`m_k = Σ_i a_i (b_i − center)^k / k!`: every float input is read as its exact binary value, the
sums are exact, and each `m_k` is rounded to the nearest float once.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

Rational = Fraction | float | int


class Interval(NamedTuple):
    """A closed float interval `[lo, hi]`."""

    lo: float
    hi: float


def _exact(value: object, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, numbers.Rational | numbers.Real):
        raise TypeError(f"{what} must be a real number, got {value!r}")
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    as_float = float(value)  # type: ignore[arg-type]
    if not math.isfinite(as_float):
        raise ValueError(f"{what} must be finite, got {as_float}")
    return Fraction(as_float)


def enclosing_interval(value: Fraction) -> Interval:
    """The tightest float interval containing the rational `value`."""
    nearest = float(value)  # correctly rounded
    if Fraction(nearest) == value:
        return Interval(nearest, nearest)
    if Fraction(nearest) < value:
        return Interval(nearest, math.nextafter(nearest, math.inf))
    return Interval(math.nextafter(nearest, -math.inf), nearest)


@dataclasses.dataclass(frozen=True)
class MomentInitialization:
    """Moments of a cluster about `center`, exact and rounded.

    **Fields:**

    - `moments`: the rounded moments `(m_0, …, m_order)` as floats.
    - `exact_moments`: the exact rational moments.
    - `conversion_errors`: intervals enclosing `exact − rounded` for each moment.
    - `center`: the exact expansion centre.
    - `offsets`: exact `b_i − center`.
    - `coefficients`: exact `a_i`.
    """

    moments: tuple[float, ...]
    exact_moments: tuple[Fraction, ...]
    conversion_errors: tuple[Interval, ...]
    center: Fraction
    offsets: tuple[Fraction, ...]
    coefficients: tuple[Fraction, ...]


def initialize_moments(
    offsets: Sequence[Rational],
    coefficients: Sequence[Rational],
    *,
    order: int,
    center: Rational = 0.0,
) -> MomentInitialization:
    """Taylor-normalised moments `m_k = Σ_i a_i (b_i − center)^k / k!` for `k = 0..order`.

    **Arguments:**

    - `offsets`: the atoms' offsets `b_i` (floats are read as exact binary values; `Fraction`s
      are used as they are).
    - `coefficients`: the atoms' coefficients `a_i`, same length as `offsets`.
    - `order`: highest moment order, `≥ 0`.
    - `center`: expansion centre (default 0).

    Raises `ValueError` for a negative order, no offsets, or mismatched lengths.
    """
    if isinstance(order, bool) or not isinstance(order, numbers.Integral):
        raise TypeError(f"order must be an integer, got {order!r}")
    offsets, coefficients = tuple(offsets), tuple(coefficients)
    if order < 0:
        raise ValueError(f"order must be >= 0, got {order}")
    if not offsets:
        raise ValueError("offsets must not be empty")
    if len(offsets) != len(coefficients):
        raise ValueError(
            f"offsets and coefficients must have the same length, got {len(offsets)} and "
            f"{len(coefficients)}"
        )
    exact_center = _exact(center, "center")
    shifted = tuple(_exact(b, "offset") - exact_center for b in offsets)
    weights = tuple(_exact(a, "coefficient") for a in coefficients)
    exact = tuple(
        sum((a * d**k for a, d in zip(weights, shifted, strict=True)), Fraction(0))
        / math.factorial(k)
        for k in range(int(order) + 1)
    )
    rounded = tuple(float(m) for m in exact)
    errors = tuple(enclosing_interval(m - Fraction(r)) for m, r in zip(exact, rounded, strict=True))
    return MomentInitialization(rounded, exact, errors, exact_center, shifted, weights)


def pair_moments(plus: Rational, minus: Rational, half_spread: Rational) -> MomentInitialization:
    """Moments of `a₊ σ(u + h) + a₋ σ(u − h)`: `(a₊ + a₋, h(a₊ − a₋))`.

    **Arguments:**

    - `plus`, `minus`: the coefficients `a₊`, `a₋`.
    - `half_spread`: `h ≥ 0`.
    """
    h = _exact(half_spread, "half_spread")
    if h < 0:
        raise ValueError(f"half_spread must be >= 0, got {float(h)}")
    return initialize_moments((h, -h), (plus, minus), order=1)
