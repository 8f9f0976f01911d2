"""Tampered proposals never commit (issue 11, item 4): the updates of a built-in kind must be
exactly the ones its rule gives for the source bank, and no update may leave the
representation's ranges or overflow its block."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import pytest
from helpers import always, custom_proposal, moments

import confluent_bank as cb


def commit(bank, proposal, acceptance=always):
    return cb.commit_transition(
        bank, proposal, moments(bank), between_steps=True, acceptance=acceptance
    )


def edit_json(proposal, edit):
    data = json.loads(proposal.to_json())
    edit(data)
    return cb.TransitionProposal.from_json(json.dumps(data))


def set_update(data, name, index, value):
    for update in data["updates"]:
        if update["name"] == name and update["index"] == index:
            update["value"] = value
            return
    raise AssertionError(f"no update {name}[{index}]")


# --- built-in kinds must carry exactly their rule's updates ----------------------------------


def test_a_pair_proposal_with_edited_weights_is_refused(pair_bank):
    tampered = edit_json(pair_bank.propose_pair(0, 1), lambda d: set_update(d, "weights", 0, 4.8))
    with pytest.raises(ValueError, match="centered_pair"):
        commit(pair_bank, tampered)


def test_a_tampered_proposal_never_reaches_acceptance(pair_bank):
    tampered = edit_json(pair_bank.propose_pair(0, 1), lambda d: set_update(d, "rho", 0, 0.5))
    seen = []
    with pytest.raises(ValueError, match="not the ones"):
        commit(pair_bank, tampered, acceptance=lambda b, p: seen.append(p) or True)
    assert seen == []


def test_a_pair_proposal_with_an_extra_update_is_refused(pair_bank):
    proposal = pair_bank.propose_pair(0, 1)
    extra = dataclasses.replace(
        proposal, updates=(*proposal.updates, cb.SlotUpdate("scales", 1, 9.0))
    )
    with pytest.raises(ValueError, match="not the ones"):
        commit(pair_bank, extra)


def test_a_zero_sign_flip_counts_as_tampering(pair_bank):
    proposal = pair_bank.propose_pair(0, 1)
    flipped = edit_json(proposal, lambda d: set_update(d, "weights", 1, -0.0))
    with pytest.raises(ValueError, match="not the ones"):
        commit(pair_bank, flipped)


def test_a_derivative_relabelled_as_a_pair_is_refused(pair_committed_bank):
    derivative = pair_committed_bank.propose_derivative(0, error_budget=1e-6)
    relabelled = dataclasses.replace(derivative, kind="centered_pair")
    with pytest.raises(ValueError, match="centered_pair"):
        commit(pair_committed_bank, relabelled, acceptance=cb.within_error_budget((-3.0, 3.0)))


def test_within_error_budget_refuses_a_relabelled_derivative(pair_committed_bank):
    derivative = pair_committed_bank.propose_derivative(0, error_budget=1e-6)
    relabelled = dataclasses.replace(derivative, kind="centered_pair")
    with pytest.raises(ValueError, match="centered_pair"):
        cb.within_error_budget((-3.0, 3.0))(pair_committed_bank, relabelled)


def test_within_error_budget_still_judges_a_genuine_derivative(pair_committed_bank):
    derivative = pair_committed_bank.propose_derivative(0, error_budget=1e-6)
    assert not cb.within_error_budget((-3.0, 3.0))(pair_committed_bank, derivative)


def test_a_derivative_that_sets_a_different_spread_is_refused(pair_committed_bank):
    derivative = pair_committed_bank.propose_derivative(0, error_budget=1.0)
    tampered = edit_json(derivative, lambda d: set_update(d, "rho", 0, 0.25))
    with pytest.raises(ValueError, match="pair_to_derivative"):
        commit(pair_committed_bank, tampered)


def test_a_cluster_with_an_edited_moment_row_is_refused(cluster_bank):
    proposal = cluster_bank.propose_cluster((0, 1, 2), order=2, error_budget=1.0)
    tampered = edit_json(
        proposal, lambda d: set_update(d, "moment_coefficients", 0, [1.0, 0.0, 0.0, 0.0, 0.0])
    )
    with pytest.raises(ValueError, match="cluster_to_moments"):
        commit(cluster_bank, tampered)


def test_a_cluster_with_an_edited_order_is_refused(cluster_bank):
    proposal = cluster_bank.propose_cluster((0, 1, 2), order=2, error_budget=1.0)
    tampered = edit_json(proposal, lambda d: set_update(d, "orders", 0, 4))
    with pytest.raises(ValueError, match="cluster_to_moments"):
        commit(cluster_bank, tampered)


def test_a_birth_that_switches_on_a_nonzero_weight_is_refused(pair_bank):
    proposal = pair_bank.propose_birth(3, cb.RefinedPack(1, 0.4))
    tampered = edit_json(proposal, lambda d: set_update(d, "weights", 3, 2.0))
    with pytest.raises(ValueError, match="zero_output_birth"):
        commit(pair_bank, tampered)


def test_a_birth_with_a_different_pack_still_commits(pair_bank):
    # Centre, scale, order and age come from the pack, which the proposal may choose freely.
    proposal = pair_bank.propose_birth(3, cb.RefinedPack(1, 0.4, 0, 1.5))
    edited = edit_json(proposal, lambda d: set_update(d, "centers", 3, -0.7))
    born, _, accepted = commit(pair_bank, edited)
    assert accepted and float(born.centers[3]) == -0.7


def test_a_remove_zero_of_a_nonzero_atom_is_refused(pair_bank):
    bank = dataclasses.replace(pair_bank, weights=pair_bank.weights.at[2].set(0.0))
    proposal = bank.propose_remove_zero(2)
    moved = dataclasses.replace(proposal, slot_ids=(0,), updates=(cb.SlotUpdate("active", 0, 0),))
    with pytest.raises(ValueError, match="remove_zero"):
        commit(bank, moved)


def test_untampered_proposals_survive_a_json_round_trip_and_commit(pair_bank):
    proposal = cb.TransitionProposal.from_json(pair_bank.propose_pair(0, 1).to_json())
    _, _, accepted = commit(pair_bank, proposal, acceptance=cb.within_error_budget((-1.0, 1.0)))
    assert accepted


# --- every update stays in range and fits its block ------------------------------------------


@pytest.mark.parametrize(
    ("update", "match"),
    [
        (("modes", 0, 7), "modes"),
        (("orders", 0, 99), "orders"),
        (("orders", 0, -1), "orders"),
        (("rho", 0, -0.5), "rho"),
        (("ages", 0, -3), "ages"),
    ],
)
def test_out_of_range_values_are_refused(pair_bank, update, match):
    with pytest.raises(ValueError, match=match):
        commit(pair_bank, custom_proposal(pair_bank, [update]))


@pytest.mark.parametrize(
    "update",
    [
        ("orders", 0, 2**70),
        ("ages", 0, 2**70),
        ("ages", 0, -(2**70)),
        ("weights", 0, 10**400),
        ("moment_coefficients", 0, (0.0, 10**400, 0.0, 0.0)),
    ],
    ids=["orders", "ages+", "ages-", "weights", "moment_coefficients"],
)
def test_huge_update_values_are_a_value_error_naming_the_block(pair_bank, update):
    with pytest.raises(ValueError, match=update[0]):
        commit(pair_bank, custom_proposal(pair_bank, [update]))


def test_a_value_that_overflows_a_float32_block_is_refused():
    bank = cb.init_confluent_bank([cb.RefinedPack(0, 0.5)], max_packs=2, dtype=jnp.float32)
    with pytest.raises(ValueError, match="centers"):
        commit(bank, custom_proposal(bank, [("centers", 0, 1e300)]))


def test_a_birth_with_a_huge_age_is_a_value_error(pair_bank):
    # Refused when the proposal is built (no bank stores 2**70), before any commit.
    with pytest.raises(ValueError, match="ages"):
        commit(pair_bank, pair_bank.propose_birth(3, cb.RefinedPack(1, 0.4, age=2**70)))


def test_an_untouched_negative_spread_does_not_block_a_commit(pair_bank):
    # Mid-training, another slot's rho may be slightly negative until the next retract().
    bank = dataclasses.replace(pair_bank, rho=pair_bank.rho.at[3].set(-1e-3))
    _, _, accepted = commit(bank, bank.propose_pair(0, 1))
    assert accepted
