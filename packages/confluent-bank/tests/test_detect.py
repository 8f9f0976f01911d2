"""detect_transitions (spec 5): same proposals, same order as the straightforward search."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import always, forward

import confluent_bank as cb
from confluent_bank import _host


def reference_detect(bank, score, *, error_budget=0.0):
    """The reference algorithm: propose and fully commit every pair, rank by gain."""
    baseline = score(bank)
    ranked = []
    for first in range(bank.max_packs):
        for second in range(first + 1, bank.max_packs):
            try:
                proposal = bank.propose_pair(first, second, error_budget=error_budget)
            except ValueError:
                continue
            candidate, _, accepted = cb.commit_transition(
                bank,
                proposal,
                cb.NamedMomentState(jnp.asarray(0), {}),
                between_steps=True,
                acceptance=always,
            )
            if accepted:
                gain = score(candidate) - baseline
                if gain > 0:
                    ranked.append((-gain, proposal.slot_ids, proposal))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return tuple(item[2] for item in ranked)


def fewer_active(bank):
    return -float(jnp.sum(bank.active))


X = jnp.linspace(-2.0, 2.0, 7)


def spread(bank):
    """A score whose gain depends on the merged pair's spread (and on the candidate's values)."""
    values = forward(bank, X)
    return -float(jnp.sum(bank.active) + jnp.sum(bank.rho) + 1e-3 * jnp.sum(values**2))


def search_bank():
    """Seven slots: five ordinary order-0 atoms sharing a scale, one other scale, one order 1,
    then permuted so that stable ids and positions differ."""
    packs = [
        cb.RefinedPack(0, 0.1, 1.0, 0.5),
        cb.RefinedPack(0, -0.3, 2.0, 0.5),
        cb.RefinedPack(1, 0.2, 0.4, 0.5),
        cb.RefinedPack(0, 0.1, -1.5, 0.5),
        cb.RefinedPack(0, 0.6, 0.7, 1.5),
        cb.RefinedPack(0, 0.0, 0.3, 0.5),
        cb.RefinedPack(0, 0.25, -0.2, 0.5),
    ]
    bank = cb.init_confluent_bank(packs, max_packs=8, max_order=2)
    bank, _ = cb.permute_bank(
        bank, (5, 2, 7, 0, 6, 1, 4, 3), {}, between_steps=True, state_adapter=lambda s, b, p, q: s
    )
    return bank


def test_the_pair_bank_has_exactly_one_pair_to_merge(pair_bank):
    found = cb.detect_transitions(pair_bank, fewer_active)
    assert [(p.kind, p.slot_ids) for p in found] == [("centered_pair", (0, 1))]


@pytest.mark.parametrize("score", [fewer_active, spread], ids=["ties", "by_spread"])
def test_detection_equals_the_reference_search(score):
    bank = search_bank()
    expected = reference_detect(bank, score, error_budget=0.25)
    found = cb.detect_transitions(bank, score, error_budget=0.25)
    assert len(expected) == 10  # C(5, 2) pairs share the common scale 0.5
    assert found == expected
    assert all(p.error_budget == 0.25 for p in found)


def test_scored_candidates_are_exactly_the_committed_banks():
    bank = search_bank()
    seen_fast, seen_reference = [], []

    def recording(store):
        def score(candidate):
            store.append(candidate.portable_snapshot())
            return spread(candidate)

        return score

    cb.detect_transitions(bank, recording(seen_fast))
    reference_detect(bank, recording(seen_reference))
    assert len(seen_fast) == 11 and seen_fast == seen_reference


def test_detection_reads_the_bank_once(monkeypatch):
    bank = search_bank()
    reads = []
    real = _host.read_host_state
    monkeypatch.setattr(_host, "read_host_state", lambda b: reads.append(1) or real(b))
    assert len(cb.detect_transitions(bank, fewer_active)) == 10
    assert reads == [1]


def test_all_results_share_one_source_and_go_stale_after_one_commit():
    bank = search_bank()
    found = cb.detect_transitions(bank, fewer_active)
    assert len({(p.source_digest, p.source_version) for p in found}) == 1
    merged, _, _ = cb.commit_transition(
        bank, found[0], cb.NamedMomentState(0, {}), between_steps=True, acceptance=always
    )
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(
            merged, found[1], cb.NamedMomentState(0, {}), between_steps=True, acceptance=always
        )


def test_nothing_is_returned_without_a_positive_gain():
    assert cb.detect_transitions(search_bank(), lambda bank: 1.0) == ()


def test_a_bank_without_mergeable_pairs_gives_an_empty_tuple(pair_bank):
    bank = pair_bank
    bank = dataclasses.replace(bank, scales=bank.scales.at[1].set(2.0))
    assert cb.detect_transitions(bank, fewer_active) == ()


@pytest.mark.parametrize("budget", [-1.0, float("nan"), float("inf")])
def test_invalid_error_budget_is_rejected_even_without_candidates(budget):
    bank = cb.init_confluent_bank([], max_packs=2, max_order=0)
    with pytest.raises(ValueError, match="error_budget"):
        cb.detect_transitions(bank, fewer_active, error_budget=budget)


def test_score_must_be_a_real_number(pair_bank):
    with pytest.raises(TypeError, match="conditioning_score"):
        cb.detect_transitions(pair_bank, lambda bank: "better")


def test_jax_scalar_scores_are_accepted(pair_bank):
    found = cb.detect_transitions(pair_bank, lambda bank: -jnp.sum(bank.active))
    assert [p.slot_ids for p in found] == [(0, 1)]
    assert np.isfinite(found[0].error_budget)
