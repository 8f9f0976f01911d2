"""`TransitionHook.growing`: an objective that is not a scalar, or that jax cannot
differentiate, is named at the check that meets it, not deep inside the policy."""

import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb

optax = pytest.importorskip("optax")

X = jnp.linspace(-3.0, 3.0, 31)
TARGET = 0.7 * jnp.tanh(2.0 * X)


def _bank():
    packs = [cb.RefinedPack(0, -2.9, 0.0, 1.0), cb.RefinedPack(0, 2.9, 0.0, 1.0)]
    return cb.init_confluent_bank(packs, max_packs=6, max_order=2)


def _checks(objective, steps=(1, 2)):
    hook = cb.TransitionHook.growing(objective, (-3.0, 3.0), every=1, plateau=np.inf)
    bank = _bank()
    state = optax.adam(1e-2).init(bank.parameters)
    for step in steps:
        bank, state = hook.between_steps(step, bank, state)
    return hook


def test_an_objective_that_returns_an_array_is_refused_naming_its_shape():
    with pytest.raises(ValueError, match=r"objective must return a scalar .*shape \(31,\)"):
        _checks(lambda bank: (bank.forward(X) - TARGET) ** 2)


def test_an_objective_that_jax_cannot_differentiate_is_refused_at_the_scoring():
    def on_the_host(bank):  # float() of the traced value breaks jax.grad
        return float(jnp.mean((bank.forward(X) - TARGET) ** 2))

    with pytest.raises(TypeError, match=r"objective must be differentiable with jax\.grad"):
        _checks(on_the_host)


def test_a_differentiable_objective_with_a_python_branch_grows():
    # Not an error: jax.grad outside jit sees concrete values, so Python branching works.
    def clipped(bank):
        loss = jnp.mean((bank.forward(X) - TARGET) ** 2)
        return loss if loss > 0 else jnp.zeros_like(loss)

    hook = _checks(clipped)
    assert any(e.kind == "zero_output_birth" and e.accepted for e in hook.events)
