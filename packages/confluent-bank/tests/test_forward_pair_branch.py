"""The centred pairs' formulas run only while a pair is active (issue 10, item 5; issue 24,
item 3).

Ordinary and moment slots are one series per slot whatever they hold; the pair formulas sit in a
run-time branch on the traced metadata. A bank with and without an active pair must give the
reference's values and gradient (every slot through the tower rows and all formulas) to rounding,
an inactive pair slot must change nothing, and a commit that makes a pair must not recompile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BACKEND_COMPILES, always, moments, set_rows

import confluent_bank as cb
import confluent_bank._forward as forward_module

Z = jnp.linspace(-2.0, 2.0, 9)
LIVE = 4  # live slots; slot 4 is spare
# Rows up to order 8 carry Riccati coefficients up to ~1e6 (spec 7.3), so the series and the
# rows one by one round differently by more than an ulp there; the low rows agree to a few ulps.
ROUNDING = {"rtol": 1e-13, "atol": 1e-15}


def simple_bank(orders, base="sigmoid"):
    """Four ordinary slots of the given orders in a 5-slot, order-8 bank (slot 4 inactive)."""
    packs = [
        cb.RefinedPack(n, 0.3 * i - 0.5, 0.7 - 0.4 * i, 0.8 + 0.15 * i)
        for i, n in enumerate(orders)
    ]
    return cb.init_confluent_bank(packs, max_packs=LIVE + 1, max_order=8, base=base)


def with_active_pair(bank):
    """The same function with the pair branch taken: slot 4 becomes an active pair slot whose
    weight and odd moment are zero, so its term is exactly 0."""
    return set_rows(bank, [("active", LIVE, True), ("modes", LIVE, 1)])


def reference_terms(bank, z):
    per_slot = (slice(None),) + (None,) * z.ndim
    terms = jax.jit(forward_module._all_terms)(bank, z)
    return jnp.where(bank.active[per_slot], terms, jnp.zeros_like(terms))


@pytest.fixture(scope="module")
def grad_of_square():
    def objective(parameters, bank):
        return jnp.sum(bank.with_parameters(parameters).forward(Z) ** 2)

    return jax.jit(jax.grad(objective))


# The reference sums rows of order 8, whose Riccati coefficients add up to ~1.1e6 in absolute
# value, so it rounds by up to ~eps·1e6 ≈ 2e-10 relative there (2e-11 measured against 60-digit
# arithmetic, where the bank's series is within 7e-13: `test_forward_series.py`).
HIGH_ORDER = {"rtol": 1e-10, "atol": 1e-11}
CASES = [
    ((0, 0, 0, 0), "sigmoid", ROUNDING),
    ((0, 1, 3, 2), "sigmoid", ROUNDING),
    ((0, 5, 8, 1), "sigmoid", HIGH_ORDER),
    ((0, 0, 2, 0), "tanh", ROUNDING),
]


@pytest.mark.parametrize(("orders", "base", "rounding"), CASES)
def test_a_bank_without_pairs_gives_the_reference_values_to_rounding(orders, base, rounding):
    bank = simple_bank(orders, base)
    np.testing.assert_allclose(bank.slot_terms(Z), reference_terms(bank, Z), **rounding)


@pytest.mark.parametrize(("orders", "base", "rounding"), CASES)
def test_an_active_pair_leaves_the_other_slots_values_unchanged(orders, base, rounding):
    bank = simple_bank(orders, base)
    paired = with_active_pair(bank)
    np.testing.assert_array_equal(paired.slot_terms(Z)[:LIVE], bank.slot_terms(Z)[:LIVE])
    np.testing.assert_array_equal(paired.slot_terms(Z)[LIVE], np.zeros(Z.shape))


@pytest.mark.parametrize(("orders", "base", "rounding"), CASES[:3])
def test_the_gradient_with_and_without_a_pair_is_the_reference_gradient(
    grad_of_square, orders, base, rounding
):
    bank = simple_bank(orders, base)

    def reference(parameters, bank):
        terms = reference_terms(bank.with_parameters(parameters), Z)
        return jnp.sum(jnp.sum(terms, axis=0) ** 2)

    want = jax.jit(jax.grad(reference))(bank.parameters, bank)
    # The gradient reads one row higher (order 9: Σ|c| ≈ 1.4e7 against 1.1e6 at order 8).
    gradient_rounding = ROUNDING if rounding is ROUNDING else {"rtol": 1e-9, "atol": 1e-11}
    for candidate in (bank, with_active_pair(bank)):
        got = grad_of_square(candidate.parameters, candidate)
        for name in cb.PARAMETER_NAMES:
            np.testing.assert_allclose(
                got[name][:LIVE], want[name][:LIVE], **gradient_rounding, err_msg=name
            )


def test_an_inactive_pair_slot_changes_nothing():
    bank = simple_bank((0, 1, 0, 2))
    parked = set_rows(bank, [("modes", LIVE, 1), ("weights", LIVE, 3.0), ("rho", LIVE, 0.2)])
    np.testing.assert_array_equal(parked.forward(Z), bank.forward(Z))


def test_a_pair_slot_gives_the_reference_pair(pair_committed_bank):
    x = jnp.linspace(-1.5, 1.5, 13)
    np.testing.assert_allclose(
        pair_committed_bank.slot_terms(x), reference_terms(pair_committed_bank, x), **ROUNDING
    )


def test_a_z_derivative_of_an_order_zero_bank_is_the_next_tower_row():
    bank = simple_bank((0, 0, 0, 0))
    slope = jax.vmap(jax.grad(lambda x: bank.forward(x)))(Z)
    scales, centers, weights = (
        np.asarray(getattr(bank, n)[:LIVE]) for n in ("scales", "centers", "weights")
    )
    u = scales[:, None] * (np.asarray(Z) - centers[:, None])
    s = 1 / (1 + np.exp(-u))
    expected = np.sum(weights[:, None] * scales[:, None] * s * (1 - s), axis=0)
    np.testing.assert_allclose(slope, expected, rtol=1e-13)


def test_a_commit_that_makes_a_pair_does_not_recompile():
    bank = cb.init_confluent_bank(
        [
            cb.RefinedPack(0, -0.125, 2.0),
            cb.RefinedPack(0, 0.125, -1.0),
            cb.RefinedPack(0, 0.4, 0.3),
        ],
        max_packs=4,
        max_order=3,
    )
    forward = jax.jit(lambda b, z: b.forward(z))
    gradient = jax.jit(jax.grad(lambda p, b: jnp.sum(b.with_parameters(p).forward(Z) ** 2)))
    before_commit = forward(bank, Z)
    gradient(bank.parameters, bank)
    candidate, _, accepted = cb.commit_transition(
        bank, bank.propose_pair(0, 1), moments(bank), between_steps=True, acceptance=always
    )
    assert accepted and int(candidate.modes[0]) == cb.SlotMode.PAIR
    compiles = len(BACKEND_COMPILES)
    after_commit = forward(candidate, Z)
    grads = gradient(candidate.parameters, candidate)
    jax.block_until_ready(grads)
    assert len(BACKEND_COMPILES) == compiles
    np.testing.assert_allclose(after_commit, before_commit, rtol=0, atol=3e-16)
    # The pair slot really went through the pair formulas: its odd moment has a gradient.
    assert float(jnp.abs(grads["odd_moments"][0])) > 0


def test_vmapped_banks_with_and_without_a_pair_each_get_their_own_values():
    simple = simple_bank((0, 0, 0, 0))
    paired = set_rows(simple, [("modes", 1, 1), ("rho", 1, 0.3), ("odd_moments", 1, 0.5)])
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), simple, paired)
    together = jax.vmap(lambda b: b.forward(Z))(stacked)
    np.testing.assert_allclose(together[0], simple.forward(Z), **ROUNDING)
    np.testing.assert_allclose(together[1], paired.forward(Z), **ROUNDING)
    # Each got its own terms: the pair moves the second bank's values well beyond rounding.
    assert float(jnp.max(jnp.abs(together[1] - together[0]))) > 1e-3


def test_the_pair_limits_at_infinity_are_traced_once_for_both_directions(
    monkeypatch, pair_committed_bank
):
    calls = []
    real = forward_module._pair_limits

    def counting(bank, direction):
        calls.append(direction)
        return real(bank, direction)

    monkeypatch.setattr(forward_module, "_pair_limits", counting)
    x = (-np.inf, 0.25, np.inf, 7.0, -3.0, 0.5)
    values = pair_committed_bank.forward(jnp.asarray(x))  # a fresh shape
    assert len(calls) == 1
    monkeypatch.undo()
    expected = [pair_committed_bank.forward(jnp.asarray(v)) for v in x]
    np.testing.assert_array_equal(values, np.asarray(expected))
