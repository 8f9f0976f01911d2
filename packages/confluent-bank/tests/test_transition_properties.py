"""Property tests: random exact transitions keep the represented function (spec 7.2)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from helpers import always, forward
from hypothesis import given, settings
from hypothesis import strategies as st

import confluent_bank as cb

EPS = float(np.finfo(np.float64).eps)
CAPACITY, MAX_ORDER = 5, 2
X = jnp.linspace(-2.0, 2.0, 9)
SETTINGS = settings(max_examples=40, deadline=None)

slot_terms = jax.jit(lambda bank, x: bank.slot_terms(x))


def keep_state(state, *_):
    return state


finite = st.floats(-1.0, 1.0, allow_nan=False)
weight = st.floats(-2.0, 2.0, allow_nan=False)
scale = st.sampled_from([0.5, 1.0, 1.7, 3.0, -1.3])
base = st.sampled_from(["sigmoid", "tanh"])


@st.composite
def packs(draw, min_size=0, max_size=CAPACITY, max_order=MAX_ORDER):
    size = draw(st.integers(min_size, max_size))
    return [
        cb.RefinedPack(draw(st.integers(0, max_order)), draw(finite), draw(weight), draw(scale))
        for _ in range(size)
    ]


def _magnitude(bank):
    """max over x of Σ_i |term_i(x)|: the scale of the rounding error of a sum over slots."""
    return float(jnp.max(jnp.sum(jnp.abs(slot_terms(bank, X)), axis=0))) + 1.0


def _commit(bank, proposal):
    candidate, _, accepted = cb.commit_transition(
        bank, proposal, None, between_steps=True, acceptance=always, state_adapter=keep_state
    )
    assert accepted
    return candidate


@SETTINGS
@given(
    base=base,
    s=scale,
    first=finite,
    second=st.one_of(
        finite.map(lambda c: ("at", c)),  # anywhere
        st.sampled_from([0.0, 1e-9, 1e-5, 1e-3]).map(lambda d: ("offset", d)),  # colliding
    ),
    weights=st.tuples(weight, weight),
    others=packs(max_size=CAPACITY - 2),
)
def test_a_pair_merge_keeps_the_function(base, s, first, second, weights, others):
    second = second[1] if second[0] == "at" else first + second[1]
    pair = [cb.RefinedPack(0, first, weights[0], s), cb.RefinedPack(0, second, weights[1], s)]
    bank = cb.init_confluent_bank(pair + others, max_packs=CAPACITY, max_order=MAX_ORDER, base=base)
    merged = _commit(bank, bank.propose_pair(0, 1))
    error = float(jnp.max(jnp.abs(forward(merged, X) - forward(bank, X))))
    assert error <= 4 * EPS * _magnitude(bank)


@SETTINGS
@given(
    base=base,
    live=packs(max_size=CAPACITY - 1),
    newborn=st.tuples(st.integers(0, MAX_ORDER), finite, scale),
    stale=st.tuples(st.integers(0, 2), st.floats(0.0, 1.0), weight),
)
def test_a_birth_keeps_the_function_bitwise(base, live, newborn, stale):
    bank = cb.init_confluent_bank(live, max_packs=CAPACITY, max_order=MAX_ORDER, base=base)
    slot = len(live)
    mode, rho, value = stale  # leftovers of a slot that was switched off
    bank = dataclasses.replace(
        bank,
        modes=bank.modes.at[slot].set(mode),
        rho=bank.rho.at[slot].set(rho),
        weights=bank.weights.at[slot].set(value),
        moment_coefficients=bank.moment_coefficients.at[slot].set(value),
    )
    order, centre, s = newborn
    born = _commit(bank, bank.propose_birth(slot, cb.RefinedPack(order, centre, 0.0, s)))
    assert bool(born.active[slot])
    np.testing.assert_array_equal(forward(born, X), forward(bank, X))


@SETTINGS
@given(base=base, live=packs(min_size=1), data=st.data())
def test_removing_a_zero_weight_slot_keeps_the_function_bitwise(base, live, data):
    slot = data.draw(st.integers(0, len(live) - 1))
    bank = cb.init_confluent_bank(live, max_packs=CAPACITY, max_order=MAX_ORDER, base=base)
    bank = dataclasses.replace(bank, weights=bank.weights.at[slot].set(0.0))
    removed = _commit(bank, bank.propose_remove_zero(slot))
    assert not bool(removed.active[slot])
    np.testing.assert_array_equal(forward(removed, X), forward(bank, X))


@SETTINGS
@given(base=base, live=packs(), merge=st.booleans(), data=st.data())
def test_a_permutation_keeps_the_function_and_inverts_exactly(base, live, merge, data):
    bank = cb.init_confluent_bank(live, max_packs=CAPACITY, max_order=MAX_ORDER, base=base)
    if merge and len(live) >= 2:
        # include a centred-pair slot when the first two atoms qualify
        try:
            bank = _commit(bank, bank.propose_pair(0, 1))
        except ValueError:
            pass
    permutation = data.draw(st.permutations(range(CAPACITY)))
    state = cb.NamedMomentState(
        jnp.asarray(3), {"first": jax.tree.map(lambda v: v + 1.5, bank.parameters)}
    )
    moved, moved_state = cb.permute_bank(bank, permutation, state, between_steps=True)
    error = float(jnp.max(jnp.abs(forward(moved, X) - forward(bank, X))))
    assert error <= 4 * EPS * _magnitude(bank)
    inverse = tuple(int(i) for i in np.argsort(permutation))
    back, back_state = cb.permute_bank(moved, inverse, moved_state, between_steps=True)
    for name in cb.STATE_NAMES[:-1]:
        np.testing.assert_array_equal(getattr(back, name), getattr(bank, name))
    jax.tree.map(np.testing.assert_array_equal, back_state.moments, state.moments)


@SETTINGS
@given(live=packs(min_size=1, max_order=MAX_ORDER), data=st.data())
def test_a_tanh_relabel_keeps_the_function_and_is_an_involution(live, data):
    bank = cb.init_confluent_bank(live, max_packs=CAPACITY, max_order=MAX_ORDER, base="tanh")
    slots = data.draw(st.lists(st.integers(0, CAPACITY - 1), unique=True, max_size=CAPACITY))
    state = cb.NamedMomentState(
        jnp.asarray(3),
        {
            "first": jax.tree.map(lambda v: v + 1.5, bank.parameters),
            "second": jax.tree.map(lambda v: v + 2.5, bank.parameters),
        },
    )
    flipped, flipped_state = cb.relabel_tanh_sign(bank, slots, state, between_steps=True)
    error = float(jnp.max(jnp.abs(forward(flipped, X) - forward(bank, X))))
    assert error <= 2e-14 * _magnitude(bank)
    back, back_state = cb.relabel_tanh_sign(flipped, slots, flipped_state, between_steps=True)
    for name in cb.STATE_NAMES[:-1]:
        np.testing.assert_array_equal(getattr(back, name), getattr(bank, name))
    jax.tree.map(np.testing.assert_array_equal, back_state.moments, state.moments)
