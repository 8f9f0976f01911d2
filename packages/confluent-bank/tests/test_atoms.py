"""The three atoms: centred pair (spec 1.4, seed tests 10-12), moment atom (1.5), retraction."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import jet

import confluent_bank as cb

Z = jnp.array([-2.1, -0.3, 0.4, 2.0])
ETA = jnp.array([-1.4, -0.2, 0.7, 1.2])
NATIVE = {"sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh}
TOL = {"rtol": 1e-10, "atol": 1e-12}


@functools.partial(jax.jit, static_argnums=(0, 2))
def derivatives(name, z, order):
    """σ^(0..order)(z) by Taylor-mode autodiff (independent of the Riccati tower)."""
    series = [jnp.ones_like(z)] + [jnp.zeros_like(z)] * (order - 1)
    value, rest = jet.jet(NATIVE[name], (z,), ((*series,),))
    return [value, *rest]


def pair(name, z, rho, eta):
    a = cb.collision_atom(z, rho, eta, 1.0, 0.0, activation=name)
    b = cb.collision_atom(z, rho, eta, 0.0, 1.0, activation=name)
    return a, b


pair_jit = jax.jit(pair, static_argnums=0)


def direct(name, z, rho, eta):
    h = math.sqrt(rho)
    plus, minus = NATIVE[name](z + h * eta), NATIVE[name](z - h * eta)
    return (plus + minus) / 2, (plus - minus) / (2 * h)


def series(name, z, rho, eta, shift=0, terms=6):
    """The T-term series of (A, B) (or of their `shift`-th z-derivatives) from autodiff."""
    d = derivatives(name, z, 2 * terms + shift)
    a = sum(
        d[2 * k + shift] * rho**k * eta ** (2 * k) / math.factorial(2 * k) for k in range(terms)
    )
    b = sum(
        d[2 * k + 1 + shift] * rho**k * eta ** (2 * k + 1) / math.factorial(2 * k + 1)
        for k in range(terms)
    )
    return a, b


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
@pytest.mark.parametrize("rho", [0.0, 1e-24, 1e-8, 0.03, 2.0])
def test_pair_values_match_independent_references(name, rho):
    a, b = pair_jit(name, Z, jnp.asarray(rho), ETA)
    reference = direct(name, Z, rho, ETA) if rho >= 0.03 else series(name, Z, rho, ETA)
    np.testing.assert_allclose(a, reference[0], **TOL)
    np.testing.assert_allclose(b, reference[1], **TOL)


def _z_derivatives(fn, count):
    """`[f', f'', …]` of an elementwise function by nested forward mode."""
    result = []
    for _ in range(count):
        fn = functools.partial(lambda f, z: jax.jvp(f, (z,), (jnp.ones_like(z),))[1], fn)
        result.append(fn)
    return result


@functools.partial(jax.jit, static_argnums=0)
def pair_z_derivatives(name, z, rho, eta):
    return [d(z) for d in _z_derivatives(lambda z: sum(pair(name, z, rho, eta)), 4)]


@functools.partial(jax.jit, static_argnums=0)
def direct_z_derivatives(name, z, rho, eta):
    return [d(z) for d in _z_derivatives(lambda z: sum(direct_traced(name, z, rho, eta)), 4)]


@functools.partial(jax.jit, static_argnums=0)
def pair_rho_gradient(name, z, rho, eta):
    return jax.grad(lambda r: jnp.sum(sum(pair(name, z, r, eta))))(rho)


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
@pytest.mark.parametrize("rho", [0.0, 1e-8, 0.03, 2.0])
def test_four_z_derivatives_of_the_pair_match_the_references(name, rho):
    ours = pair_z_derivatives(name, Z, jnp.asarray(rho), ETA)
    if rho >= 0.03:
        expected = direct_z_derivatives(name, Z, jnp.asarray(rho), ETA)
    else:
        # ρ ≤ 1e-8: series terms beyond ρ² are far below the tolerance.
        expected = [sum(series(name, Z, rho, ETA, shift=j, terms=3)) for j in range(1, 5)]
    for value, reference in zip(ours, expected, strict=True):
        np.testing.assert_allclose(value, reference, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
@pytest.mark.parametrize("rho", [0.0, 1e-8, 0.03, 2.0])
def test_rho_gradient_of_the_pair_matches_the_references(name, rho):
    grad = pair_rho_gradient(name, Z, jnp.asarray(rho), ETA)
    if rho >= 0.03:
        expected = jax.grad(lambda r: jnp.sum(sum(direct_traced(name, Z, r, ETA))))(rho)
    else:
        d = derivatives(name, Z, 13)
        expected = jnp.sum(
            sum(
                k
                * rho ** (k - 1)
                * (
                    d[2 * k] * ETA ** (2 * k) / math.factorial(2 * k)
                    + d[2 * k + 1] * ETA ** (2 * k + 1) / math.factorial(2 * k + 1)
                )
                for k in range(1, 6)
            )
        )
    np.testing.assert_allclose(grad, expected, **TOL)


def direct_traced(name, z, rho, eta):
    h = jnp.sqrt(rho)
    plus, minus = NATIVE[name](z + h * eta), NATIVE[name](z - h * eta)
    return (plus + minus) / 2, (plus - minus) / (2 * h)


def test_rho_derivative_at_the_collision_is_the_second_and_third_derivative_term():
    d = derivatives("sigmoid", Z, 3)
    grad = jax.jit(jax.vmap(jax.grad(lambda r, z, e: sum(pair("sigmoid", z, r, e))), (None, 0, 0)))(
        jnp.asarray(0.0), Z, ETA
    )
    np.testing.assert_allclose(grad, d[2] * ETA**2 / 2 + d[3] * ETA**3 / 6, **TOL)


def test_fourth_rho_derivative_at_the_boundary_matches_the_series_formula():
    z, eta = 0.2, 0.7

    def f(r):
        return sum(pair("sigmoid", jnp.asarray(z), r, jnp.asarray(eta)))

    for _ in range(4):
        f = jax.grad(f)
    value = float(jax.jit(f)(jnp.asarray(0.0)))
    d = derivatives("sigmoid", jnp.asarray(z), 9)
    formula = 24 * (d[8] * eta**8 / math.factorial(8) + d[9] * eta**9 / math.factorial(9))
    np.testing.assert_allclose(value, formula, rtol=1e-10)
    np.testing.assert_allclose(value, 6.566726481549967e-05, rtol=1e-10)


def test_pair_values_and_gradients_stay_finite_in_the_tails():
    z = jnp.array([-80.0, -20.0, 20.0, 80.0])[:, None]
    rho = jnp.array([0.0, 1e-30, 1.0, 1e20])[None, :]
    for name in ("sigmoid", "tanh"):

        @jax.jit
        def check(z, r, m0, m1):
            def total(z, r):
                return jnp.sum(cb.collision_atom(z, r, 1.0, m0, m1, activation=name))

            value = cb.collision_atom(z, r, 1.0, m0, m1, activation=name)
            return (value, *jax.grad(total, argnums=(0, 1))(z, r))

        for m0, m1 in ((1.0, 0.0), (0.0, 1.0)):
            for result in check(z, rho, m0, m1):
                assert bool(jnp.all(jnp.isfinite(result)))


def test_parameter_gradients_are_finite_at_zero_and_huge_spreads():
    rho = jnp.array([0.0, 1e-12, 5e-5, 1e20, 1e300])

    def total(r, e):
        return jnp.sum(cb.collision_atom(0.3, r, e, 0.8, -0.4))

    grad_rho, grad_eta = jax.jit(jax.grad(total, argnums=(0, 1)))(rho, jnp.full(5, 0.9))
    assert bool(jnp.all(jnp.isfinite(grad_rho))) and bool(jnp.all(jnp.isfinite(grad_eta)))


@pytest.mark.parametrize("delta", [0.3, 0.05, 1e-3, 1e-9])
def test_two_common_scale_atoms_equal_their_centred_pair(delta):
    plus, minus = 2.0, -1.0
    expected = plus * jax.nn.sigmoid(Z + delta) + minus * jax.nn.sigmoid(Z - delta)
    value = cb.collision_atom(Z, delta**2, 1.0, plus + minus, delta * (plus - minus))
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-15)


def test_at_zero_spread_the_pair_is_exactly_a_derivative_neuron():
    tower = cb.sigma_tower("sigmoid", Z, 11)
    a, b = pair("sigmoid", Z, 0.0, ETA)
    np.testing.assert_array_equal(a, tower[0])
    np.testing.assert_array_equal(b, tower[1] * ETA)


def test_negative_spreads_evaluate_as_zero_spread():
    np.testing.assert_array_equal(
        cb.collision_atom(Z, -0.5, ETA, 1.0, 0.3), cb.collision_atom(Z, 0.0, ETA, 1.0, 0.3)
    )


def test_a_supplied_tower_is_used_and_gives_the_same_value():
    tower = cb.sigma_tower("tanh", Z, 11)
    np.testing.assert_array_equal(
        cb.collision_atom(Z, 1e-6, ETA, 1.0, 0.5, activation="tanh", tower=tower),
        cb.collision_atom(Z, 1e-6, ETA, 1.0, 0.5, activation="tanh"),
    )


def test_collision_atom_validates_its_configuration():
    with pytest.raises(ValueError, match="sigmoid and tanh"):
        cb.collision_atom(Z, 0.0, 1.0, 1.0, 0.0, activation="softplus")
    with pytest.raises(ValueError, match="series_terms"):
        cb.collision_atom(Z, 0.0, 1.0, 1.0, 0.0, series_terms=0)
    for radius in (0.0, 0.2):
        with pytest.raises(ValueError, match="series_radius"):
            cb.collision_atom(Z, 0.0, 1.0, 1.0, 0.0, series_radius=radius)
    with pytest.raises(ValueError, match="more than 11 rows"):
        cb.collision_atom(Z, 0.0, 1.0, 1.0, 0.0, tower=cb.sigma_tower("sigmoid", Z, 10))


def test_logistic_alias_is_accepted_by_the_pair():
    np.testing.assert_array_equal(
        cb.collision_atom(Z, 0.1, 1.0, 1.0, 0.2, activation="logistic"),
        cb.collision_atom(Z, 0.1, 1.0, 1.0, 0.2),
    )


def test_retract_spread_projects_onto_nonnegative_spreads():
    np.testing.assert_array_equal(
        cb.retract_spread(jnp.array([-0.5, 0.0, 0.25])), jnp.array([0.0, 0.0, 0.25])
    )


def test_retract_spread_derivative_is_one_at_zero_and_zero_below():
    grad = jax.grad(lambda r: cb.retract_spread(r))
    assert float(grad(jnp.asarray(0.0))) == 1.0
    assert float(grad(jnp.asarray(-1.0))) == 0.0


def test_moment_atom_is_the_truncated_derivative_expansion():
    moments = jnp.array([0.7, 0.2, -0.1, 0.05])
    d = derivatives("sigmoid", Z, 3)
    expected = sum(moments[k] * d[k] for k in range(4))
    np.testing.assert_allclose(cb.moment_atom(Z, moments), expected, rtol=1e-14, atol=1e-15)


def test_moment_atom_approximates_a_cluster_of_shifted_atoms():
    offsets, coefficients = (0.01, -0.02, 0.015), (0.7, -0.2, 0.5)
    init = cb.initialize_moments(offsets, coefficients, order=4)
    exact = sum(a * jax.nn.sigmoid(Z + b) for a, b in zip(coefficients, offsets, strict=True))
    np.testing.assert_allclose(cb.moment_atom(Z, jnp.array(init.moments)), exact, atol=1e-12)


def test_moment_atom_validates_moments_and_tower():
    with pytest.raises(ValueError, match="1-D"):
        cb.moment_atom(Z, jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="non-empty"):
        cb.moment_atom(Z, jnp.zeros(0))
    with pytest.raises(ValueError, match="at least 4 rows"):
        cb.moment_atom(Z, jnp.ones(4), tower=cb.sigma_tower("sigmoid", Z, 2))


# Near the collision the pair is evaluated from exact rational forms in e^{−|z|} and the entire
# functions cosh √w, sinh √w / √w of w = ρη² (no derivative rows beyond σ'): the checks below
# pin what that form must keep: agreement with the closed form across the series radius, and
# full relative accuracy where the activation is tiny or the pair's value is near 0.


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_the_pair_is_continuous_across_the_series_radius(name):
    eta = jnp.asarray(0.8)
    edge = 0.01**2 / eta**2  # ρη² = r²: the last spread evaluated near the collision
    inside, outside = jnp.asarray(edge * (1 - 1e-12)), jnp.asarray(edge * (1 + 1e-12))
    for rho in (inside, outside):
        np.testing.assert_allclose(
            pair_jit(name, Z, rho, eta), direct(name, Z, float(rho), eta), rtol=1e-11, atol=1e-14
        )
    a_in, b_in = pair_jit(name, Z, inside, eta)
    a_out, b_out = pair_jit(name, Z, outside, eta)
    np.testing.assert_allclose(a_in, a_out, rtol=1e-14)
    np.testing.assert_allclose(b_in, b_out, rtol=1e-12)
    grad_in = pair_rho_gradient(name, Z, inside, eta)
    grad_out = pair_rho_gradient(name, Z, outside, eta)
    np.testing.assert_allclose(grad_in, grad_out, rtol=1e-6)


@pytest.mark.parametrize("z", [-30.0, -300.0, -700.0])
def test_the_sigmoid_pair_keeps_relative_accuracy_in_the_lower_tail(z):
    rho, eta = 1e-6, 0.9  # ρη² < r²: the near-collision form
    u = math.sqrt(rho) * eta
    # Relatively accurate references in float64: σ(x) = e^x / (1 + e^x), and
    # σ(z + u) − σ(z − u) = e^{z−u}·expm1(2u) / ((1 + e^{z+u})(1 + e^{z−u})).
    plus, minus = math.exp(z + u), math.exp(z - u)
    reference_a = (plus / (1 + plus) + minus / (1 + minus)) / 2
    reference_b = minus * math.expm1(2 * u) / ((1 + plus) * (1 + minus)) / (2 * math.sqrt(rho))
    a, b = pair_jit("sigmoid", jnp.asarray(z), jnp.asarray(rho), jnp.asarray(eta))
    np.testing.assert_allclose(float(a), reference_a, rtol=1e-13)
    np.testing.assert_allclose(float(b), reference_b, rtol=1e-13)


def test_the_tanh_pair_keeps_relative_accuracy_where_its_value_is_near_zero():
    z, rho, eta = 1e-12, 1e-6, 1.0
    t, s = math.tanh(z), math.tanh(math.sqrt(rho) * eta)
    # tanh(z + u) + tanh(z − u) = 2 tanh z (1 − tanh²u) / (1 − tanh²z tanh²u): no cancellation.
    reference = t * (1 - s * s) / (1 - t * t * s * s)
    a, _ = pair_jit("tanh", jnp.asarray(z), jnp.asarray(rho), jnp.asarray(eta))
    np.testing.assert_allclose(float(a), reference, rtol=1e-14)
    assert float(pair_jit("tanh", jnp.asarray(0.0), jnp.asarray(rho), jnp.asarray(eta))[0]) == 0.0


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_the_z_derivative_of_the_pair_at_zero_is_not_lost_to_the_absolute_value(name):
    # e^{−|z|} would give z = 0 a zero derivative; the pair's slope there is σ''' terms away
    # from σ'(0), not zero.
    slope = jax.grad(lambda z: sum(pair(name, z, jnp.asarray(1e-6), jnp.asarray(0.7))))(
        jnp.asarray(0.0)
    )
    expected = sum(series(name, jnp.asarray(0.0), 1e-6, 0.7, shift=1))
    np.testing.assert_allclose(float(slope), float(expected), rtol=1e-12)
