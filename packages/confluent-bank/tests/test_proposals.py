"""Proposal rules (spec section 3.1-3.5): preconditions, error texts, exact values, JSON."""

import dataclasses
import json
from fractions import Fraction
from math import factorial

import numpy as np
import pytest
from helpers import PB_DIGEST

import confluent_bank as cb
from confluent_bank import _host

PAIR_JSON = (
    '{"coordinate_identity":"exact_real_coordinate_identity_with_recorded_float_operands",'
    '"error_budget":0.0,"kind":"centered_pair","schema_version":1,"slot_ids":[0,1],'
    f'"source_digest":"{PB_DIGEST}","source_version":0,"updates":['
    '{"index":0,"name":"centers","value":0.0},{"index":0,"name":"weights","value":1.0},'
    '{"index":0,"name":"rho","value":0.015625},{"index":0,"name":"odd_moments","value":0.375},'
    '{"index":0,"name":"modes","value":1.0},{"index":0,"name":"directions","value":0.0},'
    '{"index":0,"name":"direction_bias","value":1.0},{"index":1,"name":"active","value":0.0},'
    '{"index":1,"name":"weights","value":0.0},{"index":1,"name":"odd_moments","value":0.0}]}'
)


@pytest.fixture(scope="module")
def pb(pair_bank):
    """The spec's pair bank PB (conftest's session fixture)."""
    return pair_bank


@pytest.fixture(scope="module")
def pair_committed(pb):
    bank, _, _ = cb.commit_transition(
        pb,
        pb.propose_pair(0, 1),
        {},
        between_steps=True,
        acceptance=lambda b, p: True,
        state_adapter=lambda state, bank, slots: state,
    )
    return bank


def _updates(proposal):
    return [(u.name, u.index, u.value) for u in proposal.updates]


# --- pair ------------------------------------------------------------------------------------


def test_pair_proposal_json_reproduces_the_reference_exactly(pb):
    assert pb.propose_pair(0, 1).to_json() == PAIR_JSON


def test_pair_proposal_round_trips_through_json(pb):
    proposal = pb.propose_pair(0, 1)
    assert cb.TransitionProposal.from_json(proposal.to_json()) == proposal


def test_module_function_and_method_give_the_same_proposal(pb):
    assert cb.propose_pair(pb, 0, 1) == pb.propose_pair(0, 1)


def test_pair_values_follow_the_exact_rational_formulas():
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(0, 0.1, 0.3, 1.7), cb.RefinedPack(0, -0.35, -1.1, 1.7)],
        max_packs=2,
        max_order=1,
    )
    s, c, a = Fraction(1.7), (Fraction(0.1), Fraction(-0.35)), (Fraction(0.3), Fraction(-1.1))
    b = [-s * cj for cj in c]
    half, mean = abs(b[0] - b[1]) / 2, (b[0] + b[1]) / 2
    expected = {
        "centers": float(-mean / s),
        "weights": float(a[0] + a[1]),
        "rho": float(half * half),
        "odd_moments": float((b[0] - b[1]) * (a[0] - a[1]) / 2),
    }
    values = {name: value for name, index, value in _updates(bank.propose_pair(0, 1)) if index == 0}
    assert {name: values[name] for name in expected} == expected


def test_pair_of_identical_centres_is_a_duplicate_merge():
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(0, 0.5, 1.0), cb.RefinedPack(0, 0.5, 2.0)], max_packs=2, max_order=0
    )
    proposal = bank.propose_pair(0, 1)
    assert proposal.kind == "duplicate_merge"
    values = dict(((name, index), value) for name, index, value in _updates(proposal))
    assert values[("weights", 0)] == 3.0 and values[("rho", 0)] == 0.0


@pytest.mark.parametrize("slots", [(0, 0), (0, 4), (-1, 0)])
def test_pair_needs_two_distinct_slots_in_range(pb, slots):
    with pytest.raises(ValueError, match="two distinct live slots"):
        pb.propose_pair(*slots)


@pytest.mark.parametrize("slots", [(0, 2), (0, 3), (3, 1)])
def test_pair_needs_live_ordinary_order_zero_slots(pb, slots):
    # slot 2 has order 1, slot 3 is empty
    with pytest.raises(ValueError, match="ordinary order-zero live slots"):
        pb.propose_pair(*slots)


def test_pair_needs_bitwise_identical_nonzero_scales(pb):
    nudged = dataclasses.replace(pb, scales=pb.scales.at[1].set(np.nextafter(1.0, 2.0)))
    with pytest.raises(ValueError, match="identical nonzero weights"):
        nudged.propose_pair(0, 1)
    zero = dataclasses.replace(pb, scales=pb.scales.at[:2].set(0.0))
    with pytest.raises(ValueError, match="identical nonzero weights"):
        zero.propose_pair(0, 1)


def test_pair_range_is_checked_before_the_state_is_read(pb, monkeypatch):
    monkeypatch.setattr(_host, "read_host_state", _forbidden_read)
    with pytest.raises(ValueError, match="two distinct"):
        pb.propose_pair(0, 9)


@pytest.mark.parametrize("slot", [1.0, True, "0", None])
def test_slot_positions_must_be_integers(pb, slot):
    with pytest.raises(TypeError, match="integer slot position"):
        pb.propose_pair(slot, 1)


@pytest.mark.parametrize("budget", [float("nan"), -1e-9, float("inf")])
def test_invalid_error_budgets_are_rejected(pb, budget):
    with pytest.raises(ValueError, match="error_budget"):
        pb.propose_pair(0, 1, error_budget=budget)


def _forbidden_read(bank):
    raise AssertionError("the bank state must not be read")


class _UnreadableBlock:
    """Stands in for a device array: any per-element read fails the test."""

    shape = (4,)

    def __getitem__(self, item):
        raise AssertionError("per-element device read")

    def __array__(self, *args, **kwargs):
        raise AssertionError("implicit device read")

    def __float__(self):
        raise AssertionError("implicit device read")


def test_a_proposal_reads_the_device_once_then_works_on_host_numbers(pb, monkeypatch):
    state = _host.read_host_state(pb)
    calls = []

    def counting_read(bank):
        calls.append(bank)
        return state

    # A duck-typed bank whose blocks cannot be read element by element.
    fake = dataclasses.replace(pb, **{name: _UnreadableBlock() for name in cb.STATE_NAMES})
    monkeypatch.setattr(_host, "read_host_state", counting_read)
    assert fake.propose_pair(0, 1).to_json() == PAIR_JSON
    fake.propose_cluster((0, 1), order=2, error_budget=0.0)
    fake.propose_birth(3, cb.RefinedPack(1, 0.0))
    assert len(calls) == 3


# --- cluster ---------------------------------------------------------------------------------


def test_cluster_row_reproduces_the_reference_regression(cluster_bank):
    proposal = cluster_bank.propose_cluster((0, 1, 2), order=3, error_budget=1e-7)
    values = {(name, index): value for name, index, value in _updates(proposal)}
    assert values[("centers", 0)] == 0.0033333333333333335
    assert values[("modes", 0)] == 2 and values[("orders", 0)] == 3
    assert values[("moment_coefficients", 0)] == (
        1.0,
        0.0003333333333333327,
        0.00013055555555555555,
        -1.1049382716049385e-07,
        0.0,
    )
    assert values[("active", 1)] == 0 and values[("weights", 2)] == 0
    assert proposal.kind == "cluster_to_moments" and proposal.error_budget == 1e-7
    assert proposal.slot_ids == (0, 1, 2)


def test_cluster_moments_are_exact_taylor_moments_rounded_once(cluster_bank):
    bank = cluster_bank
    row = dict(
        ((n, i), v) for n, i, v in _updates(bank.propose_cluster((2, 0), order=4, error_budget=1.0))
    )
    centres, weights = [Fraction(0.02), Fraction(-0.01)], [Fraction(0.5), Fraction(0.7)]
    mean = sum(centres) / 2
    exact = [
        sum(a * (-(c - mean)) ** k for a, c in zip(weights, centres, strict=True)) / factorial(k)
        for k in range(5)
    ]
    assert row[("moment_coefficients", 2)] == tuple(float(m) for m in exact)
    assert row[("centers", 2)] == float(mean)


def test_cluster_json_keeps_integer_metadata_and_round_trips(cluster_bank):
    proposal = cluster_bank.propose_cluster((0, 1, 2), order=3, error_budget=1e-7)
    parsed = json.loads(proposal.to_json())
    assert {"index": 0, "name": "modes", "value": 2} in parsed["updates"]
    assert cb.TransitionProposal.from_json(proposal.to_json()) == proposal


def test_a_one_slot_cluster_is_allowed(cluster_bank):
    proposal = cluster_bank.propose_cluster((1,), order=0, error_budget=0.0)
    assert [u.name for u in proposal.updates] == [
        "centers",
        "modes",
        "orders",
        "moment_coefficients",
    ]


@pytest.mark.parametrize(
    ("slots", "order"), [((), 1), ((0, 0), 1), ((0, 4), 1), ((0, 1), -1), ((0, 1), 5)]
)
def test_cluster_needs_distinct_slots_and_an_order_within_budget(cluster_bank, slots, order):
    with pytest.raises(ValueError, match="valid distinct slots and an order within the bank"):
        cluster_bank.propose_cluster(slots, order=order, error_budget=0.0)


def test_cluster_needs_a_nonzero_common_scale(cluster_bank):
    bank = cluster_bank
    bank = dataclasses.replace(bank, scales=bank.scales.at[0].set(0.0))
    with pytest.raises(ValueError, match="nonzero common weight required"):
        bank.propose_cluster((0, 1), order=1, error_budget=0.0)


def test_cluster_needs_active_ordinary_order_zero_atoms_with_one_scale(pb):
    with pytest.raises(ValueError, match="ordinary order-zero atoms with a common weight"):
        pb.propose_cluster((0, 2), order=1, error_budget=0.0)  # slot 2 has order 1
    with pytest.raises(ValueError, match="ordinary order-zero atoms with a common weight"):
        pb.propose_cluster((0, 3), order=1, error_budget=0.0)  # slot 3 is inactive
    other_scale = dataclasses.replace(pb, scales=pb.scales.at[1].set(2.0))
    with pytest.raises(ValueError, match="ordinary order-zero atoms with a common weight"):
        other_scale.propose_cluster((0, 1), order=1, error_budget=0.0)


# --- derivative, removal, birth --------------------------------------------------------------


def test_derivative_sets_the_spread_of_a_live_pair_to_zero(pair_committed):
    proposal = pair_committed.propose_derivative(0, error_budget=1e-3)
    assert _updates(proposal) == [("rho", 0, 0.0)]
    assert proposal.kind == "pair_to_derivative" and proposal.error_budget == 1e-3
    assert proposal.source_version == 1


def test_derivative_needs_a_live_centred_pair(pb, pair_committed):
    with pytest.raises(ValueError, match="live centered-pair slot is required"):
        pb.propose_derivative(0, error_budget=0.0)
    with pytest.raises(ValueError, match="live centered-pair slot is required"):
        pair_committed.propose_derivative(1, error_budget=0.0)  # switched off by the merge
    with pytest.raises(ValueError, match="outside the bank"):
        pb.propose_derivative(4, error_budget=0.0)


def test_remove_zero_switches_off_an_exactly_zero_ordinary_slot(pb):
    bank = dataclasses.replace(pb, weights=pb.weights.at[2].set(0.0))
    proposal = bank.propose_remove_zero(2)
    assert _updates(proposal) == [("active", 2, 0)]
    assert proposal.kind == "remove_zero" and proposal.error_budget == 0.0


def test_remove_zero_needs_an_exactly_zero_live_ordinary_weight(pb, pair_committed):
    tiny = dataclasses.replace(pb, weights=pb.weights.at[2].set(5e-324))
    for bank, slot in [(tiny, 2), (pb, 3), (pair_committed, 1)]:
        with pytest.raises(ValueError, match="exactly zero ordinary output coefficient"):
            bank.propose_remove_zero(slot)
    zero_pair = dataclasses.replace(pair_committed, weights=pair_committed.weights.at[0].set(0))
    with pytest.raises(ValueError, match="exactly zero ordinary output coefficient"):
        zero_pair.propose_remove_zero(0)  # mode 1
    with pytest.raises(ValueError, match="outside the bank"):
        pb.propose_remove_zero(-1)


def test_birth_writes_the_complete_row(pb):
    proposal = pb.propose_birth(3, cb.RefinedPack(2, 0.4, 0, 1.3, age=5))
    assert _updates(proposal) == [
        ("centers", 3, 0.4),
        ("weights", 3, 0),
        ("scales", 3, 1.3),
        ("orders", 3, 2),
        ("ages", 3, 5),
        ("active", 3, 1),
        ("modes", 3, 0),
        ("rho", 3, 0),
        ("odd_moments", 3, 0),
        ("directions", 3, 0),
        ("direction_bias", 3, 1),
        ("moment_coefficients", 3, (0.0, 0.0, 0.0, 0.0)),
    ]
    assert proposal.kind == "zero_output_birth" and proposal.slot_ids == (3,)


def test_birth_needs_an_inactive_slot_and_a_zero_output_pack(pb):
    with pytest.raises(ValueError, match="inactive"):
        pb.propose_birth(0, cb.RefinedPack(0, 0.0))
    with pytest.raises(ValueError, match="zero output"):
        pb.propose_birth(3, cb.RefinedPack(1, 0.2, 1))
    with pytest.raises(ValueError, match="zero output"):
        pb.propose_birth(3, cb.RefinedPack(4, 0.2))  # max_order is 3
    with pytest.raises(ValueError, match="outside the bank"):
        pb.propose_birth(4, cb.RefinedPack(0, 0.2))
    with pytest.raises(TypeError, match="RefinedPack"):
        pb.propose_birth(3, (0, 0.2, 0.0))


def test_proposals_name_stable_ids_not_positions(pb):
    moved, _ = cb.permute_bank(
        pb, (3, 2, 1, 0), {}, between_steps=True, state_adapter=lambda s, b, p, q: s
    )
    proposal = moved.propose_pair(2, 3)  # positions 2, 3 hold the slots with ids 1, 0
    assert proposal.slot_ids == (1, 0)
    assert {u.index for u in proposal.updates} == {2, 3}
