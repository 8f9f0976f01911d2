"""confluent_bank.optax: optax states carried through commits, permutations and relabels."""

import dataclasses
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import commit_pair, trained_optax_state

import confluent_bank as cb

optax = pytest.importorskip("optax")
import confluent_bank.optax as cbo  # noqa: E402

X = jnp.linspace(-1.0, 1.0, 5)
ODD_FIELDS = {"mu", "trace", "acc_grads"}
EVEN_FIELDS = {"nu", "nu_max", "sum_of_squares", "e_g", "e_x"}

OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2),
    "sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "adabelief": lambda: optax.adabelief(1e-2),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
    "multi_steps": lambda: optax.MultiSteps(optax.sgd(1e-2, momentum=0.5), 3),
    "apply_if_finite": lambda: optax.apply_if_finite(optax.adam(1e-2), 3),
    "named_chain": lambda: optax.named_chain(("clip", optax.clip(1.0)), ("adam", optax.adam(1e-2))),
}


@pytest.fixture(scope="module")
def pb(pair_bank):
    """The spec's pair bank PB (conftest's session fixture)."""
    return pair_bank


@jax.jit
@jax.grad
def _gradient(parameters, bank):
    # the linear term gives every row of every block a non-zero gradient
    linear = sum(jnp.sum(value) for value in parameters.values())
    return jnp.sum(bank.with_parameters(parameters).forward(X) ** 2) + 1e-3 * linear


def _trained_state(bank, optimizer, steps=2):
    return trained_optax_state(bank, optimizer, _gradient, steps)


def _parity(path):
    names = {key.name for key in path if isinstance(key, jax.tree_util.GetAttrKey)}
    if names & ODD_FIELDS:
        return "odd"
    if names & EVEN_FIELDS:
        return "even"
    return None


def _block(path):
    last = path[-1]
    if isinstance(last, jax.tree_util.DictKey):
        return last.key
    if isinstance(last, jax.tree_util.FlattenedIndexKey):
        return cb.STATE_NAMES[last.key]
    return last.name


def _pairs(before, after):
    """(path, old leaf, new leaf) for two states of one structure."""
    old, treedef = jax.tree_util.tree_flatten_with_path(before)
    new, new_treedef = jax.tree_util.tree_flatten_with_path(after)
    assert treedef == new_treedef
    return [(path, a, b) for (path, a), (_, b) in zip(old, new, strict=True)]


# --- commit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_reset_adapter_zeroes_the_affected_rows_of_every_moment_and_keeps_counts(pb, name):
    optimizer = OPTIMIZERS[name]()
    state = _trained_state(pb, optimizer)
    adapter = cbo.commit_adapter(transport=False)
    candidate, next_state, accepted = commit_pair(pb, state, state_adapter=adapter)
    assert accepted
    moment_leaves = 0
    for path, old, new in _pairs(state, next_state):
        if _parity(path) is None:
            assert new is old, jax.tree_util.keystr(path)  # counts, hyperparameters, ...
            continue
        moment_leaves += 1
        np.testing.assert_array_equal(np.asarray(new)[:2], 0)
        np.testing.assert_array_equal(np.asarray(new)[2:], np.asarray(old)[2:])
    assert moment_leaves >= len(cb.PARAMETER_NAMES)
    # the adapted state keeps working with the optimizer
    grads = jax.tree.map(jnp.ones_like, candidate.parameters)
    optimizer.update(grads, next_state, candidate.parameters)


MORE_OPTIMIZERS = {
    "amsgrad": lambda: optax.amsgrad(1e-2),
    "lion": lambda: optax.lion(1e-2),
    "rmsprop_centered_momentum": lambda: optax.rmsprop(1e-2, centered=True, momentum=0.9),
    "adagrad": lambda: optax.adagrad(1e-2),
    "adadelta": lambda: optax.adadelta(1e-2),
    "masked": lambda: optax.masked(
        optax.adam(1e-2), {name: name != "rho" for name in cb.PARAMETER_NAMES}
    ),
}


@pytest.mark.parametrize("name", sorted(MORE_OPTIMIZERS))
def test_other_known_optimizers_are_adapted_too(pb, name):
    state = _ones_state(MORE_OPTIMIZERS[name](), pb.parameters)
    _, next_state, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter(transport=False))
    for path, old, new in _pairs(state, next_state):
        if _parity(path) is None or np.ndim(old) == 0:
            assert new is old
        else:
            np.testing.assert_array_equal(
                np.asarray(new),
                [0, 0, 1, 1] if new.ndim == 1 else [[0] * 4, [0] * 4, [1] * 4, [1] * 4],
            )


def test_a_rejected_commit_returns_the_optax_state_itself(pb):
    state = _trained_state(pb, optax.adam(1e-2), steps=1)
    _, same, accepted = cb.commit_transition(
        pb,
        pb.propose_pair(0, 1),
        state,
        between_steps=True,
        acceptance=lambda b, p: False,
        state_adapter=cbo.commit_adapter(),
    )
    assert same is state and not accepted


# --- transports ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adam", "sgd_momentum", "adabelief", "inject_hyperparams"])
def test_permutation_moves_every_moment_row(pb, name):
    state = _trained_state(pb, OPTIMIZERS[name]())
    permutation = (2, 0, 3, 1)
    candidate, next_state = cb.permute_bank(
        pb, permutation, state, between_steps=True, state_adapter=cbo.transport_adapter()
    )
    assert candidate.slot_ids.tolist() == [2, 0, 3, 1]
    for path, old, new in _pairs(state, next_state):
        if _parity(path) is None:
            assert new is old
        else:
            np.testing.assert_array_equal(new, np.asarray(old)[list(permutation)])


@pytest.mark.parametrize("name", ["adam", "sgd_momentum", "adabelief", "chain"])
def test_tanh_relabel_flips_odd_moments_of_weights_and_scales(tanh_bank, name):
    state = _trained_state(tanh_bank, OPTIMIZERS[name]())
    _, next_state = cb.relabel_tanh_sign(
        tanh_bank, (0, 2), state, between_steps=True, state_adapter=cbo.transport_adapter()
    )
    sign = np.array([-1.0, 1.0, -1.0, 1.0])
    for path, old, new in _pairs(state, next_state):
        parity = _parity(path)
        if parity == "odd" and _block(path) in ("weights", "scales"):
            np.testing.assert_array_equal(new, np.asarray(old) * sign)
        elif parity is None:
            assert new is old
        else:
            np.testing.assert_array_equal(new, old)


# --- where the bank sits in the params -------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
    """An equinox-like module: a pytree dataclass with named fields."""

    bank: cb.ConfluentPackBank
    w: jax.Array


def _filtered(bank):
    """The bank with its integer/bool metadata filtered out (as eqx.filter does)."""
    return dataclasses.replace(
        bank, **{n: None for n in cb.STATE_NAMES if n not in cb.PARAMETER_NAMES}
    )


PARAMS = {
    "parameters_dict": lambda bank: bank.parameters,
    "dict": lambda bank: {"bank": bank.parameters, "w": jnp.ones(3)},
    "tuple": lambda bank: (jnp.ones(3), (bank.parameters,)),
    "module_with_filtered_bank": lambda bank: Model(_filtered(bank), jnp.ones(3)),
    "full_bank_with_metadata": lambda bank: bank,
}


def _ones_state(optimizer, params):
    """optimizer.init(params) with every moment set to ones (non-zero rows to reset)."""
    state = optimizer.init(params)

    def fill(path, leaf):
        return jnp.ones_like(leaf) if _parity(path) else leaf

    return jax.tree_util.tree_map_with_path(fill, state)


@pytest.mark.parametrize("where", sorted(PARAMS))
def test_the_bank_is_found_wherever_it_sits_in_the_params(pb, where):
    params = PARAMS[where](pb)
    state = _ones_state(optax.adam(1e-2), params)
    _, next_state, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter(transport=False))
    reset = 0
    for path, old, new in _pairs(state, next_state):
        if _parity(path) is None or np.ndim(old) == 0:
            assert new is old
        elif np.shape(old)[0] == 3:  # the model's other parameter
            assert new is old
        else:
            reset += 1
            np.testing.assert_array_equal(np.asarray(new)[:2], 0)
            np.testing.assert_array_equal(np.asarray(new)[2:], 1)
    expected_blocks = 13 if where == "full_bank_with_metadata" else 8
    assert reset == 2 * expected_blocks  # mu and nu


def test_several_bank_shaped_nodes_need_a_path(pb):
    params = {"a": pb.parameters, "b": pb.parameters}
    state = _ones_state(optax.adam(1e-2), params)
    with pytest.raises(ValueError, match="path"):
        commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    adapter = cbo.commit_adapter(path="['b']", transport=False)
    _, next_state, _ = commit_pair(pb, state, state_adapter=adapter)
    mu = next_state[0].mu
    assert mu["a"]["weights"].tolist() == [1, 1, 1, 1]
    assert mu["b"]["weights"].tolist() == [0, 0, 1, 1]


def test_a_state_without_the_bank_is_an_error(pb):
    other = cb.init_confluent_bank([], max_packs=6, max_order=3)
    state = _ones_state(optax.adam(1e-2), {"other": other.parameters})
    with pytest.raises(ValueError, match="no node shaped like the bank"):
        commit_pair(pb, state, state_adapter=cbo.commit_adapter())


def test_a_state_without_moments_passes_through(pb):
    state = optax.sgd(1e-2).init(pb.parameters)
    _, next_state, accepted = commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    assert accepted and next_state == state


def test_multi_transform_adapts_only_the_partition_holding_the_bank(pb):
    params = {"bank": pb.parameters, "w": jnp.ones(3)}
    optimizer = optax.multi_transform(
        {"a": optax.adam(1e-2), "b": optax.sgd(1e-2, momentum=0.9)}, {"bank": "a", "w": "b"}
    )
    state = _ones_state(optimizer, params)
    _, next_state, _ = commit_pair(pb, state, state_adapter=cbo.commit_adapter(transport=False))
    inner = next_state.inner_states
    assert inner["a"].inner_state[0].mu["bank"]["rho"].tolist() == [0, 0, 1, 1]
    assert inner["b"].inner_state[0].trace["w"].tolist() == [1, 1, 1]


# --- unknown states and extensions -----------------------------------------------------------


class VelocityState(NamedTuple):
    count: jax.Array
    velocity: dict


def test_an_unknown_state_type_is_a_type_error_naming_it(pb):
    state = optax.adafactor(1e-2).init(pb.parameters)
    with pytest.raises(TypeError, match="FactoredState"):
        commit_pair(pb, state, state_adapter=cbo.commit_adapter())
    custom = VelocityState(jnp.asarray(1), pb.parameters)
    with pytest.raises(TypeError, match="VelocityState"):
        cb.permute_bank(
            pb, (1, 0, 2, 3), custom, between_steps=True, state_adapter=cbo.transport_adapter()
        )


def test_parities_teach_the_adapters_a_new_state_type(tanh_bank):
    state = VelocityState(jnp.asarray(4), jax.tree.map(jnp.ones_like, tanh_bank.parameters))
    adapter = cbo.transport_adapter(parities={VelocityState: {"count": "keep", "velocity": "odd"}})
    _, moved = cb.relabel_tanh_sign(
        tanh_bank, (1,), state, between_steps=True, state_adapter=adapter
    )
    assert moved.count is state.count
    assert moved.velocity["scales"].tolist() == [1, -1, 1, 1]
    assert moved.velocity["centers"].tolist() == [1, 1, 1, 1]


def test_invalid_adapter_options_are_rejected():
    with pytest.raises(ValueError, match="roles"):
        cbo.commit_adapter(parities={VelocityState: {"velocity": "linear"}})
    with pytest.raises(TypeError, match="state types"):
        cbo.commit_adapter(parities={"VelocityState": {"velocity": "odd"}})
    with pytest.raises(TypeError, match="path"):
        cbo.transport_adapter(path=("bank",))


def test_known_states_cover_every_field():
    for kind, roles in cbo.KNOWN_STATE_PARITIES.items():
        assert set(kind._fields) == set(roles), kind


def test_importing_the_package_does_not_import_optax():
    code = "import sys, confluent_bank; sys.exit(int('optax' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- L-BFGS: its memory restarts -------------------------------------------------------


@jax.jit
def _lbfgs_step(bank, parameters, state):
    """One `optax.lbfgs` step on `sum(bank(X)²)`, reading the line search's stored value."""

    def value(p):
        return jnp.sum(bank.with_parameters(p).forward(X) ** 2)

    loss, grad = optax.value_and_grad_from_state(value)(parameters, state=state)
    return optax.lbfgs().update(grad, state, parameters, value=loss, grad=grad, value_fn=value)


@pytest.fixture(scope="module")
def lbfgs_state(pb):
    """An `optax.lbfgs` state after 3 line-searched steps (memory and line search full)."""
    parameters = pb.parameters
    state = optax.lbfgs().init(parameters)
    for _ in range(3):
        updates, state = _lbfgs_step(pb, parameters, state)
        parameters = optax.apply_updates(parameters, updates)
    return state


def _zeros(tree):
    return all(not np.any(np.asarray(leaf)) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("transport", [True, False])
def test_a_commit_restarts_the_lbfgs_memory_and_marks_the_line_search_value_stale(
    pb, lbfgs_state, transport
):
    state = lbfgs_state
    assert int(state[0].count) == 3 and not _zeros(state[0].diff_params_memory)
    _, moved, accepted = commit_pair(
        pb, state, state_adapter=cbo.commit_adapter(transport=transport)
    )
    assert accepted
    memory, search = moved[0], moved[2]
    assert int(memory.count) == 0
    assert _zeros((memory.params, memory.updates, memory.diff_params_memory))
    assert _zeros((memory.diff_updates_memory, memory.weights_memory))
    assert np.isinf(np.asarray(search.value)) and _zeros(search.grad)
    assert float(search.learning_rate) == float(state[2].learning_rate)  # kept


def test_the_first_lbfgs_step_after_a_commit_is_a_fresh_lbfgs_first_step(pb, lbfgs_state):
    bank, moved, _ = commit_pair(pb, lbfgs_state, state_adapter=cbo.commit_adapter())
    fresh = optax.lbfgs().init(bank.parameters)
    after = _lbfgs_step(bank, bank.parameters, moved)[0]
    first = _lbfgs_step(bank, bank.parameters, fresh)[0]
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(first), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_permutation_restarts_the_lbfgs_memory(pb, lbfgs_state):
    state = lbfgs_state
    _, moved = cb.permute_bank(
        pb, (1, 0, 2, 3), state, between_steps=True, state_adapter=cbo.transport_adapter()
    )
    assert int(moved[0].count) == 0 and _zeros(moved[0].diff_updates_memory)
    assert np.isinf(np.asarray(moved[2].value))


def test_the_restart_and_stale_roles_teach_a_new_memory_state(pb):
    class Memory(NamedTuple):
        count: jax.Array
        last_value: jax.Array
        history: dict

    state = Memory(jnp.asarray(5), jnp.asarray(2.0), jax.tree.map(jnp.ones_like, pb.parameters))
    adapter = cbo.commit_adapter(
        parities={Memory: {"count": "restart", "last_value": "stale", "history": "restart"}}
    )
    _, moved, _ = commit_pair(pb, state, state_adapter=adapter)
    assert int(moved.count) == 0 and np.isinf(float(moved.last_value)) and _zeros(moved.history)
