"""The bank at z = ±∞ returns its atoms' finite limits, with finite gradients (issue 11, item 11).

The reference for each limit is the ordinary formula at z = ±10⁴, where every activation has
saturated in float64, so values and gradients there are the limits up to rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import set_rows

import confluent_bank as cb

INFINITE = jnp.asarray([-jnp.inf, jnp.inf])
FAR = jnp.asarray([-1e4, 1e4])

# (kind, order, centre, weight, scale, mode, rho, odd moment, direction, direction bias)
SLOTS = [
    ("ordinary order 0", 0, 0.3, 1.5, 0.8, 0, 0.0, 0.0, 0.0, 1.0),
    ("ordinary order 0, negative scale", 0, -0.2, 0.7, -1.3, 0, 0.0, 0.0, 0.0, 1.0),
    ("ordinary order 2", 2, 0.1, -0.9, 1.1, 0, 0.0, 0.0, 0.0, 1.0),
    ("ordinary order 3, negative scale", 3, 0.4, 0.6, -0.7, 0, 0.0, 0.0, 0.0, 1.0),
    ("pair at the collision", 0, 0.2, 1.0, 1.0, 1, 0.0, 0.375, 0.0, 1.0),
    ("pair with a finite spread", 0, -0.1, 0.8, 1.2, 1, 0.3, -0.5, 0.0, 1.0),
    ("pair with a direction, collided", 0, 0.1, 0.9, 0.9, 1, 0.0, 0.4, 0.3, 1.1),
    ("pair with a direction, slopes of one sign", 0, 0.0, 1.0, 1.0, 1, 0.25, 0.7, 0.4, 0.2),
    ("pair with a direction, slopes of both signs", 0, 0.2, -0.6, 0.5, 1, 0.25, 0.7, 2.0, -0.3),
    ("moments", 0, 0.05, 0.0, 0.9, 2, 0.0, 0.0, 0.0, 1.0),
]
MOMENT_ROW = [0.4, -0.3, 0.2, 0.1]


def every_kind_bank(base):
    packs = [cb.RefinedPack(order, c, w, s) for _, order, c, w, s, *_ in SLOTS]
    bank = cb.init_confluent_bank(packs, max_packs=len(SLOTS), max_order=3, base=base)
    updates = []
    for i, (*_, mode, rho, odd, direction, bias) in enumerate(SLOTS):
        updates += [
            ("modes", i, mode),
            ("rho", i, rho),
            ("odd_moments", i, odd),
            ("directions", i, direction),
            ("direction_bias", i, bias),
        ]
    updates.append(("moment_coefficients", len(SLOTS) - 1, MOMENT_ROW))
    return set_rows(bank, updates)


@pytest.fixture(scope="module", params=["sigmoid", "tanh"])
def bank(request):
    return every_kind_bank(request.param)


def gradient(bank, x):
    def objective(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(x) ** 2)

    return jax.jit(jax.grad(objective))(bank.parameters)


def test_every_slot_kind_has_a_finite_value_at_infinity(bank):
    terms = np.asarray(bank.slot_terms(INFINITE))
    assert np.all(np.isfinite(terms))


@pytest.mark.parametrize("slot", range(len(SLOTS)), ids=[kind[0] for kind in SLOTS])
def test_every_slot_kind_tends_to_its_limit(bank, slot):
    np.testing.assert_allclose(
        bank.slot_terms(INFINITE)[slot], bank.slot_terms(FAR)[slot], rtol=1e-12, atol=1e-12
    )


def test_a_pair_with_slopes_of_both_signs_tends_to_half_over_the_spread(bank):
    # u ± hη = (0.5 ± 0.5·2)·z + …: one activation goes to +∞ and the other to −∞, so
    # A = (σ(∞) + σ(−∞))/2 and B = ±(σ(∞) − σ(−∞))/(2h) with h = 0.5.
    low, high = (-1.0, 1.0) if bank.base == "tanh" else (0.0, 1.0)
    a = (low + high) / 2
    b = (high - low) / (2 * 0.5)
    expected = [-0.6 * a - 0.7 * b, -0.6 * a + 0.7 * b]
    np.testing.assert_allclose(bank.slot_terms(INFINITE)[8], expected, rtol=1e-15)


def test_the_forward_at_infinity_is_the_sum_of_the_limits(bank):
    np.testing.assert_allclose(bank.forward(INFINITE), bank.forward(FAR), rtol=1e-12, atol=1e-12)


def test_parameter_gradients_at_infinity_are_finite_and_the_limits(bank):
    at_infinity, far = gradient(bank, INFINITE), gradient(bank, FAR)
    for name in cb.PARAMETER_NAMES:
        assert np.all(np.isfinite(at_infinity[name])), name
        np.testing.assert_allclose(
            at_infinity[name], far[name], rtol=1e-10, atol=1e-10, err_msg=name
        )


def test_the_input_gradient_at_infinity_is_zero(bank):
    slope = jax.vmap(jax.grad(lambda x: bank.forward(x)))(INFINITE)
    np.testing.assert_array_equal(slope, [0.0, 0.0])


def test_infinite_points_do_not_disturb_finite_points(bank):
    # Same shape on both sides: XLA may round a differently shaped program's fused multiply-adds
    # differently, which says nothing about the infinite points.
    x = jnp.asarray([-0.5, jnp.inf, 0.25, -jnp.inf])
    finite = jnp.asarray([-0.5, 0.0, 0.25, 0.0])
    np.testing.assert_array_equal(bank.forward(x)[::2], bank.forward(finite)[::2])


def test_a_simple_bank_at_infinity_is_finite_with_finite_gradients():
    packs = [cb.RefinedPack(0, 0.1, 1.0), cb.RefinedPack(0, 0.3, -0.5, -2.0)]
    simple = cb.init_confluent_bank(packs, max_packs=3, max_order=3)
    np.testing.assert_array_equal(simple.forward(INFINITE), [-0.5, 1.0])
    grads = gradient(simple, INFINITE)
    assert all(np.all(np.isfinite(grads[name])) for name in cb.PARAMETER_NAMES)
    np.testing.assert_allclose(grads["weights"], gradient(simple, FAR)["weights"], rtol=1e-15)


def test_a_zero_scale_slot_keeps_its_constant_value_at_infinity():
    bank = cb.init_confluent_bank([cb.RefinedPack(0, 0.3, 1.5)], max_packs=2, max_order=3)
    bank = set_rows(bank, [("scales", 0, 0.0)])
    np.testing.assert_array_equal(bank.forward(INFINITE), [0.75, 0.75])


def test_a_collided_pair_with_zero_scale_and_a_direction_diverges_at_infinity():
    # u = 0 for every z while η = v·z + d grows: B = η σ'(0) has no finite limit.
    bank = cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 1.0)], max_packs=2, max_order=3)
    bank = set_rows(
        bank, [("scales", 0, 0.0), ("modes", 0, 1), ("odd_moments", 0, 0.5), ("directions", 0, 2.0)]
    )
    np.testing.assert_array_equal(bank.forward(INFINITE), [-np.inf, np.inf])


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_the_public_atoms_are_finite_at_infinity(activation):
    def pair(z, rho):
        return cb.collision_atom(z, rho, 0.7, 1.0, 0.5, activation=activation)

    def moment(z, row):
        return cb.moment_atom(z, row, activation=activation)

    row = jnp.asarray(MOMENT_ROW)
    for z in (-jnp.inf, jnp.inf):
        for rho in (0.0, 1e-8, 0.5):
            values = (pair(z, rho), *jax.grad(pair, argnums=(0, 1))(z, rho))
            assert all(np.isfinite(v) for v in values)
        values = (moment(z, row), jax.grad(moment)(z, row), *jax.grad(moment, argnums=1)(z, row))
        assert all(np.isfinite(v) for v in values)
