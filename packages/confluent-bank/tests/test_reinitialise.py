"""`ConfluentPackBank.reinitialise`: a fresh start that keeps the bank's structure."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PB_PAIR_UPDATES, make_pair_bank, set_rows

import confluent_bank as cb

KEPT = ("scales", "rho", "directions", "direction_bias", *cb.STATE_NAMES[8:])


@pytest.fixture(scope="module")
def mixed_bank() -> cb.ConfluentPackBank:
    """Slot 0 a centred pair, slot 1 off, slot 2 an ordinary order-1 atom, slot 3 a moment row."""
    bank = set_rows(make_pair_bank(), PB_PAIR_UPDATES)
    return set_rows(
        bank,
        [
            ("active", 3, True),
            ("modes", 3, 2),
            ("orders", 3, 2),
            ("moment_coefficients", 3, [0.1, 0.2, 0.3, 0.0]),
        ],
    )


@pytest.fixture(scope="module")
def fresh(mixed_bank) -> cb.ConfluentPackBank:
    return mixed_bank.reinitialise(jax.random.key(3))


def test_reinitialise_keeps_structure_and_geometry(mixed_bank, fresh):
    for name in KEPT:
        np.testing.assert_array_equal(getattr(fresh, name), getattr(mixed_bank, name), name)
    assert (fresh.max_order, fresh.base) == (mixed_bank.max_order, mixed_bank.base)


def test_reinitialise_keeps_shapes_and_dtypes(mixed_bank, fresh):
    for name in cb.STATE_NAMES:
        old, new = getattr(mixed_bank, name), getattr(fresh, name)
        assert (new.shape, new.dtype) == (old.shape, old.dtype), name


def test_reinitialise_leaves_inactive_slots_untouched(mixed_bank, fresh):
    for name in cb.PARAMETER_NAMES:
        np.testing.assert_array_equal(getattr(fresh, name)[1], getattr(mixed_bank, name)[1])


def test_reinitialise_redraws_centres_and_the_coefficients_of_each_mode(mixed_bank, fresh):
    old, new = jax.device_get((mixed_bank, fresh))
    active = [0, 2, 3]
    assert np.all(new.centers[active] != old.centers[active])
    assert np.all(new.weights[[0, 2]] != old.weights[[0, 2]])
    assert new.odd_moments[0] != old.odd_moments[0]
    assert np.all(new.moment_coefficients[3, :3] != old.moment_coefficients[3, :3])


def test_reinitialise_leaves_coefficients_a_mode_does_not_read(mixed_bank, fresh):
    assert fresh.odd_moments[2] == mixed_bank.odd_moments[2]  # an ordinary slot
    assert fresh.weights[3] == mixed_bank.weights[3]  # a moment slot
    assert fresh.moment_coefficients[3, 3] == mixed_bank.moment_coefficients[3, 3]  # past order
    np.testing.assert_array_equal(fresh.moment_coefficients[:3], mixed_bank.moment_coefficients[:3])


def test_reinitialise_keeps_inactive_slots_exactly_zero_in_the_forward(fresh):
    terms = fresh.slot_terms(jnp.linspace(-1.0, 1.0, 5))
    np.testing.assert_array_equal(terms[1], np.zeros(5))
    assert np.all(np.isfinite(fresh.forward(jnp.linspace(-1.0, 1.0, 5))))


def test_reinitialise_depends_on_the_key(mixed_bank, fresh):
    again = mixed_bank.reinitialise(jax.random.key(3))
    other = mixed_bank.reinitialise(jax.random.key(4))
    np.testing.assert_array_equal(again.centers, fresh.centers)
    assert not np.array_equal(other.centers, fresh.centers)


def test_reinitialise_works_under_jit(mixed_bank, fresh):
    jitted = jax.jit(lambda bank, key: bank.reinitialise(key))(mixed_bank, jax.random.key(3))
    np.testing.assert_array_equal(jitted.centers, fresh.centers)
