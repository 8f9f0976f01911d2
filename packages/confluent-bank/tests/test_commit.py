"""commit_transition (spec 3.6): the functional host transaction, its checks and its order."""

import dataclasses
import os
import subprocess
import sys
import textwrap

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
    forward,
    moments,
)

import confluent_bank as cb
from confluent_bank import _commit as commit
from confluent_bank import _host

X9 = jnp.linspace(-0.5, 0.5, 9)


@pytest.fixture(scope="module")
def pb(pair_bank):
    """The spec's pair bank PB (conftest's session fixture)."""
    return pair_bank


@pytest.fixture(scope="module")
def committed(pb):
    state = moments(pb)
    candidate, next_state, accepted = commit_pair(pb, state)
    assert accepted
    return candidate, next_state, state


# --- the transaction (seed test 1) -----------------------------------------------------------


def test_commit_bumps_the_version_and_leaves_the_original_untouched(pb, committed):
    candidate, _, _ = committed
    assert int(candidate.transition_version) == 1 and int(pb.transition_version) == 0
    assert bool(pb.active[1]) and not bool(candidate.active[1])
    assert int(candidate.modes[0]) == 1


def test_commit_reproduces_the_reference_digest_and_forward(pb, committed):
    candidate, _, _ = committed
    assert cb.snapshot_digest(candidate.portable_snapshot()) == PB_PAIR_DIGEST
    np.testing.assert_allclose(forward(candidate, X9), forward(pb, X9), rtol=0, atol=3e-16)


def test_commit_resets_the_moment_rows_of_the_affected_slots_only(committed):
    _, next_state, state = committed
    assert next_state.step is state.step
    for kind, fill in (("first", 1.0), ("second", 2.0)):
        for name, value in next_state.moments[kind].items():
            value = np.asarray(value)
            assert np.all(value[:2] == 0), (kind, name)
            assert np.all(value[2:] == fill), (kind, name)


def test_committing_the_same_proposal_twice_is_stale(pb, committed):
    candidate, next_state, _ = committed
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(
            candidate, pb.propose_pair(0, 1), next_state, between_steps=True, acceptance=always
        )


def test_a_changed_configuration_makes_a_proposal_stale(pb):
    tanh = dataclasses.replace(pb, base="tanh")
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(
            tanh, pb.propose_pair(0, 1), moments(pb), between_steps=True, acceptance=always
        )


def test_a_changed_value_or_version_makes_a_proposal_stale(pb):
    proposal = pb.propose_pair(0, 1)
    trained = dataclasses.replace(pb, weights=pb.weights.at[2].add(1e-12))
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(trained, proposal, moments(pb), between_steps=True, acceptance=always)
    wrong_version = dataclasses.replace(proposal, source_version=3)
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(pb, wrong_version, moments(pb), between_steps=True, acceptance=always)


# --- order of the checks and rollback (seed test 5) ------------------------------------------


def test_between_steps_is_checked_first(pb, committed):
    candidate, _, _ = committed
    stale = pb.propose_pair(0, 1)
    with pytest.raises(RuntimeError, match="between"):
        cb.commit_transition(candidate, stale, moments(pb), between_steps=False, acceptance=always)


def test_unknown_stable_ids_are_rejected_before_acceptance(pb):
    proposal = custom_proposal(pb, [("weights", 0, 1.0)], slot_ids=(0, 17))
    seen = []
    with pytest.raises(ValueError, match="unknown stable slot IDs"):
        cb.commit_transition(
            pb,
            proposal,
            moments(pb),
            between_steps=True,
            acceptance=lambda b, p: seen.append(p) or True,
        )
    assert seen == []


def test_stale_proposals_never_reach_acceptance(pb, committed):
    candidate, _, _ = committed
    seen = []
    with pytest.raises(ValueError, match="stale"):
        cb.commit_transition(
            candidate,
            pb.propose_pair(0, 1),
            moments(pb),
            between_steps=True,
            acceptance=lambda b, p: seen.append(p) or True,
        )
    assert seen == []


def test_rejection_returns_the_identical_objects(pb):
    state = moments(pb)
    proposal = pb.propose_pair(0, 1)
    seen = []
    bank, same_state, accepted = cb.commit_transition(
        pb,
        proposal,
        state,
        between_steps=True,
        acceptance=lambda b, p: seen.append((b, p)) or False,
    )
    assert (bank is pb, same_state is state, accepted) == (True, True, False)
    assert seen == [(pb, proposal)]


def test_a_failed_postcondition_rolls_back_bank_and_state(pb):
    state = moments(pb)
    seen = []
    bank, same_state, accepted = commit_pair(
        pb, state, postcondition=lambda candidate: seen.append(candidate) or False
    )
    assert (bank is pb, same_state is state, accepted) == (True, True, False)
    assert int(seen[0].transition_version) == 1


def test_an_adapter_receives_state_candidate_and_slot_positions(pb):
    seen = []

    def adapter(state, candidate, slots):
        seen.append((state, int(candidate.transition_version), slots))
        return {"custom": state["custom"] + 1}

    state = {"custom": 3}
    _, next_state, accepted = commit_pair(pb, state, state_adapter=adapter)
    assert accepted and next_state == {"custom": 4}
    assert seen == [(state, 1, (0, 1))]


def test_an_unknown_state_needs_an_explicit_adapter(pb):
    with pytest.raises(TypeError, match="explicit"):
        commit_pair(pb, {"custom": 3})


def test_the_proposal_must_be_a_transition_proposal(pb):
    with pytest.raises(TypeError, match="TransitionProposal"):
        cb.commit_transition(
            pb, pb.propose_pair(0, 1).to_json(), moments(pb), between_steps=True, acceptance=always
        )


# --- update validation -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["slot_ids", "transition_version", "bogus"])
def test_updates_may_only_touch_representation_blocks(pb, name):
    with pytest.raises(ValueError, match="representation tensors"):
        cb.commit_transition(
            pb,
            custom_proposal(pb, [(name, 0, 1)]),
            moments(pb),
            between_steps=True,
            acceptance=always,
        )


def test_updates_must_stay_inside_the_proposal_slots(pb):
    with pytest.raises(ValueError, match="affected slot"):
        cb.commit_transition(
            pb,
            custom_proposal(pb, [("weights", 1, 1.0)]),
            moments(pb),
            between_steps=True,
            acceptance=always,
        )


@pytest.mark.parametrize(
    "update",
    [
        ("moment_coefficients", 0, (0.0, 1.0)),
        ("moment_coefficients", 0, 1.0),
        ("weights", 0, (1.0, 2.0)),
    ],
)
def test_updates_must_have_the_row_shape(pb, update):
    with pytest.raises(ValueError, match="preallocated row"):
        cb.commit_transition(
            pb, custom_proposal(pb, [update]), moments(pb), between_steps=True, acceptance=always
        )


@pytest.mark.parametrize("update", [("modes", 0, 1.5), ("active", 0, 2), ("orders", 0, -0.5)])
def test_a_cast_may_not_change_integer_or_flag_values(pb, update):
    with pytest.raises(ValueError, match="not representable"):
        cb.commit_transition(
            pb, custom_proposal(pb, [update]), moments(pb), between_steps=True, acceptance=always
        )


def test_later_updates_see_earlier_ones_and_dtypes_are_kept(pb):
    proposal = custom_proposal(pb, [("weights", 0, 5.0), ("weights", 0, 6.0), ("modes", 0, 2.0)])
    candidate, _, _ = cb.commit_transition(
        pb, proposal, moments(pb), between_steps=True, acceptance=always
    )
    assert float(candidate.weights[0]) == 6.0 and int(candidate.modes[0]) == 2
    for name in cb.STATE_NAMES:
        assert getattr(candidate, name).dtype == getattr(pb, name).dtype, name


def _count_host_work(monkeypatch):
    """Count device reads and digests of bank states from here on."""
    reads, digests = [], []
    real_read, real_digest = _host.read_host_state, _host.snapshot_digest
    monkeypatch.setattr(_host, "read_host_state", lambda b: reads.append(1) or real_read(b))
    monkeypatch.setattr(_host, "snapshot_digest", lambda s: digests.append(1) or real_digest(s))
    return reads, digests


def test_a_commit_writes_back_in_one_transfer(pb, monkeypatch):
    puts, real_put = [], jax.device_put
    monkeypatch.setattr(commit.jax, "device_put", lambda *a: puts.append(1) or real_put(*a))
    proposal = pb.propose_pair(0, 1)
    cb.commit_transition(pb, proposal, moments(pb), between_steps=True, acceptance=always)
    assert len(puts) == 1


@pytest.mark.parametrize(
    "propose",
    [
        lambda bank: bank.propose_pair(0, 1),
        lambda bank: bank.propose_cluster((0, 1), order=2, error_budget=1.0),
    ],
    ids=["pair", "cluster"],
)
def test_a_commit_with_error_bounds_and_carry_reads_and_digests_the_bank_once(
    pb, monkeypatch, propose
):
    proposal = propose(pb)
    reads, digests = _count_host_work(monkeypatch)
    _, _, accepted = cb.commit_transition(
        pb,
        proposal,
        moments(pb),
        between_steps=True,
        acceptance=cb.within_error_budget((-1.0, 1.0)),
        state_adapter=cb.moment_carry_adapter(),
    )
    assert accepted
    assert (len(reads), len(digests)) == (1, 1)


def test_a_commit_keeps_uncommitted_blocks_uncommitted(pb):
    assert not pb.weights.committed
    candidate, _, _ = cb.commit_transition(
        pb, pb.propose_pair(0, 1), moments(pb), between_steps=True, acceptance=always
    )
    assert not any(getattr(candidate, name).committed for name in cb.STATE_NAMES)


def test_a_commit_keeps_committed_blocks_on_their_device(pb):
    device = jax.devices()[0]
    placed = jax.tree.map(lambda leaf: jax.device_put(leaf, device), pb)
    candidate, _, _ = cb.commit_transition(
        placed, placed.propose_pair(0, 1), moments(placed), between_steps=True, acceptance=always
    )
    for name in cb.STATE_NAMES:
        leaf = getattr(candidate, name)
        assert leaf.committed and leaf.sharding == getattr(placed, name).sharding, name


def test_a_commit_does_not_recompile_a_jitted_forward(pb):
    forward = jax.jit(lambda bank, z: bank.forward(z))
    z = jnp.linspace(-1.0, 1.0, 7)
    forward(pb, z).block_until_ready()
    candidate, _, _ = cb.commit_transition(
        pb, pb.propose_pair(0, 1), moments(pb), between_steps=True, acceptance=always
    )
    before = len(BACKEND_COMPILES)
    forward(candidate, z).block_until_ready()
    assert len(BACKEND_COMPILES) == before


# --- the other kinds end to end (seed tests 4 and 9) -----------------------------------------


def test_cluster_commit_matches_the_reference_within_2e_9(cluster_bank):
    bank = cluster_bank
    proposal = bank.propose_cluster((0, 1, 2), order=3, error_budget=1e-7)
    assert cb.TransitionProposal.from_json(proposal.to_json()) == proposal
    candidate, _, accepted = cb.commit_transition(
        bank, proposal, moments(bank), between_steps=True, acceptance=always
    )
    assert accepted and int(candidate.modes[0]) == 2
    assert candidate.moment_coefficients.shape == (4, 5)
    assert not bool(candidate.active[1]) and not bool(candidate.active[2])
    x = jnp.array([-0.2, 0.4])
    np.testing.assert_allclose(forward(candidate, x), forward(bank, x), rtol=0, atol=2e-9)


@pytest.mark.parametrize(
    ("order", "reference_error"), [(0, 8.6e-5), (1, 1.3e-5), (2, 1.4e-8), (3, 3.2e-10)]
)
def test_cluster_truncation_error_matches_the_reference_by_order(
    cluster_bank, order, reference_error
):
    bank = cluster_bank
    candidate, _, _ = cb.commit_transition(
        bank,
        bank.propose_cluster((0, 1, 2), order=order, error_budget=1.0),
        moments(bank),
        between_steps=True,
        acceptance=always,
    )
    x = jnp.linspace(-3, 3, 601)
    error = float(jnp.max(jnp.abs(forward(candidate, x) - forward(bank, x))))
    assert 0.8 * reference_error < error < 1.1 * reference_error


def test_a_derivative_rejected_by_its_budget_leaves_the_pair_alone(committed):
    pair, state, _ = committed
    derivative = pair.propose_derivative(0, error_budget=0)
    same, same_state, accepted = cb.commit_transition(
        pair,
        derivative,
        state,
        between_steps=True,
        acceptance=lambda _b, p: p.error_budget > 0,
    )
    assert not accepted and same is pair and same_state is state
    assert float(pair.rho[0]) > 0


def test_an_accepted_derivative_reaches_the_limit_atom(committed):
    pair, state, _ = committed
    limit, _, accepted = cb.commit_transition(
        pair,
        pair.propose_derivative(0, error_budget=0.1),
        state,
        between_steps=True,
        acceptance=always,
    )
    assert accepted and float(limit.rho[0]) == 0.0
    # m0 σ(x) + m1 σ'(x) with m0 = 1, m1 = 0.375, plus the untouched order-1 slot
    x = jnp.array([-0.3, 0.0, 0.7])
    s = jax.nn.sigmoid(x)
    s2 = jax.nn.sigmoid(x - 0.2)
    expected = s + 0.375 * s * (1 - s) + 0.3 * s2 * (1 - s2)
    np.testing.assert_allclose(forward(limit, x), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("budget", "accepted"), [(0.05, False), (0.1, True)])
def test_within_error_budget_gates_the_derivative_by_its_bound(committed, budget, accepted):
    # pair_derivative_error(ρ = 1/64, |η| = 1, m0 = 1, m1 = 0.375).hi = 0.072265625
    pair, state, _ = committed
    bound = cb.pair_derivative_error(float(pair.rho[0]), 1.0, 1.0, 0.375).hi
    assert 0.05 < bound < 0.1
    result, _, ok = cb.commit_transition(
        pair,
        pair.propose_derivative(0, error_budget=budget),
        state,
        between_steps=True,
        acceptance=cb.within_error_budget((-3.0, 3.0)),
    )
    assert ok is accepted and (result is pair) is not accepted
    if accepted:
        x = jnp.linspace(-3.0, 3.0, 61)
        assert float(jnp.max(jnp.abs(forward(result, x) - forward(pair, x)))) <= bound


def test_within_error_budget_accepts_exact_kinds_at_budget_zero(pb):
    _, _, ok = cb.commit_transition(
        pb,
        pb.propose_pair(0, 1),
        moments(pb),
        between_steps=True,
        acceptance=cb.within_error_budget((-1.0, 1.0)),
    )
    assert ok


def test_birth_reuses_a_stale_slot_bitwise_and_keeps_its_id(pb):
    stale = dataclasses.replace(
        pb,
        modes=pb.modes.at[3].set(2),
        rho=pb.rho.at[3].set(0.2),
        moment_coefficients=pb.moment_coefficients.at[3].set(9.0),
    )
    state = moments(stale)
    born, next_state, accepted = cb.commit_transition(
        stale,
        stale.propose_birth(3, cb.RefinedPack(2, 0.4, 0, 1.3)),
        state,
        between_steps=True,
        acceptance=always,
    )
    assert accepted and int(born.slot_ids[3]) == 3
    assert bool(born.active[3]) and int(born.modes[3]) == 0 and float(born.rho[3]) == 0
    assert np.all(np.asarray(born.moment_coefficients[3]) == 0)
    for kind in next_state.moments.values():
        assert all(np.all(np.asarray(value)[3] == 0) for value in kind.values())
    x = jnp.array([-0.2, 0.3])
    np.testing.assert_array_equal(forward(born, x), forward(stale, x))
    with pytest.raises(ValueError, match="inactive"):
        born.propose_birth(3, cb.RefinedPack(2, 0.4, 0, 1.3))
    with pytest.raises(ValueError, match="zero output"):
        pb.propose_birth(3, cb.RefinedPack(1, 0.2, 1))


def test_remove_zero_and_duplicate_merge_keep_the_forward_bitwise():
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(0, 0.5, 1.0), cb.RefinedPack(0, 0.5, 2.0), cb.RefinedPack(0, 0.1, 0.0)],
        max_packs=3,
        max_order=0,
    )
    x = jnp.linspace(-1, 1, 5)
    merge = bank.propose_pair(0, 1)
    assert merge.kind == "duplicate_merge"
    merged, _, _ = cb.commit_transition(
        bank, merge, moments(bank), between_steps=True, acceptance=always
    )
    assert float(merged.weights[0]) == 3.0 and float(merged.rho[0]) == 0.0
    np.testing.assert_array_equal(forward(merged, x), forward(bank, x))
    removed, _, _ = cb.commit_transition(
        merged, merged.propose_remove_zero(2), moments(bank), between_steps=True, acceptance=always
    )
    assert not bool(removed.active[2])
    np.testing.assert_array_equal(forward(removed, x), forward(bank, x))


def _env_without_x64():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_ENABLE_X64", None)
    return env


def test_transitions_work_in_float32_with_x64_disabled():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        import confluent_bank as cb
        assert not jax.config.jax_enable_x64
        packs = [cb.RefinedPack(0, -0.125, 2.0), cb.RefinedPack(0, 0.125, -1.0)]
        bank = cb.init_confluent_bank(packs, max_packs=4, max_order=3)
        assert bank.centers.dtype == jnp.float32 and bank.modes.dtype == jnp.int32
        zeros = {k: jnp.zeros_like(v) for k, v in bank.parameters.items()}
        state = cb.NamedMomentState(jnp.asarray(3), {"first": zeros})
        pair, state, ok = cb.commit_transition(bank, bank.propose_pair(0, 1), state,
                                               between_steps=True, acceptance=lambda b, p: True)
        moved, state = cb.permute_bank(pair, (1, 0, 3, 2), state, between_steps=True)
        born, state, ok2 = cb.commit_transition(
            moved, moved.propose_birth(3, cb.RefinedPack(1, 0.3)), state, between_steps=True,
            acceptance=lambda b, p: True)
        assert ok and ok2 and int(born.transition_version) == 3
        for name in cb.STATE_NAMES:
            assert getattr(born, name).dtype == getattr(bank, name).dtype, name
        x = jnp.linspace(-0.5, 0.5, 9)
        np.testing.assert_allclose(born.forward(x), bank.forward(x), rtol=0, atol=1e-6)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env=_env_without_x64(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_transitions_never_recompile_a_jitted_forward(pb):
    traces = []

    @jax.jit
    def jitted(bank, x):
        traces.append(1)  # runs once per trace
        return bank.forward(x)

    jitted(pb, X9)
    pair, _, _ = commit_pair(pb, moments(pb))
    jitted(pair, X9)
    moved, _ = cb.permute_bank(pair, (3, 2, 1, 0), moments(pb), between_steps=True)
    jitted(moved, X9)
    born, _, _ = cb.commit_transition(
        moved,
        moved.propose_birth(2, cb.RefinedPack(3, 0.1)),
        moments(pb),
        between_steps=True,
        acceptance=always,
    )
    jitted(born, X9)
    assert len(traces) == 1
