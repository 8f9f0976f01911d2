"""A bank built with `max_pairs` evaluates the pair formulas on that many slots (issue 24,
item 3).

The active pairs are gathered into `max_pairs` rows, evaluated there and put back, so the
values must be those of the every-slot branch bit for bit and the gradients the same to
rounding, wherever the pairs sit and however many rows are empty. The capacity is static
configuration: validated at construction, kept by checkpoints, enforced at commit, and a bank
at capacity gets no merge proposals.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    BACKEND_COMPILES,
    PB_PAIR_DIGEST,
    always,
    commit_pair,
    custom_proposal,
    make_pair_bank,
    moments,
    set_rows,
)

import confluent_bank as cb

Z = jnp.asarray([-np.inf, -3.0, -0.7, 0.0, 0.4, 1.9, np.inf])
FINITE = jnp.linspace(-2.5, 2.5, 11)
ROUNDING = {"rtol": 1e-13, "atol": 1e-15}


def six_slot_bank(base: str = "sigmoid", max_pairs: int | None = None) -> cb.ConfluentPackBank:
    packs = [cb.RefinedPack(0, 0.4 * i - 1.0, 0.8 - 0.3 * i, 0.9 + 0.1 * i) for i in range(5)]
    return cb.init_confluent_bank(packs, max_packs=6, max_order=3, base=base, max_pairs=max_pairs)


def with_pairs(bank: cb.ConfluentPackBank, slots, first_rho: float = 1e-7) -> cb.ConfluentPackBank:
    """Turn `slots` into active pairs with distinct spreads, directions and odd moments: the
    first with spread `first_rho` and direction slope 0 (near the collision by default), the
    rest beyond it with non-zero slopes."""
    rows = []
    for k, slot in enumerate(slots):
        rows += [
            ("active", slot, True),
            ("modes", slot, 1),
            ("rho", slot, first_rho if k == 0 else 0.3 + 0.2 * k),
            ("odd_moments", slot, 0.5 - 0.3 * k),
            ("directions", slot, 0.2 * k),
            ("direction_bias", slot, 1.0 - 0.1 * k),
        ]
    return set_rows(bank, rows)


def capped(bank: cb.ConfluentPackBank, max_pairs: int) -> cb.ConfluentPackBank:
    return dataclasses.replace(bank, max_pairs=max_pairs)


def gradient(bank: cb.ConfluentPackBank, z: jax.Array) -> dict:
    def objective(parameters):
        return jnp.sum(jnp.sin(3 * bank.with_parameters(parameters).forward(z)))

    return jax.grad(objective)(bank.parameters)


# (slots holding pairs, rows, the first pair's spread): a first pair with spread 0.5 and slope 0
# lies beyond the series radius at every point, so alone in its rows it takes the far formula.
CASES = [
    ("one pair, one row", (2,), 1, 1e-7),
    ("one far pair, one row", (2,), 1, 0.5),
    ("one collided pair in the last slot, one row", (5,), 1, 0.0),
    ("two pairs, two rows", (0, 3), 2, 1e-7),
    ("one pair, three rows", (4,), 3, 1e-7),
    ("one far pair, three rows", (4,), 3, 0.5),
    ("no pair, one row", (), 1, 1e-7),
]
PARAMETERS = pytest.mark.parametrize(
    ("slots", "lanes", "first_rho"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
@PARAMETERS
def test_gathered_pairs_give_the_every_slot_values_bit_for_bit(base, slots, lanes, first_rho):
    every = with_pairs(six_slot_bank(base), slots, first_rho)
    np.testing.assert_array_equal(capped(every, lanes).slot_terms(Z), every.slot_terms(Z))


@PARAMETERS
def test_gathered_pairs_give_the_every_slot_gradient(slots, lanes, first_rho):
    every = with_pairs(six_slot_bank(), slots, first_rho)
    expected, got = gradient(every, FINITE), gradient(capped(every, lanes), FINITE)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], **ROUNDING, err_msg=name)
    if slots:  # the gathered slots really got their gradient
        assert float(jnp.abs(got["odd_moments"][slots[0]])) > 0


@pytest.mark.parametrize("first_rho", [1e-7, 0.5], ids=["near", "far"])
def test_gathered_pairs_have_finite_gradients_at_infinity_and_in_empty_rows(first_rho):
    bank = capped(with_pairs(six_slot_bank(), (1,), first_rho), 3)
    grads = gradient(bank, Z)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads.values())
    state_gradient = jax.grad(lambda z: jnp.sum(bank.forward(z) ** 2))(FINITE)
    assert bool(jnp.all(jnp.isfinite(state_gradient)))


def test_a_pair_beyond_the_capacity_gives_nan_not_a_missing_term():
    # Only a hand-edited bank gets here: commits refuse it.
    bank = capped(with_pairs(six_slot_bank(), (1, 4)), 1)
    terms = bank.slot_terms(FINITE)
    assert bool(jnp.all(jnp.isfinite(terms[1])))
    assert bool(jnp.all(jnp.isnan(terms[4])))
    assert bool(jnp.all(jnp.isnan(bank.forward(FINITE))))


def test_init_keeps_max_pairs_as_static_configuration():
    bank = six_slot_bank(max_pairs=2)
    assert bank.max_pairs == 2
    _, treedef = jax.tree_util.tree_flatten(bank)
    assert jax.tree_util.tree_unflatten(treedef, jax.tree_util.tree_leaves(bank)).max_pairs == 2
    assert cb.ConfluentPackBank.create([], max_packs=3, max_pairs=3).max_pairs == 3
    assert six_slot_bank().max_pairs is None


@pytest.mark.parametrize("value", [7, -1])
def test_init_refuses_max_pairs_outside_zero_to_max_packs(value):
    with pytest.raises(ValueError, match=rf"max_pairs must be in 0..max_packs=6 .*got {value}"):
        six_slot_bank(max_pairs=value)


@pytest.mark.parametrize("value", [1.0, True, "1"])
def test_init_refuses_a_max_pairs_that_is_not_an_integer(value):
    with pytest.raises(TypeError, match="max_pairs must be an integer or None"):
        six_slot_bank(max_pairs=value)


def test_a_commit_that_would_exceed_max_pairs_is_refused_by_name():
    bank = make_pair_bank(max_pairs=1)
    paired, state, accepted = commit_pair(bank, moments(bank))
    assert accepted
    # A second pair by hand-made proposal: slot 2 (order 1) turned into a pair.
    proposal = custom_proposal(paired, [("modes", 2, 1), ("orders", 2, 0)], slot_ids=(2,))
    with pytest.raises(ValueError, match=r"leave 2 centred pairs active, above .*max_pairs=1"):
        cb.commit_transition(paired, proposal, state, between_steps=True, acceptance=always)


def test_a_bank_below_capacity_commits_its_pair_as_before():
    capped_bank, plain = make_pair_bank(max_pairs=1), make_pair_bank()
    committed, _, accepted = commit_pair(capped_bank, moments(capped_bank))
    reference, _, _ = commit_pair(plain, moments(plain))
    assert accepted and committed.max_pairs == 1
    np.testing.assert_array_equal(committed.forward(FINITE), reference.forward(FINITE))


def test_detect_transitions_proposes_no_merge_at_capacity():
    bank = make_pair_bank(max_pairs=1)

    def fewer_slots(b):
        return -float(jnp.sum(b.active))

    assert len(cb.detect_transitions(bank, fewer_slots)) > 0
    paired, _, _ = commit_pair(bank, moments(bank))
    assert cb.detect_transitions(paired, fewer_slots) == ()


def test_a_commit_under_max_pairs_does_not_recompile_the_forward():
    bank = make_pair_bank(max_pairs=1)
    forward = jax.jit(lambda b, z: b.forward(z))
    before = forward(bank, FINITE)
    jax.block_until_ready(before)
    paired, _, _ = commit_pair(bank, moments(bank))
    compiles = len(BACKEND_COMPILES)
    after = forward(paired, FINITE)
    jax.block_until_ready(after)
    assert len(BACKEND_COMPILES) == compiles
    np.testing.assert_allclose(after, before, rtol=0, atol=3e-16)


def test_a_checkpoint_keeps_max_pairs():
    bank, _, _ = commit_pair(make_pair_bank(max_pairs=2), moments(make_pair_bank(max_pairs=2)))
    restored = cb.bank_from_checkpoint(bank.checkpoint())
    assert restored.max_pairs == 2
    np.testing.assert_array_equal(restored.forward(FINITE), bank.forward(FINITE))


def test_a_bank_without_max_pairs_keeps_its_snapshot_and_digest():
    bank, _, _ = commit_pair(make_pair_bank(), moments(make_pair_bank()))
    assert "max_pairs" not in bank.portable_snapshot()["__configuration__"]
    assert cb.snapshot_digest(bank.portable_snapshot()) == PB_PAIR_DIGEST


def test_a_checkpoint_with_more_pairs_than_max_pairs_is_refused():
    bank = with_pairs(six_slot_bank(max_pairs=2), (1, 4))
    checkpoint = bank.checkpoint()
    checkpoint["state"]["__configuration__"]["max_pairs"] = 1
    with pytest.raises(ValueError, match=r"2 active centred pairs above max_pairs=1"):
        cb.bank_from_checkpoint(checkpoint)


@pytest.mark.parametrize(("value", "message"), [(-1, "max_pairs must be in"), (1.5, "integer")])
def test_a_checkpoint_with_a_bad_max_pairs_is_refused(value, message):
    checkpoint = six_slot_bank(max_pairs=2).checkpoint()
    checkpoint["state"]["__configuration__"]["max_pairs"] = value
    with pytest.raises(ValueError, match=message):
        cb.bank_from_checkpoint(checkpoint)
