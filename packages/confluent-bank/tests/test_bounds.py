"""Rigorous error bounds and the `within_error_budget` acceptance factory (spec 1.6, 7.4)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cluster_init, set_rows

import confluent_bank as cb

GRID = jnp.linspace(-3.0, 3.0, 601)


def moment_bank(cluster_bank, order):
    """CB with slots 0-2 replaced by one moment slot of the given order, built by hand."""
    init = cluster_init(order)
    row = init.moments + (0.0,) * (cluster_bank.max_order - order)
    return set_rows(
        cluster_bank,
        [
            ("centers", 0, float(-init.center)),
            ("modes", 0, 2),
            ("orders", 0, order),
            ("moment_coefficients", 0, row),
            ("active", 1, False),
            ("weights", 1, 0.0),
            ("active", 2, False),
            ("weights", 2, 0.0),
        ],
    )


def proposal(bank, kind, slots, updates=(), budget=0.0):
    ids = tuple(int(bank.slot_ids[i]) for i in slots)
    digest = cb.snapshot_digest(bank.portable_snapshot())
    return cb.TransitionProposal(digest, 0, ids, tuple(updates), kind, "test", budget)


def test_derivative_bound_is_the_coefficient_sum():
    assert cb.derivative_bound("sigmoid", 4) == 150
    assert cb.derivative_bound("logistic", 1) == 2
    assert cb.derivative_bound("tanh", 2) == 4


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_derivative_bound_dominates_the_true_maximum(name):
    z = jnp.linspace(-12.0, 12.0, 2001)
    tower = np.asarray(cb.sigma_tower(name, z, 10))
    for n in range(11):
        assert np.max(np.abs(tower[n])) <= cb.derivative_bound(name, n)


def test_derivative_bound_exists_only_for_sigmoid_and_tanh():
    with pytest.raises(ValueError, match="sigmoid and tanh"):
        cb.derivative_bound("softplus", 1)


def test_cluster_remainder_reproduces_the_spec_value():
    bound = cb.cluster_remainder(cluster_init(3), "sigmoid")
    assert bound.lo == 0.0
    assert bound.hi == pytest.approx(3.8e-7, rel=0.05)


@pytest.mark.parametrize("order", [0, 1, 2, 3, 4])
def test_cluster_remainder_bounds_the_committed_error(cluster_bank, order):
    error = np.max(
        np.abs(moment_bank(cluster_bank, order).forward(GRID) - cluster_bank.forward(GRID))
    )
    assert error <= cb.cluster_remainder(cluster_init(order), "sigmoid").hi


def test_cluster_order_three_error_matches_the_spec_measurement(cluster_bank):
    x = jnp.array([-0.2, 0.4])
    error = np.max(np.abs(moment_bank(cluster_bank, 3).forward(x) - cluster_bank.forward(x)))
    assert error < 2e-9
    assert error == pytest.approx(2.2e-10, rel=0.1)


def test_cluster_remainder_bounds_spatial_derivatives(cluster_bank):
    def slope(bank):
        return jax.vmap(jax.grad(lambda x: bank.forward(x)))(GRID)

    error = np.max(np.abs(slope(moment_bank(cluster_bank, 2)) - slope(cluster_bank)))
    assert error <= cb.cluster_remainder(cluster_init(2), "sigmoid", 1, 1.0).hi


def test_pair_derivative_error_is_zero_at_zero_spread():
    assert cb.pair_derivative_error(0.0, 1.0, 1.0, 0.375) == cb.Interval(0.0, 0.0)


@pytest.mark.parametrize("q", [0, 1])
def test_pair_derivative_error_bounds_the_limit_change(pair_committed_bank, q):
    limit = set_rows(pair_committed_bank, [("rho", 0, 0.0)])

    def values(bank):
        f = lambda x: bank.forward(x)  # noqa: E731
        for _ in range(q):
            f = jax.grad(f)
        return jax.vmap(f)(GRID)

    error = np.max(np.abs(values(limit) - values(pair_committed_bank)))
    bound = cb.pair_derivative_error(0.015625, 1.0, 1.0, 0.375, spatial_order=q).hi
    assert 0 < error <= bound


def test_pair_derivative_error_with_a_direction_bounds_the_change(pair_committed_bank):
    bank = set_rows(pair_committed_bank, [("directions", 0, 0.4), ("direction_bias", 0, 0.7)])
    limit = set_rows(bank, [("rho", 0, 0.0)])
    error = np.max(np.abs(limit.forward(GRID) - bank.forward(GRID)))
    eta = 0.4 * 3 + 0.7
    bound = cb.pair_derivative_error(0.015625, eta, 1.0, 0.375, direction=0.4).hi
    assert 0 < error <= bound


def test_pair_derivative_error_accepts_intervals():
    point = cb.pair_derivative_error(0.01, 0.5, 1.0, 1.0)
    interval = cb.pair_derivative_error(cb.Interval(0.0, 0.01), cb.Interval(-0.5, 0.2), 1.0, 1.0)
    assert interval == point


def test_pair_series_error_is_the_next_series_term_bound():
    a, b = cb.pair_series_error(1e-4, 1.0)
    rho = Fraction(1e-4)
    assert a.hi == pytest.approx(
        float(rho**6 * cb.derivative_bound("sigmoid", 12) / math.factorial(12)), rel=1e-15
    )
    assert b.hi == pytest.approx(
        float(rho**6 * cb.derivative_bound("sigmoid", 13) / math.factorial(13)), rel=1e-15
    )
    assert a.hi < 1e-21 and b.hi < 1e-21  # far below float64 resolution
    with pytest.raises(ValueError, match="series_terms"):
        cb.pair_series_error(1e-4, 1.0, 0)


def _duplicate_merge(_bank):
    twins = [cb.RefinedPack(0, 0.5, 1.0), cb.RefinedPack(0, 0.5, 2.0)]
    bank = cb.init_confluent_bank(twins, max_packs=2, max_order=0)
    return bank, bank.propose_pair(0, 1)


def _remove_zero(bank):
    bank = set_rows(bank, [("weights", 2, 0.0)])
    return bank, bank.propose_remove_zero(2)


EXACT_PROPOSALS = {
    "centered_pair": lambda bank: (bank, bank.propose_pair(0, 1)),
    "duplicate_merge": _duplicate_merge,
    "remove_zero": _remove_zero,
    "zero_output_birth": lambda bank: (bank, bank.propose_birth(3, cb.RefinedPack(1, 0.4))),
}


@pytest.mark.parametrize("kind", sorted(EXACT_PROPOSALS))
def test_exact_kinds_pass_at_budget_zero(pair_bank, kind):
    bank, exact = EXACT_PROPOSALS[kind](pair_bank)
    assert exact.kind == kind and exact.error_budget == 0
    assert cb.within_error_budget((-1.0, 1.0))(bank, exact)


def test_pair_to_derivative_needs_a_budget_above_its_bound(pair_committed_bank):
    accept = cb.within_error_budget((-3.0, 3.0))
    bound = cb.pair_derivative_error(0.015625, 1.0, 1.0, 0.375).hi
    update = (cb.SlotUpdate("rho", 0, 0.0),)
    bank = pair_committed_bank
    assert not accept(bank, proposal(bank, "pair_to_derivative", (0,), update, 0.0))
    assert not accept(bank, proposal(bank, "pair_to_derivative", (0,), update, bound / 2))
    assert accept(bank, proposal(bank, "pair_to_derivative", (0,), update, bound))


def test_cluster_budget_is_judged_by_the_rigorous_remainder(cluster_bank):
    accept = cb.within_error_budget((-3.0, 3.0))
    tight = cluster_bank.propose_cluster((0, 1, 2), order=3, error_budget=1e-7)
    loose = dataclasses.replace(tight, error_budget=1e-6)
    assert not accept(cluster_bank, tight)  # 3.8e-7 > 1e-7: the bound is loose, not the error
    assert accept(cluster_bank, loose)


def test_derivative_orders_tighten_the_acceptance(cluster_bank):
    candidate = cluster_bank.propose_cluster((0, 1, 2), order=3, error_budget=1e-6)
    assert cb.within_error_budget((-3.0, 3.0))(cluster_bank, candidate)
    assert not cb.within_error_budget((-3.0, 3.0), spatial_orders=(0, 2))(cluster_bank, candidate)


def test_unknown_kinds_have_no_bound(pair_bank):
    with pytest.raises(ValueError, match="no error bound"):
        cb.within_error_budget((-1.0, 1.0))(pair_bank, proposal(pair_bank, "mystery", (0,)))


@pytest.mark.parametrize("domain", [(1.0, -1.0), (0.0, float("inf")), (0.0,), "ab"])
def test_within_error_budget_validates_the_domain(domain):
    with pytest.raises(ValueError, match="domain"):
        cb.within_error_budget(domain)


def test_within_error_budget_validates_spatial_orders():
    with pytest.raises(ValueError, match="spatial_orders"):
        cb.within_error_budget((-1.0, 1.0), spatial_orders=(-1,))
