"""Exact transports (spec 4) and the NamedMomentState moment operations."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import forward, moments, unique_moments

import confluent_bank as cb

PERMUTATION = (2, 0, 3, 1)


@pytest.fixture(scope="module")
def pb(pair_bank):
    """The spec's pair bank PB (conftest's session fixture)."""
    return pair_bank


# --- permutation (seed test 6) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("odd", "even"), [("first", "second"), ("momentum", None)], ids=["adam", "sgd"]
)
def test_permutation_moves_ids_rows_and_moments(pb, odd, even):
    state = unique_moments(pb, odd, even)
    candidate, next_state = cb.permute_bank(pb, PERMUTATION, state, between_steps=True)
    assert candidate.slot_ids.tolist() == [2, 0, 3, 1]
    assert candidate.centers.tolist() == [0.2, -0.125, 0.0, 0.125]
    assert next_state.step is state.step
    index = np.asarray(PERMUTATION)
    for kind, entries in state.moments.items():
        for name, value in entries.items():
            np.testing.assert_array_equal(next_state.moments[kind][name], np.asarray(value)[index])
    x = jnp.array([-0.2, 0.1])
    np.testing.assert_allclose(forward(candidate, x), forward(pb, x), rtol=0, atol=3e-16)


def test_permutation_gathers_every_block_except_the_version(pb):
    candidate, _ = cb.permute_bank(pb, PERMUTATION, moments(pb), between_steps=True)
    index = np.asarray(PERMUTATION)
    for name in cb.STATE_NAMES[:-1]:
        np.testing.assert_array_equal(
            getattr(candidate, name), np.asarray(getattr(pb, name))[index]
        )
        assert getattr(candidate, name).dtype == getattr(pb, name).dtype
    assert int(candidate.transition_version) == 1 and int(pb.transition_version) == 0


@pytest.mark.parametrize("permutation", [(0, 0, 1, 2), (0, 1, 2), (0, 1, 2, 3, 4), (1, 2, 3, 4)])
def test_a_permutation_must_contain_every_position_once(pb, permutation):
    with pytest.raises(ValueError, match="every"):
        cb.permute_bank(pb, permutation, moments(pb), between_steps=True)


def test_permutation_entries_must_be_integers(pb):
    with pytest.raises(TypeError, match="integer"):
        cb.permute_bank(pb, (0.0, 1, 2, 3), moments(pb), between_steps=True)


def test_transports_only_run_between_steps(pb, tanh_bank):
    with pytest.raises(RuntimeError, match="between"):
        cb.permute_bank(pb, (0, 0, 1, 2), moments(pb), between_steps=False)
    with pytest.raises(RuntimeError, match="between"):
        cb.relabel_tanh_sign(tanh_bank, (0,), moments(tanh_bank), between_steps=False)


def test_a_transport_needs_an_adapter_for_unknown_states(pb):
    source = pb.portable_snapshot()
    with pytest.raises(TypeError, match="ExactTransportAdapter"):
        cb.permute_bank(pb, (1, 0, 2, 3), object(), between_steps=True)
    assert pb.portable_snapshot() == source


def test_a_transport_adapter_receives_the_candidate_and_the_transport(pb, tanh_bank):
    seen = []

    def adapter(state, candidate, permutation, sign_slots):
        seen.append((int(candidate.transition_version), permutation, sign_slots))
        return state + 1

    _, state = cb.permute_bank(pb, [1, 0, 2, 3], 3, between_steps=True, state_adapter=adapter)
    _, state = cb.relabel_tanh_sign(
        tanh_bank, [2], state, between_steps=True, state_adapter=adapter
    )
    assert state == 5 and seen == [(1, (1, 0, 2, 3), ()), (1, None, (2,))]


def _traced(transport, bank, state):
    """Run `transport(bank, state)` with the bank and state traced: any host read of them
    (`device_get`, `float`, `np.asarray`) raises a concretization error."""
    return jax.jit(transport)(bank, state)


def test_permuting_needs_no_host_read(pb):
    permute = lambda bank, state: cb.permute_bank(  # noqa: E731
        bank, PERMUTATION, state, between_steps=True
    )
    candidate, _ = _traced(permute, pb, moments(pb))
    assert candidate.slot_ids.tolist() == list(PERMUTATION)


def test_the_traced_guard_catches_a_host_read(tanh_bank):
    # relabel_tanh_sign reads the modes block on the host, so the guard above can fail.
    relabel = lambda bank, state: cb.relabel_tanh_sign(  # noqa: E731
        bank, [0], state, between_steps=True
    )
    with pytest.raises((jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError)):
        _traced(relabel, tanh_bank, moments(tanh_bank))


# --- tanh sign relabel (seed test 7) ---------------------------------------------------------


def test_tanh_relabel_flips_odd_moments_of_weights_and_scales_only(tanh_bank):
    state = moments(tanh_bank)
    candidate, next_state = cb.relabel_tanh_sign(tanh_bank, (0, 1, 2, 3), state, between_steps=True)
    for name, value in next_state.moments["first"].items():
        sign = -1 if name in ("weights", "scales") else 1
        np.testing.assert_array_equal(value, np.full(value.shape, sign))
    for value in next_state.moments["second"].values():
        np.testing.assert_array_equal(value, np.full(value.shape, 2))
    assert next_state.step is state.step
    assert candidate.weights.tolist() == (-tanh_bank.weights).tolist()
    assert candidate.scales.tolist() == [-0.7] * 4
    assert bool(jnp.all(tanh_bank.scales > 0))  # the original is untouched


def test_tanh_relabel_keeps_the_function_at_every_order(tanh_bank):
    candidate, _ = cb.relabel_tanh_sign(
        tanh_bank, (0, 1, 2, 3), moments(tanh_bank), between_steps=True
    )
    x = jnp.array([-0.3, 0.2])
    np.testing.assert_allclose(forward(candidate, x), forward(tanh_bank, x), rtol=0, atol=2e-14)
    slot_terms = jax.jit(lambda bank, z: bank.slot_terms(z))
    np.testing.assert_allclose(
        slot_terms(candidate, x), slot_terms(tanh_bank, x), rtol=0, atol=2e-14
    )


def test_tanh_relabel_flips_only_the_named_rows(tanh_bank):
    state = unique_moments(tanh_bank)
    candidate, next_state = cb.relabel_tanh_sign(tanh_bank, (1, 3), state, between_steps=True)
    assert candidate.scales.tolist() == [0.7, -0.7, 0.7, -0.7]
    first = np.asarray(state.moments["first"]["weights"])
    np.testing.assert_array_equal(
        next_state.moments["first"]["weights"], first * np.array([1, -1, 1, -1])
    )
    np.testing.assert_array_equal(
        next_state.moments["first"]["centers"], state.moments["first"]["centers"]
    )


def test_tanh_relabel_needs_ordinary_slots(tanh_bank):
    invalid = dataclasses.replace(tanh_bank, modes=tanh_bank.modes.at[0].set(1))
    with pytest.raises(ValueError, match="ordinary"):
        cb.relabel_tanh_sign(invalid, (0,), moments(tanh_bank), between_steps=True)


def test_tanh_relabel_may_flip_inactive_ordinary_slots(tanh_bank):
    off = dataclasses.replace(tanh_bank, active=tanh_bank.active.at[2].set(False))
    candidate, _ = cb.relabel_tanh_sign(off, (2,), moments(off), between_steps=True)
    assert float(candidate.scales[2]) == -0.7


def test_tanh_relabel_needs_a_tanh_bank(pb):
    with pytest.raises(ValueError, match="tanh"):
        cb.relabel_tanh_sign(pb, (0,), moments(pb), between_steps=True)


@pytest.mark.parametrize("slots", [(0, 0), (4,), (-1,)])
def test_tanh_relabel_slots_must_be_distinct_and_in_range(tanh_bank, slots):
    with pytest.raises(ValueError, match="distinct"):
        cb.relabel_tanh_sign(tanh_bank, slots, moments(tanh_bank), between_steps=True)


def test_an_unknown_moment_parity_needs_an_adapter_for_a_relabel(tanh_bank):
    state = moments(tanh_bank)
    unknown = dataclasses.replace(state, moments={"unknown_parity": state.moments["first"]})
    with pytest.raises(TypeError, match="parity"):
        cb.relabel_tanh_sign(tanh_bank, (0,), unknown, between_steps=True)


def test_an_unknown_moment_kind_is_fine_for_a_permutation(pb):
    state = unique_moments(pb, "unknown_parity", None)
    _, moved = cb.permute_bank(pb, PERMUTATION, state, between_steps=True)
    np.testing.assert_array_equal(moved.moments["unknown_parity"]["centers"], [3, 1, 4, 2])


@pytest.mark.parametrize(
    "kind",
    [
        "first",
        "momentum",
        "gradient_average",
        "second",
        "variance",
        "max_second",
        "sum_squares",
        "absolute",
    ],
)
def test_moment_kinds_have_their_documented_parity(tanh_bank, kind):
    state = unique_moments(tanh_bank, kind, None)
    _, moved = cb.relabel_tanh_sign(tanh_bank, (0,), state, between_steps=True)
    sign = -1 if kind in ("first", "momentum", "gradient_average") else 1
    assert moved.moments[kind]["scales"].tolist() == [sign * 1.0, 2.0, 3.0, 4.0]
    assert moved.moments[kind]["directions"].tolist() == [1.0, 2.0, 3.0, 4.0]


# --- NamedMomentState and its functions ------------------------------------------------------


def test_named_moment_state_is_a_pytree(pb):
    state = moments(pb)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    assert len(leaves) == 1 + 2 * len(cb.PARAMETER_NAMES)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(rebuilt, cb.NamedMomentState) and rebuilt.step is state.step
    doubled = jax.jit(lambda s: jax.tree.map(lambda v: 2 * v, s))(state)
    assert float(doubled.moments["second"]["rho"][0]) == 4.0


def test_reset_slot_state_zeroes_only_the_named_rows(pb):
    state = unique_moments(pb)
    reset = cb.reset_slot_state(state, pb, (1, 3))
    assert reset.step is state.step
    coefficients = np.asarray(reset.moments["second"]["moment_coefficients"])
    assert np.all(coefficients[[1, 3]] == 0) and np.all(coefficients[[0, 2]] > 0)
    assert cb.reset_slot_state(state, pb, ()).moments["first"]["rho"].tolist() == [1, 2, 3, 4]


def test_reset_slot_state_rejects_unknown_states_and_mismatched_moments(pb):
    with pytest.raises(TypeError, match="explicit OptimizerStateAdapter"):
        cb.reset_slot_state({"first": {}}, pb, (0,))
    state = moments(pb)
    missing = dataclasses.replace(state, moments={"first": {"centers": jnp.ones(4)}})
    with pytest.raises(ValueError, match="complete bank parameter dictionary"):
        cb.reset_slot_state(missing, pb, (0,))
    wrong = {**state.moments["first"], "moment_coefficients": jnp.ones((4, 2))}
    with pytest.raises(ValueError, match="moment shape does not match parameter"):
        cb.reset_slot_state(dataclasses.replace(state, moments={"first": wrong}), pb, (0,))
    with pytest.raises(ValueError, match="positions"):
        cb.reset_slot_state(state, pb, (4,))


def test_transport_optimizer_state_checks_like_reset(pb):
    with pytest.raises(TypeError, match="explicit ExactTransportAdapter"):
        cb.transport_optimizer_state({}, pb, None, ())
    state = moments(pb)
    wrong = {**state.moments["first"], "rho": jnp.ones(3)}
    with pytest.raises(ValueError, match="moment shape does not match parameter"):
        cb.transport_optimizer_state(
            dataclasses.replace(state, moments={"first": wrong}), pb, None, ()
        )


def test_transport_optimizer_state_permutes_then_flips(pb):
    state = unique_moments(pb)
    moved = cb.transport_optimizer_state(state, pb, (3, 2, 1, 0), (0,))
    assert moved.moments["first"]["weights"].tolist() == [-4, 3, 2, 1]
    assert moved.moments["second"]["weights"].tolist() == [16, 9, 4, 1]
