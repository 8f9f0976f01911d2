"""Slots are an array axis: one series (and, for pairs, one tower) for all slots, a program that
does not grow with capacity, and values equal to the reference's slot-by-slot formulas (issue 3,
point 1)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import jaxpr_equations, set_rows

import confluent_bank as cb
import confluent_bank._forward as forward_module


def count_equations(jaxpr) -> int:
    """Equations of a jaxpr, including those of every nested sub-jaxpr (jit, scan, custom rules)."""
    return sum(1 for _ in jaxpr_equations(jaxpr))


def random_bank(seed, max_packs, max_order, base="sigmoid"):
    """Every mode, active and inactive slots, near and finite pair spreads, trained directions."""
    rng = np.random.default_rng(seed)
    p = max_packs
    bank = cb.init_confluent_bank([], max_packs=p, max_order=max_order, base=base)
    rho = np.where(np.arange(p) % 3 == 0, 0.0, rng.uniform(size=p) ** 4)
    rows = {
        "centers": rng.normal(size=p),
        "weights": rng.normal(size=p),
        "scales": 1 + 0.5 * rng.normal(size=p),
        "rho": rho,
        "odd_moments": rng.normal(size=p),
        "directions": 0.3 * rng.normal(size=p),
        "direction_bias": 1 + 0.2 * rng.normal(size=p),
        "moment_coefficients": rng.normal(size=(p, max_order + 1)),
        "orders": rng.integers(0, max_order + 1, size=p),
        "modes": np.arange(p) % 3,
        "active": rng.uniform(size=p) < 0.8,
    }
    return dataclasses.replace(
        bank,
        **{
            name: jnp.asarray(value, dtype=getattr(bank, name).dtype)
            for name, value in rows.items()
        },
    )


def reference_slot_terms(bank, z):
    """The reference's formulation: a Python loop over slots, one tower per slot."""
    terms = []
    height = max(bank.max_order, 11)
    for i in range(bank.max_packs):
        argument = bank.scales[i] * (z - bank.centers[i])
        tower = cb.sigma_tower(bank.base, argument, height)
        ordinary = jnp.zeros_like(z)
        for order in range(bank.max_order + 1):
            value = bank.weights[i] * bank.scales[i] ** order * tower[order]
            ordinary = ordinary + jnp.where(bank.orders[i] == order, value, 0.0)
        pair = cb.collision_atom(
            argument,
            bank.rho[i],
            bank.directions[i] * z + bank.direction_bias[i],
            bank.weights[i],
            bank.odd_moments[i],
            activation=bank.base,
            tower=tower,
        )
        moments = cb.moment_atom(
            argument, bank.moment_coefficients[i], activation=bank.base, tower=tower
        )
        value = jnp.where(
            bank.modes[i] == 0, ordinary, jnp.where(bank.modes[i] == 1, pair, moments)
        )
        terms.append(jnp.where(bank.active[i], value, 0.0))
    return jnp.stack(terms)


Z = jnp.linspace(-3.0, 3.0, 41)


def gradient_jaxpr_size(max_packs, max_order, base="sigmoid"):
    bank = random_bank(0, max_packs, max_order, base)

    def objective(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(Z) ** 2)

    return count_equations(jax.make_jaxpr(jax.grad(objective))(bank.parameters).jaxpr)


@pytest.mark.parametrize(("max_order", "base"), [(3, "sigmoid"), (8, "tanh")])
def test_gradient_program_does_not_grow_with_capacity(max_order, base):
    small = gradient_jaxpr_size(4, max_order, base)
    large = gradient_jaxpr_size(64, max_order, base)
    assert small == large
    assert small > 50  # the count really descends into the nested programs


def test_one_series_is_evaluated_for_all_slots(monkeypatch):
    calls = []
    real = forward_module._SERIES["sigmoid"]

    def counting(coefficients, u):
        calls.append((coefficients.shape, u.shape))
        return real(coefficients, u)

    monkeypatch.setitem(forward_module._SERIES, "sigmoid", counting)
    bank = random_bank(1, 5, 3)
    bank.forward(jnp.zeros((1, 7)))  # a shape no other test uses, so it is traced here
    assert calls == [((4, 5, 1, 1), (5, 1, 7))]


def test_the_pair_branch_evaluates_one_two_row_tower_for_all_slots(monkeypatch):
    calls = []
    real = forward_module.sigma_tower_rows

    def counting(activation, z, order):
        calls.append((order, z.shape))
        return real(activation, z, order)

    monkeypatch.setattr(forward_module, "sigma_tower_rows", counting)
    bank = random_bank(1, 5, 3)
    bank.forward(jnp.zeros((2, 7)))  # a shape no other test uses, so it is traced here
    assert calls == [(1, (5, 2, 7))]


def test_a_spec_with_only_a_stacked_tower_serves_the_pair_branch(monkeypatch):
    calls = []
    real = forward_module.get_activation("tanh")

    def tower(z, order):
        calls.append(order)
        return real.tower(z, order)

    spec = dataclasses.replace(real, tower=tower, rows=None)
    monkeypatch.setattr(forward_module, "get_activation", lambda name: spec)
    bank = random_bank(6, 4, 2, "tanh")
    x = jnp.linspace(-1.0, 1.0, 13)
    terms = bank.slot_terms(x)
    assert calls == [1]
    monkeypatch.undo()
    np.testing.assert_array_equal(terms, bank.slot_terms(x))


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
def test_slot_terms_equal_the_slot_by_slot_reference(base):
    bank = random_bank(3, 6, 4, base)
    # The bank sums each slot's rows as one series (a polynomial in σ with the rows' Riccati
    # coefficients combined), the reference row by row: both round high-order rows by
    # ~eps·Σ|coefficients|, differently, so they agree to rounding, not bitwise.
    reference = jax.jit(reference_slot_terms)(bank, Z)
    np.testing.assert_allclose(bank.slot_terms(Z), reference, rtol=1e-13, atol=1e-15)


def test_mixed_mode_pair_bank_terms_and_norms_match_the_reference(pair_bank):
    bank = set_rows(pair_bank, [("modes", 0, 1), ("modes", 1, 2)])
    bank = dataclasses.replace(bank, moment_coefficients=bank.moment_coefficients.at[1, 1].set(0.7))
    x = jnp.linspace(-0.5, 0.5, 9)
    reference = reference_slot_terms(bank, x)
    np.testing.assert_allclose(bank.slot_terms(x), reference, rtol=0, atol=3e-16)
    norms = np.sqrt(np.sum(np.asarray(reference[:3]) ** 2, axis=1))
    np.testing.assert_allclose(bank.pack_term_norms(x), norms, rtol=1e-15)


def sum_in_slot_order(terms: np.ndarray) -> np.ndarray:
    """`0 + terms[0] + terms[1] + ...` in float arithmetic, one add at a time."""
    total = np.zeros_like(terms[0])
    for term in terms:
        total = total + term
    return total


@pytest.mark.parametrize("capacity", [16, 128])
def test_forward_accumulates_slot_terms_in_slot_order(capacity):
    bank = random_bank(4, capacity, 3)
    terms = np.asarray(bank.slot_terms(Z))
    expected = sum_in_slot_order(terms)
    np.testing.assert_array_equal(bank.forward(Z), expected)
    np.testing.assert_array_equal(jax.jit(cb.bank_forward)(bank, Z), expected)


def test_a_bank_wider_than_128_slots_sums_its_terms_in_slot_order_to_rounding():
    # Summed in a loop over blocks of 16 (173 leaves a remainder of 13): the same adds,
    # but XLA fuses the terms differently, so the value may differ by an ulp.
    bank = random_bank(4, 173, 3)
    terms = np.asarray(bank.slot_terms(Z))
    expected = sum_in_slot_order(terms)
    ulp = np.finfo(terms.dtype).eps * np.sum(np.abs(terms), axis=0)
    assert np.all(np.abs(np.asarray(bank.forward(Z)) - expected) <= 4 * ulp)


def test_parameter_gradient_equals_the_reference_gradient():
    bank = random_bank(5, 3, 2)

    def ours(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(Z) ** 2)

    def reference(parameters):
        return jnp.sum(jnp.sum(reference_slot_terms(bank.with_parameters(parameters), Z), 0) ** 2)

    got = jax.jit(jax.grad(ours))(bank.parameters)
    want = jax.jit(jax.grad(reference))(bank.parameters)
    for name in cb.PARAMETER_NAMES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-11, err_msg=name)
