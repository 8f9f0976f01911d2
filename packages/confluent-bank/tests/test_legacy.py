"""The legacy bank and its migration (spec 2.6; seed checkpoint/migration test)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb

PACKS = [cb.RefinedPack(0, 0.1, 0.7), cb.RefinedPack(1, 0.3, 0.2)]


@pytest.fixture(scope="module")
def legacy():
    return cb.init_pack_bank(PACKS, max_packs=4, max_order=3, base="sigmoid")


def test_init_pack_bank_defaults_to_exp_and_int32_metadata():
    bank = cb.init_pack_bank(PACKS)
    assert bank.base == "exp" and bank.max_packs == 16 and bank.max_order == 8
    assert bank.orders.dtype == jnp.int32 and bank.ages.dtype == jnp.int32
    assert bank.centers.dtype == jnp.float64 and bank.active.dtype == jnp.bool_
    np.testing.assert_array_equal(bank.active[:3], [True, True, False])


@pytest.mark.parametrize(
    ("packs", "kwargs", "match"),
    [
        (PACKS, {"max_packs": 0}, "max_packs"),
        (PACKS, {"max_order": -1}, "max_order"),
        (PACKS * 3, {"max_packs": 4}, "capacity"),
        (PACKS, {"max_order": 0}, "max_order"),
    ],
)
def test_init_pack_bank_validation(packs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cb.init_pack_bank(packs, **kwargs)


def test_legacy_forward_is_the_sum_of_ordinary_atoms(legacy):
    x = jnp.array([0.1, 0.2, -0.4])
    s = jax.nn.sigmoid
    expected = 0.7 * s(x - 0.1) + 0.2 * s(x - 0.3) * (1 - s(x - 0.3))
    np.testing.assert_allclose(cb.legacy_forward(legacy, x), expected, rtol=0, atol=2e-16)


def test_legacy_forward_flattens_scalars_and_trailing_singletons(legacy):
    x = jnp.array([0.1, 0.2, -0.4])
    flat = cb.legacy_forward(legacy, x)
    assert cb.legacy_forward(legacy, jnp.asarray(0.1)).shape == (1,)
    column = cb.legacy_forward(legacy, x[:, None])
    assert column.shape == (3, 1)
    np.testing.assert_array_equal(column[:, 0], flat)
    with pytest.raises(ValueError, match="shape"):
        cb.legacy_forward(legacy, jnp.zeros((3, 2)))


def test_exp_legacy_bank_uses_exponential_derivatives():
    bank = cb.init_pack_bank([cb.RefinedPack(2, 0.0, 1.5, 2.0)], max_packs=1, max_order=2)
    x = jnp.array([0.0, 0.5])
    np.testing.assert_allclose(cb.legacy_forward(bank, x), 1.5 * 4 * jnp.exp(2 * x), rtol=1e-15)


def test_migration_preserves_the_forward_value(legacy):
    migrated = cb.migrate_legacy(legacy)
    x = jnp.array([0.1, 0.2])
    np.testing.assert_allclose(migrated.forward(x), cb.legacy_forward(legacy, x), atol=1e-16)


def test_migration_keeps_legacy_arrays_and_fills_empty_slot_values(legacy):
    migrated = cb.migrate_legacy(legacy)
    assert migrated.orders.dtype == jnp.int32 and migrated.ages.dtype == jnp.int32
    assert migrated.modes.dtype == jnp.asarray(0).dtype
    np.testing.assert_array_equal(migrated.centers, legacy.centers)
    np.testing.assert_array_equal(migrated.modes, 0)
    np.testing.assert_array_equal(migrated.direction_bias, 1.0)
    assert migrated.max_order == 3 and migrated.base == "sigmoid"


def test_exp_legacy_banks_cannot_migrate():
    with pytest.raises(ValueError, match="sigmoid/tanh"):
        cb.migrate_legacy(cb.init_pack_bank(PACKS))
