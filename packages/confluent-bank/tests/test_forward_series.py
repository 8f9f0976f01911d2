"""Ordinary and moment slots are one series in the derivative rows per slot (issue 24, item 3).

`Σ_k a_k σ^(k)(u)` is evaluated as `a_0 σ + σ'·R(σ)` with `R` the combination of the Riccati
polynomials divided by `σ'`: one activation and one polynomial per slot, whatever the slot holds.
It must give the tower rows combined one by one to rounding, in float64 and float32, with every
`z`- and coefficient-derivative; be exactly `a_0 σ(±∞)` where the activation has saturated; and
a cluster commit that puts a moment slot in an ordinary bank must not recompile.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal, getcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BACKEND_COMPILES, always, moments

import confluent_bank as cb
import confluent_bank._activations as activations_module
import confluent_bank._forward as forward_module
from confluent_bank._activations import riccati_coefficients

Z = jnp.linspace(-2.5, 2.5, 11)
SERIES = activations_module._SERIES


def moment_bank(seed=0, *, max_order=4, base="sigmoid", dtype=jnp.float64):
    """Ordinary slots of every order and moment slots, no pair; slot 5 inactive."""
    rng = np.random.default_rng(seed)
    p = 6
    bank = cb.init_confluent_bank([], max_packs=p, max_order=max_order, base=base, dtype=dtype)
    rows = {
        "centers": rng.normal(size=p),
        "weights": rng.normal(size=p),
        "scales": 1 + 0.4 * rng.normal(size=p),
        "moment_coefficients": rng.normal(size=(p, max_order + 1)),
        "orders": np.arange(p) % (max_order + 1),
        "modes": np.array([0, 2, 0, 2, 0, 2]),
        "active": np.array([True, True, True, True, True, False]),
    }
    blocks = {k: jnp.asarray(v, dtype=getattr(bank, k).dtype) for k, v in rows.items()}
    return dataclasses.replace(bank, **blocks)


def reference_terms(bank, z):
    """The reference: every slot through the tower rows one by one, and all formulas."""
    per_slot = (slice(None),) + (None,) * z.ndim
    terms = jax.jit(forward_module._all_terms)(bank, z)
    return jnp.where(bank.active[per_slot], terms, jnp.zeros_like(terms))


def rows_combined(base, coefficients, z):
    tower = cb.sigma_tower(base, z, len(coefficients) - 1)
    return sum(c * tower[k] for k, c in enumerate(coefficients))


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_a_moment_bank_gives_the_reference_values_to_rounding(base, dtype):
    bank = moment_bank(base=base, dtype=dtype)
    terms = bank.slot_terms(Z.astype(dtype))
    assert terms.dtype == dtype
    rounding = (
        {"rtol": 1e-13, "atol": 1e-15} if dtype == jnp.float64 else {"rtol": 1e-5, "atol": 1e-6}
    )
    np.testing.assert_allclose(terms, reference_terms(bank, Z.astype(dtype)), **rounding)


@pytest.mark.parametrize(("dtype", "rtol"), [(jnp.float64, 1e-13), (jnp.float32, 1e-5)])
def test_a_moment_bank_gives_the_reference_gradient(dtype, rtol):
    bank = moment_bank(1, dtype=dtype)
    z = Z.astype(dtype)

    def ours(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(z) ** 2)

    def reference(parameters):
        return jnp.sum(jnp.sum(reference_terms(bank.with_parameters(parameters), z), axis=0) ** 2)

    got = jax.jit(jax.grad(ours))(bank.parameters)
    want = jax.jit(jax.grad(reference))(bank.parameters)
    for name in cb.PARAMETER_NAMES:
        # Relative to the block's scale: an entry may be a cancelling sum over the points.
        scale = float(jnp.max(jnp.abs(want[name])))
        np.testing.assert_allclose(
            got[name], want[name], rtol=rtol, atol=rtol * scale, err_msg=name
        )


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
def test_an_order_eight_slot_is_right_to_a_small_fraction_of_its_rounding_bound(base):
    # Against 60-digit arithmetic from the same float arguments. Any evaluation in the monomial
    # basis may round by eps·Σ|c|·|w·s^8| (Σ|c| ≈ 1.1e6 / 3.5e5 at order 8); the series, with
    # the factor σ' taken out exactly, stays within a twentieth of that.
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(8, 0.1, -0.9, 1.1)], max_packs=1, max_order=8, base=base
    )
    x = jnp.linspace(-4.0, 4.0, 33)
    got = np.asarray(bank.slot_terms(x)[0])
    getcontext().prec = 60
    coefficients = riccati_coefficients(base, 8)
    s, c, w = (Decimal(float(getattr(bank, n)[0])) for n in ("scales", "centers", "weights"))
    bound = (
        float(np.finfo(np.float64).eps) * sum(abs(k) for k in coefficients) * float(abs(w * s**8))
    )
    for value, point in zip(got, np.asarray(x), strict=True):
        u = s * (Decimal(float(point)) - c)
        e = (-u).exp() if base == "sigmoid" else (-2 * u).exp()
        a = 1 / (1 + e) if base == "sigmoid" else (1 - e) / (1 + e)
        exact = float(w * s**8 * sum(Decimal(k) * a**j for j, k in enumerate(coefficients)))
        assert abs(value - exact) <= 0.05 * bound, (point, value, exact, bound)


def test_a_z_derivative_of_a_moment_slot_is_the_shifted_moment_sum():
    bank = moment_bank(2, max_order=3)
    slope = jax.vmap(jax.grad(lambda x: bank.slot_terms(x)[1]))(Z)
    s, c = float(bank.scales[1]), float(bank.centers[1])
    rows = cb.sigma_tower("sigmoid", s * (Z - c), 4)
    m = bank.moment_coefficients[1]
    expected = s * sum(m[k] * rows[k + 1] for k in range(4))
    np.testing.assert_allclose(slope, expected, rtol=1e-12, atol=1e-14)  # a cancelling sum


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
def test_the_series_equals_the_rows_combined(base):
    coefficients = jnp.asarray([0.3, -1.2, 0.7, 0.05, -0.4, 0.9, 0.2])
    x = jnp.linspace(-6.0, 6.0, 49)
    np.testing.assert_allclose(
        SERIES[base](coefficients[:, None], x), rows_combined(base, coefficients, x), rtol=1e-12,
        atol=1e-13,
    )  # fmt: skip


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
def test_nested_z_derivatives_of_the_series_are_the_rows_shifted(base):
    coefficients = jnp.asarray([0.3, -1.2, 0.7, 0.05])
    x = jnp.linspace(-3.0, 3.0, 13)
    second = jax.vmap(jax.grad(jax.grad(lambda t: SERIES[base](coefficients, t))))(x)
    shifted = jnp.concatenate([jnp.zeros(2), coefficients])
    np.testing.assert_allclose(second, rows_combined(base, shifted, x), rtol=1e-12, atol=1e-13)


def test_the_coefficient_derivatives_of_the_series_are_the_rows():
    x = jnp.linspace(-3.0, 3.0, 13)
    jacobian = jax.jacrev(lambda a: SERIES["sigmoid"](a[:, None], x))(jnp.ones(5))
    np.testing.assert_allclose(jacobian.T, cb.sigma_tower("sigmoid", x, 4), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(("base", "low"), [("sigmoid", 0.0), ("tanh", -1.0)])
def test_a_saturated_series_is_exactly_its_first_coefficient_times_the_limit(base, low):
    coefficients = jnp.asarray([0.3, -1.2, 0.7, 0.05, -0.4])
    x = jnp.asarray([-800.0, -jnp.inf, 800.0, jnp.inf])
    values = SERIES[base](coefficients, x)
    np.testing.assert_array_equal(values, [0.3 * low, 0.3 * low, 0.3, 0.3])
    slopes = jax.vmap(jax.grad(lambda t: SERIES[base](coefficients, t)))(x)
    np.testing.assert_array_equal(slopes, np.zeros(4))


def test_the_series_refuses_an_order_whose_coefficients_overflow():
    with pytest.raises(ValueError, match="above 30, the highest order"):
        SERIES["sigmoid"](jnp.ones(32, dtype=jnp.float32), jnp.zeros(3, dtype=jnp.float32))


def test_a_cluster_commit_puts_a_moment_slot_in_an_ordinary_bank_without_recompiling():
    packs = [cb.RefinedPack(0, c, w) for c, w in [(-0.01, 0.7), (0.0, -0.2), (0.02, 0.5)]]
    bank = cb.init_confluent_bank(packs, max_packs=4, max_order=4)
    forward = jax.jit(lambda b, z: b.forward(z))
    gradient = jax.jit(jax.grad(lambda p, b: jnp.sum(b.with_parameters(p).forward(Z) ** 2)))
    forward(bank, Z)
    gradient(bank.parameters, bank)
    proposal = bank.propose_cluster((0, 1), order=4, error_budget=1.0)
    candidate, _, accepted = cb.commit_transition(
        bank, proposal, moments(bank), between_steps=True, acceptance=always
    )
    assert accepted and cb.SlotMode.MOMENTS in np.asarray(candidate.modes).tolist()
    compiles = len(BACKEND_COMPILES)
    values = forward(candidate, Z)
    jax.block_until_ready(gradient(candidate.parameters, candidate))
    assert len(BACKEND_COMPILES) == compiles
    np.testing.assert_allclose(
        values, jnp.sum(reference_terms(candidate, Z), axis=0), rtol=1e-13, atol=1e-15
    )
