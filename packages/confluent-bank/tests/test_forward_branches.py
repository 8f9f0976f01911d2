"""A simple bank skips the high tower rows at run time (issue 10, item 5; issue 24, item 3).

The forward picks one of its branches from the traced metadata: order 0 only, ordinary slots up
to order 3 (when `max_order` is higher), ordinary and moment slots up to `max_order` (the mixed
branch), or the full branch (pairs). Each cheap branch must give what the full branch gives, to
rounding (XLA fuses multiply-adds differently in differently shaped programs, so the last bit or
two may differ), and a commit that moves the bank from one branch to another must not recompile
anything.
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
# Rows up to order 8 carry Riccati coefficients up to ~1e6 (spec 7.3), so rounding differs by
# more than an ulp there; the low rows agree to a few ulps.
ROUNDING = {"rtol": 1e-13, "atol": 1e-15}


def simple_bank(orders, base="sigmoid"):
    """Four ordinary slots of the given orders in a 5-slot, order-8 bank (slot 4 inactive)."""
    packs = [
        cb.RefinedPack(n, 0.3 * i - 0.5, 0.7 - 0.4 * i, 0.8 + 0.15 * i)
        for i, n in enumerate(orders)
    ]
    return cb.init_confluent_bank(packs, max_packs=LIVE + 1, max_order=8, base=base)


def forced_full(bank):
    """The same function through the full branch: slot 4 becomes an active pair slot whose
    weight and odd moment are zero, so its term is exactly 0."""
    return set_rows(bank, [("active", LIVE, True), ("modes", LIVE, 1)])


def branch(bank):
    heights = forward_module._ordinary_heights(bank.max_order)
    return int(forward_module._branch(bank, heights))


@pytest.fixture(scope="module")
def grad_of_square():
    def objective(parameters, bank):
        return jnp.sum(bank.with_parameters(parameters).forward(Z) ** 2)

    return jax.jit(jax.grad(objective))


CASES = [
    ((0, 0, 0, 0), 0, "sigmoid"),
    ((0, 1, 3, 2), 1, "sigmoid"),
    ((0, 5, 8, 1), 2, "sigmoid"),
    ((0, 0, 2, 0), 1, "tanh"),
]


@pytest.mark.parametrize(("orders", "expected", "base"), CASES)
def test_a_simple_bank_takes_the_cheapest_branch_that_covers_its_orders(orders, expected, base):
    bank = simple_bank(orders, base)
    assert branch(bank) == expected
    assert branch(forced_full(bank)) == 3


def test_inactive_slots_do_not_choose_the_branch():
    bank = set_rows(simple_bank((0, 0, 0, 0)), [("modes", LIVE, 1), ("orders", LIVE, 8)])
    assert branch(bank) == 0


def test_an_active_pair_slot_takes_the_full_branch(pair_committed_bank):
    assert branch(pair_committed_bank) == len(forward_module._ordinary_heights(3)) + 1
    pair = set_rows(simple_bank((0, 0, 0, 0)), [("modes", 1, 1)])
    assert branch(pair) == 3


def test_an_active_moment_slot_without_pairs_takes_the_mixed_branch():
    moment = set_rows(simple_bank((0, 0, 0, 0)), [("modes", 1, 2)])
    assert branch(moment) == len(forward_module._ordinary_heights(8)) == 2


@pytest.mark.parametrize(("orders", "expected", "base"), CASES)
def test_a_cheap_branch_gives_the_full_branch_values_to_rounding(orders, expected, base):
    bank = simple_bank(orders, base)
    full = forced_full(bank)
    np.testing.assert_allclose(bank.slot_terms(Z)[:LIVE], full.slot_terms(Z)[:LIVE], **ROUNDING)
    np.testing.assert_allclose(bank.forward(Z), full.forward(Z), **ROUNDING)


@pytest.mark.parametrize(("orders", "expected", "base"), CASES[:3])
def test_a_cheap_branch_gives_the_full_branch_gradient(grad_of_square, orders, expected, base):
    bank = simple_bank(orders, base)
    full = forced_full(bank)
    got = grad_of_square(bank.parameters, bank)
    want = grad_of_square(full.parameters, full)
    for name in cb.PARAMETER_NAMES:
        np.testing.assert_allclose(
            got[name][:LIVE], want[name][:LIVE], rtol=1e-13, atol=1e-300, err_msg=name
        )


def test_a_z_derivative_of_a_cheap_branch_is_the_next_tower_row():
    bank = simple_bank((0, 0, 0, 0))
    slope = jax.vmap(jax.grad(lambda x: bank.forward(x)))(Z)
    scales, centers, weights = (
        np.asarray(getattr(bank, n)[:LIVE]) for n in ("scales", "centers", "weights")
    )
    u = scales[:, None] * (np.asarray(Z) - centers[:, None])
    s = 1 / (1 + np.exp(-u))
    expected = np.sum(weights[:, None] * scales[:, None] * s * (1 - s), axis=0)
    np.testing.assert_allclose(slope, expected, rtol=1e-13)


def test_a_commit_that_leaves_the_cheap_branch_does_not_recompile():
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
    assert accepted and branch(bank) == 0 and branch(candidate) == 2
    compiles = len(BACKEND_COMPILES)
    after_commit = forward(candidate, Z)
    grads = gradient(candidate.parameters, candidate)
    jax.block_until_ready(grads)
    assert len(BACKEND_COMPILES) == compiles
    # The pair slot really went through the full branch: as an ordinary slot it would differ.
    np.testing.assert_allclose(after_commit, before_commit, rtol=0, atol=3e-16)
    assert float(jnp.abs(grads["odd_moments"][0])) > 0


def test_vmapped_banks_on_different_branches_each_get_their_own_values():
    simple = simple_bank((0, 0, 0, 0))
    full = set_rows(
        simple, [("modes", 1, 2), ("moment_coefficients", 1, [0.1 * k for k in range(9)])]
    )
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), simple, full)
    together = jax.vmap(lambda b: b.forward(Z))(stacked)
    np.testing.assert_allclose(together[0], simple.forward(Z), **ROUNDING)
    np.testing.assert_allclose(together[1], full.forward(Z), **ROUNDING)
    # Each got its own branch: the moment slot moves the second bank's values well beyond that.
    assert float(jnp.max(jnp.abs(together[1] - together[0]))) > 1e-3
