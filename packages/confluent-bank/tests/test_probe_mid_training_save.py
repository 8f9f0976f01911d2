"""The probe's mid-training save scenarios (issue 22, item 8): a bank whose spread `rho` went
slightly negative between `retract()` calls saves anyway, as its retraction.

The forward pass reads `rho` through `retract_spread`, so the saved bank evaluates exactly
(bit for bit) like the bank in memory, which itself is not changed by the save. Only finite
spreads are retracted: NaN or an infinite spread is still refused, never saved as 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import retracted_snapshot

import confluent_bank as cb

Z = jnp.linspace(-3.0, 3.0, 41)

NEGATIVE_SPREADS = {
    "the pair slot": {0: -1e-3},
    "a tiny negative": {0: -1e-30},
    # A device flushing subnormals compares these as -0, so retract() keeps them.
    "a negative subnormal": {0: -1e-40, 1: -1e-320},
    "inactive slots too": {0: -0.5, 2: -2.0, 3: -1e-9},
}


def _mid_training(bank, spreads, dtype):
    bank = bank if dtype is None else _as_dtype(bank, dtype)
    rho = np.array(bank.rho)  # set on the host: a device op would flush the subnormals
    for slot, value in spreads.items():
        rho[slot] = value
    return dataclasses.replace(bank, rho=jax.device_put(rho))


def _as_dtype(bank, dtype):
    return dataclasses.replace(
        bank, **{name: getattr(bank, name).astype(dtype) for name in cb.PARAMETER_NAMES}
    )


@pytest.mark.parametrize("dtype", [None, jnp.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("spreads", NEGATIVE_SPREADS)
def test_a_bank_with_a_negative_spread_saves_loads_and_evaluates_equal(
    tmp_path, pair_committed_bank, spreads, dtype
):
    bank = _mid_training(pair_committed_bank, NEGATIVE_SPREADS[spreads], dtype)
    assert np.any(np.asarray(bank.rho) < 0)
    restored = cb.load_checkpoint(cb.save_checkpoint(tmp_path / "bank.json", bank))
    np.testing.assert_array_equal(restored.forward(Z), bank.forward(Z))
    assert np.all(np.asarray(restored.rho) >= 0)
    assert restored.portable_snapshot() == retracted_snapshot(bank)


def test_saving_leaves_the_bank_in_memory_untouched(tmp_path, pair_committed_bank):
    bank = _mid_training(pair_committed_bank, {0: -1e-3}, None)
    before = cb.snapshot_digest(bank.portable_snapshot())
    rho = bank.rho
    cb.save_checkpoint(tmp_path / "bank.json", bank)
    assert bank.rho is rho and float(bank.rho[0]) == -1e-3
    assert cb.snapshot_digest(bank.portable_snapshot()) == before


def test_a_bank_without_negative_spreads_is_saved_as_it_is(tmp_path, pair_committed_bank):
    restored = cb.load_checkpoint(cb.save_checkpoint(tmp_path / "bank.json", pair_committed_bank))
    assert restored.portable_snapshot() == pair_committed_bank.portable_snapshot()


@pytest.mark.parametrize("bad", [np.nan, -np.inf, np.inf], ids=["nan", "-inf", "inf"])
def test_a_non_finite_spread_is_refused_not_retracted_to_zero(tmp_path, pair_committed_bank, bad):
    # retract_spread(NaN) and retract_spread(-inf) are 0: retracting would hide the divergence.
    bank = _mid_training(pair_committed_bank, {0: bad, 1: -1e-3}, None)
    with pytest.raises(ValueError, match=r"rho"):
        cb.save_checkpoint(tmp_path / "bank.json", bank)
    assert list(tmp_path.iterdir()) == []
