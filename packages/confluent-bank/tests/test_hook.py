"""TransitionHook: commits between steps on every bank of a predictors pytree, with events."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import always, moments

import confluent_bank as cb
from confluent_bank import _host

optax = pytest.importorskip("optax")
import confluent_bank.optax as cbo  # noqa: E402

DOMAIN = (-1.0, 1.0)


def _model(bank):
    """A bank beside an 'MLP' and a rate, as a plain pytree."""
    mlp = [jnp.linspace(0.1, 0.6, 6).reshape(2, 3), jnp.asarray([0.2, -0.1])]
    return {"bank": bank, "mlp": mlp, "rate": jnp.asarray(0.3)}


def _float_only(tree):
    """The params an optimiser sees: float leaves, `None` elsewhere (like `eqx.filter`)."""
    keep = lambda x: x if jnp.issubdtype(x.dtype, jnp.floating) else None  # noqa: E731
    return jax.tree.map(keep, tree)


def _trained_state(predictors, steps=2):
    """An Adam state after a few steps of unit gradients: every moment row is non-zero."""
    opt = optax.adam(1e-2)
    params = _float_only(predictors)
    state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(steps):
        _, state = opt.update(grads, state, params)
    return state


def _pair_at(step):
    def propose(at, path, bank):
        return bank.propose_pair(0, 1) if at == step else None

    return propose


def _equal_trees(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


@pytest.fixture(scope="module")
def committed(pair_bank):
    """A pair merge at step 3 on a bank beside other parameters, with an Adam state."""
    predictors = _model(pair_bank)
    state = _trained_state(predictors)
    hook = cb.TransitionHook(_pair_at(3), DOMAIN)
    new_predictors, new_state = hook.between_steps(3, predictors, state)
    return predictors, state, hook, new_predictors, new_state


def test_hook_commits_a_bank_that_sits_beside_other_parameters(committed):
    predictors, state, _, new_predictors, _ = committed
    reference, _, ok = cb.commit_transition(
        predictors["bank"],
        predictors["bank"].propose_pair(0, 1),
        state,
        between_steps=True,
        acceptance=always,
        state_adapter=cbo.commit_adapter(),
    )
    assert ok
    assert _equal_trees(new_predictors["bank"], reference.retract())
    for name in ("mlp", "rate"):  # the very same arrays
        old, new = jax.tree.leaves(predictors[name]), jax.tree.leaves(new_predictors[name])
        assert all(a is b for a, b in zip(old, new, strict=True))


def test_hook_carries_the_whole_optax_state_through_the_commit_adapter(committed):
    predictors, state, _, _, new_state = committed
    _, reference, _ = cb.commit_transition(
        predictors["bank"],
        predictors["bank"].propose_pair(0, 1),
        state,
        between_steps=True,
        acceptance=always,
        state_adapter=cbo.commit_adapter(path="['bank']"),
    )
    assert _equal_trees(new_state, reference)


def test_hook_leaves_the_moments_beside_the_bank_alone(committed):
    _, state, _, _, new_state = committed
    for field in ("mu", "nu"):
        old, new = getattr(state[0], field), getattr(new_state[0], field)
        assert _equal_trees(new["mlp"], old["mlp"]) and _equal_trees(new["rate"], old["rate"])


def test_hook_records_each_event(committed):
    predictors, _, hook, _, _ = committed
    (event,) = hook.events
    ids = tuple(int(i) for i in np.asarray(predictors["bank"].slot_ids)[:2])
    assert (event.step, event.path, event.kind, event.slots, event.accepted) == (
        3,
        "['bank']",
        "centered_pair",
        ids,
        True,
    )
    assert event.max_change <= 1e-13  # a pair merge is exact


def test_events_are_json_serialisable(committed):
    event = committed[2].events[0]
    assert json.loads(json.dumps(dataclasses.asdict(event)))["kind"] == "centered_pair"


def test_max_change_is_measured_over_the_domain(cluster_bank):
    def propose(step, path, bank):
        return bank.propose_cluster((0, 1, 2), order=2, error_budget=1.0)

    hook = cb.TransitionHook(propose, DOMAIN, n_points=11)
    (new_bank,), _ = hook.between_steps(0, (cluster_bank,), moments(cluster_bank))
    grid = jnp.linspace(*DOMAIN, 11)
    expected = float(jnp.max(jnp.abs(new_bank.forward(grid) - cluster_bank.forward(grid))))
    assert hook.events[0].max_change == pytest.approx(expected, rel=1e-12)
    assert hook.events[0].max_change > 0  # a truncated cluster is not exact


def test_hook_commits_every_bank_in_the_predictors(pair_bank):
    predictors = (pair_bank, {"inner": pair_bank})
    state = _trained_state(predictors)
    hook = cb.TransitionHook(_pair_at(5), DOMAIN)
    (first, nested), new_state = hook.between_steps(5, predictors, state)
    assert [e.path for e in hook.events] == ["[0]", "[1]['inner']"]
    assert all(e.accepted for e in hook.events)
    for bank in (first, nested["inner"]):
        assert int(bank.transition_version) == int(pair_bank.transition_version) + 1
    # The hook must do exactly what committing each bank with `commit_adapter` does.
    carry = cb.transition_carry(pair_bank, _pair_at(5)(5, "", pair_bank))
    reference = state
    for path in ("[0]", "[1]['inner']"):
        candidate = first if path == "[0]" else nested["inner"]
        reference = cbo.commit_adapter(path=path).carry_transition(reference, candidate, carry)
    assert _equal_trees(new_state, reference)


def test_a_bank_without_a_proposal_is_only_retracted(pair_committed_bank):
    negative = dataclasses.replace(pair_committed_bank, rho=pair_committed_bank.rho.at[0].set(-0.5))
    hook = cb.TransitionHook(lambda step, path, bank: None, DOMAIN)
    state = moments(negative)
    (bank,), new_state = hook.between_steps(1, (negative,), state)
    assert float(bank.rho[0]) == 0.0
    assert new_state is state and hook.events == []


def test_retract_false_keeps_the_spreads(pair_committed_bank):
    negative = dataclasses.replace(pair_committed_bank, rho=pair_committed_bank.rho.at[0].set(-0.5))
    hook = cb.TransitionHook(lambda step, path, bank: None, DOMAIN, retract=False)
    (bank,), _ = hook.between_steps(1, (negative,), moments(negative))
    assert float(bank.rho[0]) == -0.5


def test_rejected_proposal_is_recorded_and_changes_nothing(pair_bank):
    predictors = _model(pair_bank)
    state = _trained_state(predictors)
    hook = cb.TransitionHook(_pair_at(2), DOMAIN, acceptance=lambda bank, proposal: False)
    new_predictors, new_state = hook.between_steps(2, predictors, state)
    (event,) = hook.events
    assert not event.accepted and event.max_change == 0.0
    assert new_state is state
    assert _equal_trees(new_predictors["bank"], pair_bank.retract())


def test_objective_is_evaluated_just_before_and_after_a_commit(pair_bank):
    seen = []

    def objective(predictors):
        seen.append(int(predictors["bank"].transition_version))
        return float(jnp.sum(predictors["bank"].forward(jnp.asarray([0.1, 0.4]))))

    predictors = _model(pair_bank)
    hook = cb.TransitionHook(_pair_at(1), DOMAIN, objective=objective)
    hook.between_steps(1, predictors, _trained_state(predictors))
    (event,) = hook.events
    version = int(pair_bank.transition_version)
    assert seen == [version, version + 1]
    assert event.loss_after == pytest.approx(event.loss_before, abs=1e-13)


def test_named_moment_state_is_reset_without_an_adapter(pair_bank):
    state = moments(pair_bank)
    hook = cb.TransitionHook(_pair_at(0), DOMAIN)
    (bank,), new_state = hook.between_steps(0, (pair_bank,), state)
    assert _equal_trees(new_state, cb.reset_slot_state(state, bank, (0, 1)))


def test_a_hook_step_reads_and_digests_the_bank_once(pair_bank, monkeypatch):
    # The policy's proposal, the commit and its within_error_budget bounds share one view.
    reads, digests = [], []
    real_read, real_digest = _host.read_host_state, _host.snapshot_digest
    monkeypatch.setattr(_host, "read_host_state", lambda b: reads.append(1) or real_read(b))
    monkeypatch.setattr(_host, "snapshot_digest", lambda s: digests.append(1) or real_digest(s))
    hook = cb.TransitionHook(_pair_at(0), DOMAIN, retract=False)
    hook.between_steps(0, (pair_bank,), moments(pair_bank))
    assert hook.events[0].accepted
    assert (len(reads), len(digests)) == (1, 1)


def test_a_hook_step_without_a_proposal_does_not_read_the_bank(pair_bank, monkeypatch):
    # Most steps propose nothing; reading every block then would synchronise with the device
    # after every training step for nothing.
    reads = []
    real_read = _host.read_host_state
    monkeypatch.setattr(_host, "read_host_state", lambda b: reads.append(1) or real_read(b))
    hook = cb.TransitionHook(_pair_at(5), DOMAIN)
    hook.between_steps(0, (pair_bank,), moments(pair_bank))
    assert reads == [] and hook.events == []


def test_custom_adapter_is_built_for_the_bank_path(pair_bank):
    paths = []

    def adapter(path):
        paths.append(path)
        return lambda state, bank, slots: state

    predictors = _model(pair_bank)
    state = _trained_state(predictors)
    hook = cb.TransitionHook(_pair_at(4), DOMAIN, adapter=adapter)
    _, new_state = hook.between_steps(4, predictors, state)
    assert paths == ["['bank']"] and new_state is state


def test_propose_returning_something_else_is_a_type_error(pair_bank):
    hook = cb.TransitionHook(lambda step, path, bank: "pair", DOMAIN)
    with pytest.raises(TypeError, match=r"propose returned str for the bank at \[0\]"):
        hook.between_steps(1, (pair_bank,), moments(pair_bank))


def test_propose_must_be_callable():
    with pytest.raises(TypeError, match="propose must be callable"):
        cb.TransitionHook("pair", DOMAIN)


def test_domain_must_be_an_interval():
    with pytest.raises(ValueError, match="domain"):
        cb.TransitionHook(lambda step, path, bank: None, (1.0, -1.0))


def test_n_points_must_be_at_least_two():
    with pytest.raises(ValueError, match="n_points"):
        cb.TransitionHook(lambda step, path, bank: None, DOMAIN, n_points=1)
