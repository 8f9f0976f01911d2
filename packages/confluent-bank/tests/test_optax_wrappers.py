"""confluent_bank.optax: Adan, AdEMAMix, `ema`, `zero_nans`, `conditionally_mask` and the
plateau rule of `contrib.reduce_on_plateau`, carried through a commit and a growing bank's
births."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import commit_pair, moment_fields

import confluent_bank as cb

optax = pytest.importorskip("optax")
contrib = pytest.importorskip("optax.contrib")

import confluent_bank.optax as cbo  # noqa: E402

X = jnp.linspace(-1.0, 1.0, 5)
ADAM = {"mu": "first", "nu": "second"}
# Each optimizer, with the moment fields of its state and the NamedMomentState kind of the
# same parity ("first": carried linearly; "second": carried by the bound).
OPTIMIZERS = {
    "adan": (lambda: optax.adan(1e-2), {"m": "first", "v": "first", "n": "second", "g": "first"}),
    "ademamix": (lambda: contrib.ademamix(1e-2), {"m1": "first", "m2": "first", "nu": "second"}),
    "simplified_ademamix": (
        lambda: contrib.simplified_ademamix(1e-2),
        {"m": "first", "n": "second"},
    ),
    "ema": (lambda: optax.chain(optax.adam(1e-2), optax.ema(0.9)), {**ADAM, "ema": "first"}),
    "zero_nans": (lambda: optax.chain(optax.zero_nans(), optax.adam(1e-2)), ADAM),
    "conditionally_mask": (
        lambda: optax.transforms.conditionally_mask(optax.adam(1e-2), lambda step: step >= 0),
        ADAM,
    ),
    "reduce_on_plateau": (
        lambda: optax.chain(optax.adam(1e-2), contrib.reduce_on_plateau(patience=1)),
        ADAM,
    ),
}


@jax.jit
def _loss_and_gradient(parameters, bank):
    def loss(p):
        return jnp.sum((bank.with_parameters(p).forward(X) - X) ** 2)

    return jax.value_and_grad(loss)(parameters)


def _trained(bank, optimizer, steps=3, move=True):
    """An optax state after `steps` real steps from `bank`'s parameters, each given the loss
    (the plateau rule reads it), so that every moment row is non-zero (Adan's `v` too: the
    gradient changes from step to step). `move=False` keeps the parameters where they are,
    so the loss stalls. The bank itself is not moved."""
    parameters, state = bank.parameters, optimizer.init(bank.parameters)
    for _ in range(steps):
        value, gradient = _loss_and_gradient(parameters, bank)
        updates, state = optimizer.update(gradient, state, parameters, value=value)
        parameters = optax.apply_updates(parameters, updates) if move else parameters
    return state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_moment_field_is_carried_like_a_named_moment_of_its_parity(pair_bank, name):
    make, kinds = OPTIMIZERS[name]
    state = _trained(pair_bank, make())
    candidate, carried, accepted = commit_pair(pair_bank, state, state_adapter=cbo.commit_adapter())
    assert accepted
    before, after = moment_fields(state, kinds), moment_fields(carried, kinds)
    assert sorted(after) == sorted(kinds)
    for field, kind in kinds.items():
        named = cb.NamedMomentState(jnp.asarray(0), {kind: before[field]})
        _, expected, _ = commit_pair(pair_bank, named, state_adapter=cb.moment_carry_adapter())
        for block, value in after[field].items():
            np.testing.assert_allclose(value, expected.moments[kind][block], rtol=1e-12)
        assert float(jnp.abs(after[field]["odd_moments"][0])) > 0  # carried, not reset
    # The carried state is one the optimizer can go on with.
    value, gradient = _loss_and_gradient(candidate.parameters, candidate)
    make().update(gradient, carried, candidate.parameters, value=value)


def test_the_plateau_rules_scale_best_value_and_counters_are_kept(pair_bank):
    state = _trained(pair_bank, OPTIMIZERS["reduce_on_plateau"][0](), steps=4, move=False)
    plateau = state[1]
    assert float(plateau.scale) < 1.0  # patience 1 on a loss that stalls: it has acted
    _, carried, _ = commit_pair(pair_bank, state, state_adapter=cbo.commit_adapter())
    for field in plateau._fields:
        assert getattr(carried[1], field) is getattr(plateau, field)


def test_zero_nans_flags_are_kept(pair_bank):
    state = _trained(pair_bank, OPTIMIZERS["zero_nans"][0]())
    _, carried, _ = commit_pair(pair_bank, state, state_adapter=cbo.commit_adapter())
    assert carried[0].found_nan is state[0].found_nan


def test_a_bank_grows_under_adam_with_the_plateau_rule():
    x = jnp.linspace(-3.0, 3.0, 64)
    y = 0.5 * jnp.tanh(2.0 * x) + 0.2 * jnp.exp(-(x**2))
    packs = [cb.RefinedPack(0, c, 0.1, 1.0) for c in (-1.0, 1.0)]
    bank = cb.init_confluent_bank(packs, max_packs=8, max_order=2, dtype=jnp.float64)

    def objective(bank):
        return jnp.mean((bank.forward(x) - y) ** 2)

    optimizer = optax.chain(optax.adam(3e-2), contrib.reduce_on_plateau(patience=20))
    state = optimizer.init(bank.parameters)

    @jax.jit
    def step(bank, state):
        value, gradient = jax.value_and_grad(lambda p: objective(bank.with_parameters(p)))(
            bank.parameters
        )
        updates, state = optimizer.update(gradient, state, bank.parameters, value=value)
        return bank.with_parameters(optax.apply_updates(bank.parameters, updates)), state

    hook = cb.TransitionHook.growing(jax.jit(objective), (-3.0, 3.0), every=20)
    start = float(objective(bank))
    for i in range(1, 201):
        bank, state = step(bank, state)
        bank, state = hook.between_steps(i, bank, state)
    births = [e for e in hook.events if e.kind == "zero_output_birth" and e.accepted]
    assert births and int(np.sum(np.asarray(bank.active))) > 2
    assert float(objective(bank)) < 0.05 * start
