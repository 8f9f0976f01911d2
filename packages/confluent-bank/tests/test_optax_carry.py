"""confluent_bank.optax: optax states carried through a commit, and the per-row warm-up."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import always, commit_pair, moment_fields, trained_optax_state

import confluent_bank as cb

optax = pytest.importorskip("optax")
import confluent_bank.optax as cbo  # noqa: E402

X = jnp.linspace(-1.0, 1.0, 5)
OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2),
    "adabelief": lambda: optax.adabelief(1e-2),
    "sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
    "row_warmup": lambda: cbo.row_warmup(optax.adam(1e-2), steps=4),
}
# The moment fields of each optimizer's state, with the NamedMomentState kind they stand for.
KINDS = {"mu": "first", "trace": "momentum", "nu": "second"}


@pytest.fixture(scope="module")
def pb(pair_bank):
    return pair_bank


@jax.jit
@jax.grad
def _gradient(parameters, bank):
    return jnp.sum((bank.with_parameters(parameters).forward(X) - X) ** 2)


def _trained_state(bank, optimizer, steps=3):
    return trained_optax_state(bank, optimizer, _gradient, steps)


def _moment_trees(state):
    """`{field: tree}` of every moment tree in an optax state (first occurrence)."""
    return moment_fields(state, KINDS)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_commit_adapter_carries_optax_moments_like_named_moments(pb, name):
    state = _trained_state(pb, OPTIMIZERS[name]())
    candidate, carried, accepted = commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    assert accepted
    before, after = _moment_trees(state), _moment_trees(carried)
    assert before
    named = cb.NamedMomentState(jnp.asarray(0), {KINDS[f]: tree for f, tree in before.items()})
    _, expected, _ = commit_pair(pb, named, state_adapter=cb.moment_carry_adapter())
    for field, tree in after.items():
        for block, value in tree.items():
            np.testing.assert_allclose(value, expected.moments[KINDS[field]][block], rtol=1e-12)
    assert float(jnp.abs(after[next(iter(after))]["odd_moments"][0])) > 0  # carried, not reset
    grads = jax.tree.map(jnp.ones_like, candidate.parameters)
    OPTIMIZERS[name]().update(grads, carried, candidate.parameters)


def test_the_default_commit_adapter_keeps_counts_and_hyperparameters(pb):
    state = _trained_state(pb, optax.inject_hyperparams(optax.adam)(learning_rate=1e-2))
    _, carried, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    assert carried.count is state.count and carried.hyperparams is state.hyperparams
    assert carried.inner_state[0].count is state.inner_state[0].count


def test_commit_adapter_rejects_a_non_boolean_transport():
    with pytest.raises(TypeError, match="transport"):
        cbo.commit_adapter(transport="yes")


# --- row_warmup ------------------------------------------------------------------------------


def test_row_warmup_leaves_a_fresh_run_unscaled(pb):
    plain, warm = optax.sgd(0.1), cbo.row_warmup(optax.sgd(0.1), steps=5)
    grads = jax.tree.map(jnp.ones_like, pb.parameters)
    expected, _ = plain.update(grads, plain.init(pb.parameters))
    updates, state = warm.update(grads, warm.init(pb.parameters))
    jax.tree.map(np.testing.assert_array_equal, updates, expected)
    assert int(state.ramp["weights"][0]) == 5


def test_row_warmup_ramps_a_born_slot_linearly_and_leaves_the_others(pb):
    warm = cbo.row_warmup(optax.sgd(1.0), steps=4)
    state = warm.init(pb.parameters)
    proposal = pb.propose_birth(3, cb.RefinedPack(0, 0.5, 0.0, 1.0))
    born, state, _ = cb.commit_transition(
        pb,
        proposal,
        state,
        between_steps=True,
        acceptance=always,
        state_adapter=cbo.commit_adapter(),
    )
    grads = jax.tree.map(jnp.ones_like, born.parameters)
    factors = []
    for _ in range(6):
        updates, state = warm.update(grads, state)
        factors.append(-float(updates["weights"][3]))
        assert float(updates["weights"][0]) == -1.0
    assert factors == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_the_reset_adapter_restarts_the_warmup_of_every_affected_row(pb):
    warm = cbo.row_warmup(optax.adam(1e-2), steps=3)
    state = warm.init(pb.parameters)
    _, state, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter(transport=False))
    assert state.ramp["centers"].tolist() == [0, 0, 3, 3]


def test_a_pair_restarts_the_warmup_of_its_directions_only(pb):
    warm = cbo.row_warmup(optax.adam(1e-2), steps=3)
    _, state, _ = commit_pair(pb, warm.init(pb.parameters), state_adapter=cbo.commit_adapter())
    assert state.ramp["directions"].tolist() == [0, 3, 3, 3]
    assert state.ramp["centers"].tolist() == [3, 3, 3, 3]


def test_a_permutation_moves_the_warmup_counters(pb):
    warm = cbo.row_warmup(optax.adam(1e-2), steps=3)
    state = warm.init(pb.parameters)
    state = state._replace(ramp={**state.ramp, "weights": jnp.array([0, 1, 2, 3], jnp.int32)})
    _, moved = cb.permute_bank(
        pb, (3, 2, 1, 0), state, between_steps=True, state_adapter=cbo.transport_adapter()
    )
    assert moved.ramp["weights"].tolist() == [3, 2, 1, 0]


@pytest.mark.parametrize(("steps", "error"), [(0, ValueError), (2.5, TypeError)])
def test_row_warmup_rejects_a_bad_ramp_length(steps, error):
    with pytest.raises(error, match="steps"):
        cbo.row_warmup(optax.adam(1e-2), steps=steps)


@pytest.mark.parametrize("where", ["dict", "full_bank"])
def test_the_carry_is_the_same_wherever_the_bank_sits(pb, where):
    optimizer = optax.adam(1e-2)
    reference = commit_pair(pb, _trained_state(pb, optimizer), state_adapter=cbo.commit_adapter())
    expected = reference[1][0].mu
    params = {"bank": pb.parameters, "w": jnp.ones(3)} if where == "dict" else pb
    state = optimizer.init(params)
    grads = jax.tree.map(jnp.zeros_like, params)
    if where == "dict":
        grads["bank"] = _gradient(pb.parameters, pb)
    else:
        grads = dataclasses.replace(grads, **_gradient(pb.parameters, pb))
    for _ in range(3):
        _, state = optimizer.update(grads, state, params)
    _, carried, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    mu = carried[0].mu
    for name in cb.PARAMETER_NAMES:
        value = mu["bank"][name] if where == "dict" else getattr(mu, name)
        np.testing.assert_allclose(value, expected[name], rtol=1e-12)
    if where == "dict":
        assert mu["w"] is state[0].mu["w"]
