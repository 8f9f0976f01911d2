"""Activations and the derivative tower (spec 1.2, 1.3; seed tower-parity tests)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import jet

import confluent_bank as cb
from confluent_bank._activations import MAX_TOWER_ORDER, riccati_coefficients

X = jnp.array([-0.2, 0.0, 0.5])


def jet_derivatives(fn, z, order):
    """Independent reference: derivatives 1..order of `fn` at `z` by Taylor-mode autodiff."""
    series = [jnp.ones_like(z)] + [jnp.zeros_like(z)] * (order - 1)
    _, derivatives = jet.jet(fn, (z,), ((*series,),))
    return derivatives


@pytest.mark.parametrize(
    ("kind", "order", "expected"),
    [
        ("sigmoid", 1, (0, 1, -1)),
        ("sigmoid", 2, (0, 1, -3, 2)),
        ("sigmoid", 3, (0, 1, -7, 12, -6)),
        ("sigmoid", 4, (0, 1, -15, 50, -60, 24)),
        ("tanh", 1, (1, 0, -1)),
        ("tanh", 2, (0, -2, 0, 2)),
        ("tanh", 3, (-2, 0, 8, 0, -6)),
        ("tanh", 4, (0, 16, 0, -40, 0, 24)),
    ],
)
def test_riccati_coefficients_match_the_closed_forms(kind, order, expected):
    assert riccati_coefficients(kind, order) == expected


def test_tanh_polynomials_have_the_parity_of_order_plus_one():
    for n in range(12):
        coefficients = riccati_coefficients("tanh", n)
        assert all(c == 0 for k, c in enumerate(coefficients) if (k + n) % 2 == 0)


def test_riccati_orders_above_the_cap_are_rejected():
    with pytest.raises(ValueError, match="order"):
        riccati_coefficients("sigmoid", 513)


@pytest.mark.parametrize(("name", "native"), [("sigmoid", jax.nn.sigmoid), ("tanh", jnp.tanh)])
def test_tower_matches_taylor_mode_autodiff(name, native):
    z = jnp.linspace(-4.0, 4.0, 17)
    tower = cb.sigma_tower(name, z, 8)
    assert tower.shape == (9, 17)
    np.testing.assert_array_equal(tower[0], native(z))
    reference = jet_derivatives(native, z, 8)
    for n in range(1, 9):
        # Float64 Horner error scales like eps · Σ|coefficients| (spec 7.3).
        atol = max(1e-13, 4 * np.finfo(np.float64).eps * cb.derivative_bound(name, n))
        np.testing.assert_allclose(tower[n], reference[n - 1], rtol=1e-11, atol=atol)


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "softplus"])
def test_tower_rows_equal_the_per_order_fastpath_exactly(name):
    spec = cb.get_activation(name)
    tower = spec.tower(X, 6)
    for n in range(7):
        np.testing.assert_array_equal(tower[n], spec.fastpath(X, n))


def test_softplus_tower_is_the_shifted_sigmoid_tower():
    tower = cb.sigma_tower("softplus", X, 4)
    np.testing.assert_array_equal(tower[0], jax.nn.softplus(X))
    np.testing.assert_array_equal(tower[1:], cb.sigma_tower("sigmoid", X, 3))


def test_exp_tower_repeats_the_exponential():
    np.testing.assert_array_equal(cb.sigma_tower("exp", X, 3), jnp.stack([jnp.exp(X)] * 4))


def test_negative_tower_order_is_rejected():
    with pytest.raises(ValueError, match="order"):
        cb.get_activation("sigmoid").tower(X, -1)
    with pytest.raises(ValueError, match="order"):
        cb.sigma_tower("sigmoid", X, -1)


def test_a_spec_without_fastpath_has_no_derivatives_even_with_a_tower():
    spec = dataclasses.replace(cb.get_activation("sigmoid"), fastpath=None)
    np.testing.assert_array_equal(cb.sigma_tower(spec, X, 0)[0], jax.nn.sigmoid(X))
    with pytest.raises(ValueError, match="fastpath"):
        cb.sigma_tower(spec, X, 1)


def test_a_spec_without_tower_is_built_from_its_fastpath():
    base = cb.get_activation("tanh")
    spec = cb.ActivationSpec("custom", base.forward, base.fastpath, None)
    np.testing.assert_array_equal(cb.sigma_tower(spec, X, 5), base.tower(X, 5))


def test_an_unimplemented_fastpath_order_is_a_value_error_naming_the_order():
    def fastpath(z, n):
        if n > 2:
            raise NotImplementedError
        return cb.get_activation("sigmoid").fastpath(z, n)

    spec = cb.ActivationSpec("partial", jax.nn.sigmoid, fastpath, None)
    assert cb.sigma_tower(spec, X, 2).shape == (3, 3)
    with pytest.raises(ValueError, match="order 3"):
        cb.sigma_tower(spec, X, 3)


def test_get_activation_resolves_names_aliases_and_specs():
    sigmoid = cb.get_activation("sigmoid")
    assert cb.get_activation("logistic") is sigmoid
    assert cb.get_activation("Sigmoid") is sigmoid
    assert cb.get_activation(sigmoid) is sigmoid
    assert cb.get_activation("tanh").name == "tanh"


def test_get_activation_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(KeyError, match="logistic"):
        cb.get_activation("relu")


def test_get_activation_rejects_non_string_non_spec_arguments():
    with pytest.raises(TypeError, match="activation"):
        cb.get_activation(3)


def test_tower_preserves_input_shape_and_dtype():
    z = jnp.zeros((2, 3), dtype=jnp.float32)
    tower = cb.sigma_tower("tanh", z, 4)
    assert tower.shape == (5, 2, 3)
    assert tower.dtype == jnp.float32


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "softplus", "exp"])
def test_tower_rows_are_the_tower_split_into_rows(name):
    rows = cb.sigma_tower_rows(name, X, 5)
    assert isinstance(rows, tuple) and len(rows) == 6
    np.testing.assert_array_equal(jnp.stack(rows), cb.sigma_tower(name, X, 5))


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_the_derivative_of_a_tower_row_is_the_next_row(name):
    z = jnp.linspace(-3.0, 3.0, 7)
    grads = jax.jacfwd(lambda z: jnp.stack(cb.sigma_tower_rows(name, z, 4)))(z)
    tower = cb.sigma_tower(name, z, 5)
    for k in range(5):
        np.testing.assert_array_equal(jnp.diagonal(grads[k]), tower[k + 1])
    fastpath = cb.get_activation(name).fastpath
    second = jax.grad(jax.grad(lambda t: fastpath(t, 2)))(0.3)
    np.testing.assert_array_equal(second, fastpath(jnp.asarray(0.3), 4))


def test_tower_rows_follow_the_fastpath_rule():
    spec = dataclasses.replace(cb.get_activation("sigmoid"), fastpath=None)
    with pytest.raises(ValueError, match="fastpath"):
        cb.sigma_tower_rows(spec, X, 1)
    with pytest.raises(ValueError, match="order"):
        cb.sigma_tower_rows("sigmoid", X, -1)


@pytest.mark.parametrize(
    ("name", "dtype", "limit"),
    [("sigmoid", jnp.float64, 159), ("tanh", jnp.float64, 162), ("sigmoid", jnp.float32, 30)],
)
def test_a_row_whose_coefficients_overflow_the_dtype_is_a_value_error(name, dtype, limit):
    fastpath = cb.get_activation(name).fastpath
    z = jnp.zeros(2, dtype=dtype)
    assert np.all(np.isfinite(fastpath(z, limit)))
    with pytest.raises(
        ValueError, match=f"order {limit + 1} of {name} is above {limit}.*{jnp.dtype(dtype)}"
    ):
        fastpath(z, limit + 1)


def test_a_tower_above_the_dtype_limit_is_a_value_error():
    z = jnp.zeros(2, dtype=jnp.float32)
    with pytest.raises(ValueError, match="order 31 of sigmoid is above 30"):
        cb.sigma_tower("sigmoid", z, 31)


def test_the_exact_coefficients_still_reach_order_512():
    assert len(riccati_coefficients("sigmoid", MAX_TOWER_ORDER)) == 514
