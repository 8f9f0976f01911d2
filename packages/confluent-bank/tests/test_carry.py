"""Carrying moments through a transition's change of coordinates (`confluent_bank._carry`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import always

import confluent_bank as cb

X = jnp.linspace(-2.0, 2.0, 41)
TRANSPORTED = ("centers", "weights", "rho", "odd_moments", "scales", "direction_bias")


@jax.jit
def _gradient(parameters, bank):
    """The gradient of a loss that is not stationary, so every used coordinate moves."""

    def loss(p):
        return jnp.sum((bank.with_parameters(p).forward(X) - jnp.sin(X)) ** 2)

    return jax.grad(loss)(parameters)


def _named(bank, gradient):
    """Moments of one observed gradient: first = g, second = g²."""
    second = jax.tree.map(jnp.square, gradient)
    return cb.NamedMomentState(jnp.asarray(3), {"first": gradient, "second": second})


def _commit(bank, proposal, state, adapter=None):
    adapter = cb.moment_carry_adapter() if adapter is None else adapter
    candidate, carried, accepted = cb.commit_transition(
        bank, proposal, state, between_steps=True, acceptance=always, state_adapter=adapter
    )
    assert accepted
    return candidate, carried


@pytest.fixture(scope="module")
def pair_commit(pair_bank):
    state = _named(pair_bank, _gradient(pair_bank.parameters, pair_bank))
    candidate, carried = _commit(pair_bank, pair_bank.propose_pair(0, 1), state)
    return candidate, carried, state


def test_a_pair_carries_first_moments_exactly_to_the_new_gradient(pair_commit):
    candidate, carried, _ = pair_commit
    expected = _gradient(candidate.parameters, candidate)
    for name in TRANSPORTED:
        np.testing.assert_allclose(
            carried.moments["first"][name][0], expected[name][0], rtol=1e-9, atol=1e-12
        )


def test_a_pair_bounds_second_moments_by_the_squared_first(pair_commit):
    _, carried, _ = pair_commit
    for name in TRANSPORTED:
        first, second = carried.moments["first"][name], carried.moments["second"][name]
        assert np.all(np.asarray(second) >= np.asarray(first) ** 2 * (1 - 1e-12)), name
    assert float(carried.moments["second"]["odd_moments"][0]) > 0


def test_a_pair_zeroes_its_switched_off_row_and_keeps_the_others(pair_commit):
    _, carried, state = pair_commit
    for kind in ("first", "second"):
        for name, value in carried.moments[kind].items():
            assert np.all(np.asarray(value)[1] == 0), (kind, name)
            np.testing.assert_array_equal(value[2:], state.moments[kind][name][2:])
    assert carried.step is state.step


def test_a_pair_directions_coordinate_is_fresh(pair_bank):
    carry = cb.transition_carry(pair_bank, pair_bank.propose_pair(0, 1))
    assert carry.kind == "centered_pair" and carry.slots == (0, 1)
    assert carry.fresh == (("directions", 0, 0),)


def test_a_pair_seeds_its_directions_second_moment_from_its_own_centres(pair_commit):
    candidate, carried, state = pair_commit
    second = state.moments["second"]["centers"]
    s, c, h = 1.0, 0.0, 0.125  # make_pair_bank: unit scale, atoms at ±0.125
    reach = abs(c) + (h + 1.0) / s  # the typical |z| where the pair acts
    seeded = (reach**2 * h / s * (np.sqrt(second[0]) + np.sqrt(second[1]))) ** 2
    np.testing.assert_allclose(carried.moments["second"]["directions"][0], seeded, rtol=1e-12)
    expected = _gradient(candidate.parameters, candidate)["directions"][0]
    assert float(seeded) >= float(expected) ** 2 > 0  # at least the gradient it will meet


def test_a_pair_directions_seed_grows_with_the_input_units():
    """Inputs 100× larger (centres ×100, scale ÷100): v's gradient grows 100× and its
    curvature 100²×; its step (∝ μ/√ν) must shrink 100×, so √ν grows 100³×."""
    seeds = []
    for unit in (1.0, 100.0):
        packs = [
            cb.RefinedPack(0, -0.125 * unit, 2.0, 1 / unit),
            cb.RefinedPack(0, 0.125 * unit, -1.0, 1 / unit),
        ]
        bank = cb.init_confluent_bank(packs, max_packs=3, max_order=1)
        ones = jax.tree.map(jnp.ones_like, bank.parameters)
        state = cb.NamedMomentState(jnp.asarray(3), {"first": ones, "second": ones})
        _, carried = _commit(bank, bank.propose_pair(0, 1), state)
        seeds.append(float(carried.moments["second"]["directions"][0]))
    np.testing.assert_allclose(seeds[1] / seeds[0], 100.0**6, rtol=1e-9)


@pytest.fixture(scope="module")
def duplicate_commit():
    """Two atoms at one centre (a birth beside an atom, say) merged: h = 0."""
    packs = [
        cb.RefinedPack(0, 0.3, 1.5),
        cb.RefinedPack(0, 0.3, -0.5),
        cb.RefinedPack(0, -1.0, 0.4),
    ]
    bank = cb.init_confluent_bank(packs, max_packs=4, max_order=2)
    proposal = bank.propose_pair(0, 1)
    assert proposal.kind == "duplicate_merge"
    state = _named(bank, _gradient(bank.parameters, bank))
    candidate, carried = _commit(bank, proposal, state)
    return bank, candidate, carried, proposal


def test_a_duplicate_merge_carries_its_odd_moment_exactly(duplicate_commit):
    _, candidate, carried, _ = duplicate_commit
    expected = _gradient(candidate.parameters, candidate)
    for name in ("centers", "weights", "scales", "odd_moments"):
        np.testing.assert_allclose(
            carried.moments["first"][name][0], expected[name][0], rtol=1e-9, atol=1e-12
        )
    assert float(expected["odd_moments"][0]) != 0


def test_a_duplicate_merge_seeds_its_spread_above_the_gradient_it_meets(duplicate_commit):
    bank, candidate, carried, proposal = duplicate_commit
    expected = _gradient(candidate.parameters, candidate)
    assert float(carried.moments["first"]["rho"][0]) == 0
    assert float(carried.moments["second"]["rho"][0]) >= float(expected["rho"][0]) ** 2 > 0
    carry = cb.transition_carry(bank, proposal)
    assert ("rho", 0, 0) in carry.fresh and ("odd_moments", 0, 0) not in carry.fresh


def test_a_cluster_carries_first_moments_close_to_the_new_gradient(cluster_bank):
    state = _named(cluster_bank, _gradient(cluster_bank.parameters, cluster_bank))
    proposal = cluster_bank.propose_cluster((0, 1, 2), order=2, error_budget=1.0)
    candidate, carried = _commit(cluster_bank, proposal, state)
    expected = _gradient(candidate.parameters, candidate)
    first = carried.moments["first"]
    for name in ("centers", "scales"):
        np.testing.assert_allclose(first[name][0], expected[name][0], rtol=1e-3)
    np.testing.assert_allclose(
        first["moment_coefficients"][0, :3], expected["moment_coefficients"][0, :3], rtol=1e-3
    )


def test_a_birth_seeds_second_moments_from_the_active_siblings(pair_bank):
    state = _named(pair_bank, _gradient(pair_bank.parameters, pair_bank))
    proposal = pair_bank.propose_birth(3, cb.RefinedPack(0, 0.5, 0.0, 1.0))
    _, carried = _commit(pair_bank, proposal, state)
    for name in cb.PARAMETER_NAMES:
        assert np.all(np.asarray(carried.moments["first"][name])[3] == 0), name
        old = np.asarray(state.moments["second"][name])[:3]
        seeded = np.sum(np.sqrt(old), axis=0) ** 2
        np.testing.assert_allclose(carried.moments["second"][name][3], seeded, rtol=1e-12)
    carry = cb.transition_carry(pair_bank, proposal)
    assert ("weights", 3, 0) in carry.fresh


def test_a_derivative_keeps_every_moment(pair_commit):
    candidate, carried, _ = pair_commit
    proposal = candidate.propose_derivative(0, error_budget=1.0)
    _, after = _commit(candidate, proposal, carried)
    jax.tree.map(np.testing.assert_array_equal, after.moments, carried.moments)


def test_without_an_adapter_a_commit_still_resets_named_moments(pair_bank):
    state = _named(pair_bank, _gradient(pair_bank.parameters, pair_bank))
    _, carried = _commit(pair_bank, pair_bank.propose_pair(0, 1), state)
    _, plain, _ = cb.commit_transition(
        pair_bank, pair_bank.propose_pair(0, 1), state, between_steps=True, acceptance=always
    )
    assert np.all(np.asarray(plain.moments["first"]["weights"])[:2] == 0)
    assert float(carried.moments["first"]["weights"][0]) != 0


def test_unknown_moment_kinds_cannot_be_carried(pair_bank):
    parameters = pair_bank.parameters
    state = cb.NamedMomentState(jnp.asarray(0), {"velocity": parameters})
    with pytest.raises(TypeError, match="parity"):
        _commit(pair_bank, pair_bank.propose_pair(0, 1), state)


def test_apply_carry_rejects_an_unknown_parity(pair_bank):
    carry = cb.transition_carry(pair_bank, pair_bank.propose_pair(0, 1))
    with pytest.raises(ValueError, match="parity"):
        cb.apply_carry(pair_bank.parameters, carry, "linear")
