"""A bank without centred pairs evaluates only the tower rows its slots use (issue 24, item 3).

Moment slots need rows `0..max_order`, as ordinary slots do. So a bank of ordinary and moment
slots takes the mixed branch: one tower of height `max_order`, no pair formulas. It must give the
full branch's values and gradient to rounding, in float64 and float32, and a cluster commit
that puts a moment slot in an ordinary bank must not recompile. The limits at `z = ±∞` are
traced once for both directions.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BACKEND_COMPILES, always, moments

import confluent_bank as cb
import confluent_bank._forward as forward_module

Z = jnp.linspace(-2.5, 2.5, 11)


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


def full_terms(bank, z):
    """The reference: every slot through the height-max(N, 11) tower and all formulas."""
    per_slot = (slice(None),) + (None,) * z.ndim
    terms = jax.jit(forward_module._all_terms)(bank, z)
    return jnp.where(bank.active[per_slot], terms, jnp.zeros_like(terms))


def branch(bank):
    return int(forward_module._branch(bank, forward_module._ordinary_heights(bank.max_order)))


@pytest.mark.parametrize("base", ["sigmoid", "tanh"])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_a_moment_bank_gives_the_full_branch_values_to_rounding(base, dtype):
    bank = moment_bank(base=base, dtype=dtype)
    assert branch(bank) == len(forward_module._ordinary_heights(bank.max_order))
    terms = bank.slot_terms(Z.astype(dtype))
    assert terms.dtype == dtype
    # XLA fuses multiply-adds differently in the two programs: the last bits may differ.
    rounding = (
        {"rtol": 1e-13, "atol": 1e-15} if dtype == jnp.float64 else {"rtol": 1e-5, "atol": 1e-6}
    )
    np.testing.assert_allclose(terms, full_terms(bank, Z.astype(dtype)), **rounding)


@pytest.mark.parametrize(("dtype", "rtol"), [(jnp.float64, 1e-13), (jnp.float32, 1e-5)])
def test_a_moment_bank_gives_the_full_branch_gradient(dtype, rtol):
    bank = moment_bank(1, dtype=dtype)
    z = Z.astype(dtype)

    def ours(parameters):
        return jnp.sum(bank.with_parameters(parameters).forward(z) ** 2)

    def reference(parameters):
        return jnp.sum(jnp.sum(full_terms(bank.with_parameters(parameters), z), axis=0) ** 2)

    got = jax.jit(jax.grad(ours))(bank.parameters)
    want = jax.jit(jax.grad(reference))(bank.parameters)
    for name in cb.PARAMETER_NAMES:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-30, err_msg=name)


def test_a_z_derivative_of_a_moment_slot_is_the_shifted_moment_sum():
    bank = moment_bank(2, max_order=3)
    slope = jax.vmap(jax.grad(lambda x: bank.slot_terms(x)[1]))(Z)
    s, c = float(bank.scales[1]), float(bank.centers[1])
    rows = cb.sigma_tower("sigmoid", s * (Z - c), 4)
    m = bank.moment_coefficients[1]
    expected = s * sum(m[k] * rows[k + 1] for k in range(4))
    np.testing.assert_allclose(slope, expected, rtol=1e-12, atol=1e-14)  # a cancelling sum


def test_a_cluster_commit_moves_an_ordinary_bank_to_the_mixed_branch_without_recompiling():
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
    assert accepted and branch(bank) == 0 and branch(candidate) == 2
    compiles = len(BACKEND_COMPILES)
    values = forward(candidate, Z)
    jax.block_until_ready(gradient(candidate.parameters, candidate))
    assert len(BACKEND_COMPILES) == compiles
    np.testing.assert_array_equal(values, jnp.sum(full_terms(candidate, Z), axis=0))


def test_the_limits_at_infinity_are_traced_once_for_both_directions(monkeypatch):
    calls = []
    real = forward_module._limits

    def counting(bank, direction):
        calls.append(direction)
        return real(bank, direction)

    monkeypatch.setattr(forward_module, "_limits", counting)
    bank = moment_bank(3)
    values = bank.forward(jnp.asarray([-np.inf, 0.25, np.inf, 7.0, -3.0]))  # a fresh shape
    assert len(calls) == 1
    monkeypatch.undo()
    expected = [bank.forward(jnp.asarray(x)) for x in (-np.inf, 0.25, np.inf, 7.0, -3.0)]
    np.testing.assert_array_equal(values, np.asarray(expected))
