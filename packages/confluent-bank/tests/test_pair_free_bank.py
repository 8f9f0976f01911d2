"""A bank built with `max_pairs=0` holds no centred pair and has no pair code (issue 24,
item 3: the first step's compile).

Its values and gradients are those of the same bank built to hold pairs, its traced forward
has no pair branch, a commit or proposal that would make a pair is refused or not made, the
growing policy merges into moments alone (`test_growing.py`), and a checkpoint keeps the
bound.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import always, commit_pair, jaxpr_equations, make_pair_bank, moments, set_rows

import confluent_bank as cb

Z = jnp.asarray([-np.inf, -3.0, -0.7, 0.0, 0.4, 1.9, np.inf])
FINITE = jnp.linspace(-2.5, 2.5, 11)


def mixed_bank(max_pairs: int | None) -> cb.ConfluentPackBank:
    """Ordinary atoms of orders 0-2 and, from the cluster commit below, a moment slot."""
    packs = [
        cb.RefinedPack(0, -1.0, 0.8, 1.2),
        cb.RefinedPack(0, -0.99, -0.3, 1.2),
        cb.RefinedPack(1, 0.4, 0.5, 0.9),
        cb.RefinedPack(2, 1.1, -0.2, 1.5),
    ]
    bank = cb.init_confluent_bank(packs, max_packs=6, max_order=3, max_pairs=max_pairs)
    proposal = bank.propose_cluster((0, 1), order=2, error_budget=1.0)
    state = moments(bank)
    bank, _, accepted = cb.commit_transition(
        bank, proposal, state, between_steps=True, acceptance=always
    )
    assert accepted and int(bank.modes[0]) == cb.SlotMode.MOMENTS
    return bank


def gradient(bank: cb.ConfluentPackBank, z: jax.Array) -> dict:
    def objective(parameters):
        return jnp.sum(jnp.sin(3 * bank.with_parameters(parameters).forward(z)))

    return jax.grad(objective)(bank.parameters)


def primitives(bank: cb.ConfluentPackBank) -> set[str]:
    """The primitives in the traced gradient of `bank`'s forward, nested jaxprs included."""

    def objective(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(FINITE))

    jaxpr = jax.make_jaxpr(jax.grad(objective))(bank.parameters).jaxpr
    return {equation.primitive.name for equation in jaxpr_equations(jaxpr)}


@pytest.mark.parametrize("reference", [None, 1], ids=["any-number", "one"])
def test_a_bank_without_pairs_gives_the_values_of_one_that_may_hold_them(reference):
    np.testing.assert_array_equal(mixed_bank(0).slot_terms(Z), mixed_bank(reference).slot_terms(Z))


def test_a_bank_without_pairs_gives_the_gradient_of_one_that_may_hold_them():
    expected, got = gradient(mixed_bank(None), Z), gradient(mixed_bank(0), Z)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_bank_without_pairs_traces_no_pair_branch():
    assert "cond" in primitives(mixed_bank(None))
    assert "cond" not in primitives(mixed_bank(0))


def test_a_pair_commit_into_a_bank_without_pairs_is_refused_by_name():
    bank = make_pair_bank(max_pairs=0)
    with pytest.raises(ValueError, match=r"leave 1 centred pairs active, above .*max_pairs=0"):
        commit_pair(bank, moments(bank))


def test_detect_transitions_proposes_no_merge_for_a_bank_without_pairs():
    def fewer_slots(b):
        return -float(jnp.sum(b.active))

    assert len(cb.detect_transitions(make_pair_bank(), fewer_slots)) > 0
    assert cb.detect_transitions(make_pair_bank(max_pairs=0), fewer_slots) == ()


def test_a_pair_edited_into_a_bank_without_pairs_gives_nan_not_a_missing_term():
    bank = set_rows(mixed_bank(0), [("modes", 3, cb.SlotMode.PAIR), ("rho", 3, 0.2)])
    terms = bank.slot_terms(FINITE)
    assert bool(jnp.all(jnp.isnan(terms[3])))
    assert bool(jnp.all(jnp.isfinite(terms[:3])))
    assert bool(jnp.all(jnp.isnan(bank.forward(FINITE))))


def test_a_checkpoint_keeps_max_pairs_zero():
    bank = mixed_bank(0)
    assert bank.portable_snapshot()["__configuration__"]["max_pairs"] == 0
    restored = cb.bank_from_checkpoint(bank.checkpoint())
    assert restored.max_pairs == 0
    np.testing.assert_array_equal(restored.forward(FINITE), bank.forward(FINITE))


def test_a_checkpoint_of_a_bank_without_pairs_that_holds_one_is_refused():
    checkpoint = set_rows(mixed_bank(None), [("modes", 3, cb.SlotMode.PAIR)]).checkpoint()
    checkpoint["state"]["__configuration__"]["max_pairs"] = 0
    with pytest.raises(ValueError, match=r"1 active centred pairs above max_pairs=0"):
        cb.bank_from_checkpoint(checkpoint)
