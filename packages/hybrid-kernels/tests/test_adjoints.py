"""Adjoint consistency on the oscillator: gradients against central finite differences."""

import diffrax
import jax.numpy as jnp
import pytest
from helpers import (
    Omega,
    oscillator_simulate,
    oscillator_simulate_args,
    position_output,
    tiny_solver,
)

import hybrid_kernels as hk

OMEGA0 = 1.1  # start away from the truth (1.3) so the gradient is clearly non-zero
H = 1e-5


def omega(w):
    return (Omega(jnp.asarray(w)),)


@pytest.fixture(scope="module")
def bp(oscillator):
    return oscillator.dataset([10, 10]).bucket_payloads[0]


def gradient_and_fd(simulate_fn, adjoint, bp):
    # Reverse mode: the adjoint under test is used only there ("auto" picks forward here).
    solver = tiny_solver(adjoint=adjoint, rtol=1e-9, atol=1e-11, sensitivity="reverse")
    step = hk.build_bucket_step(simulate_fn, position_output, solver, hk.masked_mse, True)
    _, grads = step(omega(OMEGA0), bp, 1.0)
    up, _ = step(omega(OMEGA0 + H), bp, 1.0)
    down, _ = step(omega(OMEGA0 - H), bp, 1.0)
    return float(grads[0].omega), (float(up) - float(down)) / (2 * H)


@pytest.fixture(scope="module")
def direct(bp):
    return gradient_and_fd(oscillator_simulate, diffrax.DirectAdjoint(), bp)


@pytest.fixture(scope="module")
def checkpointed(bp):
    return gradient_and_fd(oscillator_simulate, diffrax.RecursiveCheckpointAdjoint(), bp)


def test_direct_adjoint_matches_finite_differences(direct):
    grad, fd = direct
    assert grad == pytest.approx(fd, rel=1e-2)


@pytest.mark.slow
def test_recursive_checkpoint_adjoint_matches_finite_differences(checkpointed):
    grad, fd = checkpointed
    assert grad == pytest.approx(fd, rel=1e-2)


@pytest.mark.slow
def test_direct_and_recursive_checkpoint_agree(direct, checkpointed):
    assert direct[0] == pytest.approx(checkpointed[0], rel=1e-5)


@pytest.mark.slow
def test_backsolve_with_predictors_threaded_through_args_matches_finite_differences(bp):
    grad, fd = gradient_and_fd(oscillator_simulate_args, diffrax.BacksolveAdjoint(), bp)
    assert grad == pytest.approx(fd, rel=1e-2)


def test_backsolve_with_closed_over_predictors_raises(bp):
    solver = tiny_solver(adjoint=diffrax.BacksolveAdjoint())
    step = hk.build_bucket_step(oscillator_simulate, position_output, solver, hk.masked_mse, True)
    with pytest.raises(ValueError, match="BacksolveAdjoint only differentiates values passed"):
        step(omega(OMEGA0), bp, 1.0)
