"""`init_confluent_bank` refuses what its dtype cannot hold (issue 11): a `max_order` whose tower
coefficients overflow, and pack values that the cast makes non-finite, naming slot and field."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb


@pytest.mark.parametrize(
    ("base", "dtype", "highest"),
    [
        ("sigmoid", jnp.float64, 155),
        ("tanh", jnp.float64, 158),
        ("sigmoid", jnp.float32, 26),
        ("tanh", jnp.float32, 27),
    ],
)
def test_max_order_above_the_dtype_limit_is_refused_at_construction(base, dtype, highest):
    cb.init_confluent_bank([], max_packs=1, max_order=highest, base=base, dtype=dtype)
    with pytest.raises(ValueError, match=rf"max_order={highest + 1} is too high .*<= {highest}"):
        cb.init_confluent_bank([], max_packs=1, max_order=highest + 1, base=base, dtype=dtype)


def test_max_order_200_is_a_value_error_not_an_overflow_error():
    with pytest.raises(ValueError, match="max_order=200 is too high for a sigmoid bank in float64"):
        cb.init_confluent_bank([], max_order=200)


def test_a_dtype_too_narrow_for_any_tower_is_refused():
    with pytest.raises(ValueError, match="cannot use dtype float16"):
        cb.init_confluent_bank([], dtype=jnp.float16)


def test_the_highest_order_float32_bank_has_a_finite_forward_and_gradient():
    pack = cb.RefinedPack(26, 0.0, 1e-20)
    bank = cb.init_confluent_bank([pack], max_packs=1, max_order=26, dtype=jnp.float32)
    z = jnp.asarray([-0.5, 0.5], dtype=jnp.float32)
    assert np.all(np.isfinite(bank.forward(z)))
    grads = jax.grad(lambda p: jnp.sum(bank.with_parameters(p).forward(z)))(bank.parameters)
    assert all(np.all(np.isfinite(grads[name])) for name in cb.PARAMETER_NAMES)


@pytest.mark.parametrize(
    ("pack", "message"),
    [
        (cb.RefinedPack(0, 1e300), r"slot 1: packs\[1\].center = 1e\+300 overflows to inf"),
        (cb.RefinedPack(0, 0.0, -1e300), r"slot 1: packs\[1\].weight = -1e\+300 overflows"),
        (cb.RefinedPack(0, 0.0, 1.0, 1e39), r"slot 1: packs\[1\].scale = 1e\+39 overflows"),
        (cb.RefinedPack(0, 0.0, 1.0, 1e-50), r"slot 1: packs\[1\].scale = 1e-50 rounds to 0"),
    ],
)
def test_a_float32_bank_refuses_values_the_cast_makes_non_finite(pack, message):
    with pytest.raises(ValueError, match=message):
        cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 1.0), pack], dtype=jnp.float32)


def test_an_age_that_does_not_fit_the_metadata_integer_is_refused():
    with pytest.raises(
        ValueError,
        match=r"slot 0: packs\[0\].age = 2{70} does not fit".replace("2{70}", str(2**70)),
    ):
        cb.init_confluent_bank([cb.RefinedPack(0, 0.0, age=2**70)])


def test_values_that_survive_the_cast_are_stored_rounded():
    bank = cb.init_confluent_bank([cb.RefinedPack(0, 1e30, 0.1, 3e-40)], dtype=jnp.float32)
    assert bank.centers[0] == np.float32(1e30) and bank.scales[0] == np.float32(3e-40)
