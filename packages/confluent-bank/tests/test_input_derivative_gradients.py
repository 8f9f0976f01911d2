"""The parameter gradient of the bank's input derivative (reverse over forward).

An implicit ODE solver (diffrax's `Kvaerno5`, say) differentiates the vector field with
respect to the state in its Newton steps, and training then differentiates that with respect
to the parameters. So `∂/∂θ (∂f/∂x)` must be right for every slot kind: ordinary atoms, a
centred pair on both sides of its series radius, and a moment slot. Checked against central
differences of the forward-mode derivative, in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make_pair_committed_bank, set_rows

X = jnp.array([-0.6, -0.58, -0.5714, -0.55, 0.0, 0.3, 1.2, 2.5])
STEP = 1e-6


def mixed_bank():
    """PB after its pair commit (slot 0), its pair given a direction slope so `η = 0.7x + 0.4`
    crosses the series radius inside `X`, and its order-1 atom (slot 2) made a moment slot."""
    bank = make_pair_committed_bank()
    return set_rows(
        bank,
        [
            ("directions", 0, 0.7),
            ("direction_bias", 0, 0.4),
            ("modes", 2, 2),
            ("moment_coefficients", 2, [0.2, -0.3, 0.15, 0.05]),
        ],
    )


def input_derivative(bank, parameters):
    """`∂f/∂x` at `X` `[8]`, by forward mode, as an implicit solver's Jacobian takes it."""
    forward = bank.with_parameters(parameters).forward
    return jax.jvp(forward, (X,), (jnp.ones_like(X),))[1]


def objective(bank, parameters):
    return jnp.sum(jnp.sin(3 * X) * input_derivative(bank, parameters))


@pytest.fixture(scope="module")
def bank():
    return mixed_bank()  # float64: conftest enables x64 for the whole suite


def test_the_points_lie_on_both_sides_of_the_pairs_series_radius(bank):
    eta = bank.directions[0] * X + bank.direction_bias[0]
    near = np.asarray(bank.rho[0] * eta**2 <= 0.01**2)
    assert near.any() and not near.all()


def test_the_input_derivative_is_the_jacobians_diagonal(bank):
    jacobian = jax.jacfwd(bank.forward)(X)
    np.testing.assert_allclose(
        np.diag(jacobian), input_derivative(bank, bank.parameters), rtol=1e-14, atol=1e-15
    )
    np.testing.assert_array_equal(jacobian - np.diag(np.diag(jacobian)), 0.0)


@pytest.mark.parametrize(
    "name",
    ["centers", "weights", "scales", "rho", "odd_moments", "directions", "direction_bias",
     "moment_coefficients"],
)  # fmt: skip
def test_the_gradient_of_the_input_derivative_matches_central_differences(bank, name):
    parameters = bank.parameters
    gradient = jax.jit(jax.grad(lambda p: objective(bank, p)))(parameters)[name]
    value = np.asarray(parameters[name], dtype=np.float64)
    differences = np.zeros_like(value)
    score = jax.jit(lambda p: objective(bank, p))
    for i in range(value.size):
        step = np.zeros_like(value)
        step.flat[i] = STEP
        up = score({**parameters, name: jnp.asarray(value + step)})
        down = score({**parameters, name: jnp.asarray(value - step)})
        differences.flat[i] = (up - down) / (2 * STEP)
    assert np.abs(np.asarray(gradient)).max() > 1e-3  # the slot kinds under test do move it
    np.testing.assert_allclose(gradient, differences, rtol=0.0, atol=1e-8)
