"""`ConfluentPackBank`: construction, pytree, parameters, forward values (spec 1.1, 2.4, 6)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    PB_DIGEST,
    PB_FORWARD,
    PB_PAIR_DIGEST,
    make_pair_bank,
    set_rows,
)

import confluent_bank as cb

X9 = jnp.linspace(-0.5, 0.5, 9)


def test_names_are_the_spec_block_order():
    assert cb.PARAMETER_NAMES == (
        "centers",
        "weights",
        "scales",
        "rho",
        "odd_moments",
        "directions",
        "direction_bias",
        "moment_coefficients",
    )
    assert cb.STATE_NAMES == (
        *cb.PARAMETER_NAMES,
        "orders",
        "ages",
        "active",
        "modes",
        "slot_ids",
        "transition_version",
    )


def test_init_fills_slots_in_order_and_leaves_empty_slot_values(pair_bank):
    assert pair_bank.max_packs == 4 and pair_bank.max_order == 3 and pair_bank.base == "sigmoid"
    np.testing.assert_array_equal(pair_bank.centers, [-0.125, 0.125, 0.2, 0.0])
    np.testing.assert_array_equal(pair_bank.weights, [2.0, -1.0, 0.3, 0.0])
    np.testing.assert_array_equal(pair_bank.scales, [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(pair_bank.orders, [0, 0, 1, 0])
    np.testing.assert_array_equal(pair_bank.active, [True, True, True, False])
    np.testing.assert_array_equal(pair_bank.direction_bias, np.ones(4))
    np.testing.assert_array_equal(pair_bank.slot_ids, np.arange(4))
    for name in ("rho", "odd_moments", "directions", "modes", "ages"):
        np.testing.assert_array_equal(getattr(pair_bank, name), np.zeros(4))
    assert pair_bank.moment_coefficients.shape == (4, 4)
    assert pair_bank.transition_version.shape == ()


def test_init_uses_float64_trainables_and_int64_metadata_under_x64(pair_bank):
    for name in cb.PARAMETER_NAMES:
        assert getattr(pair_bank, name).dtype == jnp.float64
    for name in ("orders", "ages", "modes", "slot_ids", "transition_version"):
        assert getattr(pair_bank, name).dtype == jnp.int64
    assert pair_bank.active.dtype == jnp.bool_


def test_init_honours_an_explicit_float32_dtype():
    bank = make_pair_bank(dtype=jnp.float32)
    assert all(bank.parameters[name].dtype == jnp.float32 for name in cb.PARAMETER_NAMES)


def test_create_is_init_confluent_bank(pair_bank):
    packs = [cb.RefinedPack(0, -0.125, 2.0), cb.RefinedPack(0, 0.125, -1.0)]
    packs.append(cb.RefinedPack(1, 0.2, 0.3))
    created = cb.ConfluentPackBank.create(packs, max_packs=4, max_order=3)
    assert created.portable_snapshot() == pair_bank.portable_snapshot()


@pytest.mark.parametrize(
    "kwargs",
    [{"base": "relu"}, {"base": "logistic"}, {"max_packs": 0}, {"max_order": -1}],
)
def test_init_rejects_bad_configuration(kwargs):
    with pytest.raises(ValueError, match="positive capacity, nonnegative order"):
        cb.init_confluent_bank([], **kwargs)


def test_init_rejects_too_many_packs_or_too_high_orders():
    with pytest.raises(ValueError, match="exceed capacity or supported order"):
        cb.init_confluent_bank([cb.RefinedPack(0, 0.0)] * 3, max_packs=2)
    with pytest.raises(ValueError, match="exceed capacity or supported order"):
        cb.init_confluent_bank([cb.RefinedPack(4, 0.0)], max_order=3)


def test_init_rejects_non_pack_inputs_and_non_float_dtypes():
    with pytest.raises(TypeError, match="RefinedPack"):
        cb.init_confluent_bank([(0, 0.0, 1.0)])
    with pytest.raises(ValueError, match="floating"):
        cb.init_confluent_bank([], dtype=jnp.int32)
    with pytest.raises(TypeError, match="max_packs"):
        cb.init_confluent_bank([], max_packs=2.5)


def test_pytree_children_follow_state_names_and_aux_is_static(pair_bank):
    children, treedef = jax.tree_util.tree_flatten(pair_bank)
    assert len(children) == len(cb.STATE_NAMES)
    for child, name in zip(children, cb.STATE_NAMES, strict=True):
        assert child is getattr(pair_bank, name)
    rebuilt = jax.tree_util.tree_unflatten(treedef, children)
    assert rebuilt.max_order == 3 and rebuilt.base == "sigmoid"
    assert rebuilt.portable_snapshot() == pair_bank.portable_snapshot()


def test_structural_metadata_changes_do_not_retrace(pair_bank):
    traces = []

    @jax.jit
    def forward(bank, z):
        traces.append(1)
        return bank.forward(z)

    forward(pair_bank, X9)
    changed = set_rows(pair_bank, [("modes", 0, 2), ("active", 3, True), ("orders", 2, 3)])
    forward(changed, X9)
    forward(dataclasses.replace(changed, transition_version=changed.transition_version + 5), X9)
    assert len(traces) == 1


def test_parameters_are_the_eight_trainable_blocks(pair_bank):
    parameters = pair_bank.parameters
    assert tuple(parameters) == cb.PARAMETER_NAMES
    assert all(parameters[name] is getattr(pair_bank, name) for name in cb.PARAMETER_NAMES)


def test_with_parameters_replaces_only_trainable_blocks(pair_bank):
    parameters = {name: value + 1 for name, value in pair_bank.parameters.items()}
    updated = pair_bank.with_parameters(parameters)
    np.testing.assert_array_equal(updated.weights, pair_bank.weights + 1)
    assert updated.orders is pair_bank.orders and updated.max_order == pair_bank.max_order
    np.testing.assert_array_equal(pair_bank.weights, [2.0, -1.0, 0.3, 0.0])


def test_with_parameters_rejects_wrong_keys(pair_bank):
    parameters = dict(pair_bank.parameters)
    del parameters["rho"]
    with pytest.raises(ValueError, match="exactly the trainable bank blocks"):
        pair_bank.with_parameters(parameters)
    with pytest.raises(ValueError, match="exactly the trainable bank blocks"):
        pair_bank.with_parameters({**pair_bank.parameters, "orders": pair_bank.orders})


def test_with_parameters_rejects_a_shape_change_naming_the_block(pair_bank):
    parameters = {**pair_bank.parameters, "rho": jnp.zeros(5)}
    with pytest.raises(ValueError, match="parameter shape changed for rho"):
        pair_bank.with_parameters(parameters)


def test_with_parameters_rejects_a_dtype_change_naming_the_block(pair_bank):
    parameters = {**pair_bank.parameters, "scales": pair_bank.scales.astype(jnp.float32)}
    with pytest.raises(ValueError, match="dtype changed for scales"):
        pair_bank.with_parameters(parameters)


def test_pair_bank_forward_reproduces_the_spec_values_exactly(pair_bank, jit_forward):
    assert np.asarray(pair_bank.forward(X9)).tolist() == PB_FORWARD
    assert np.asarray(jit_forward(pair_bank, X9)).tolist() == PB_FORWARD


def test_pair_bank_forward_is_the_written_formula(pair_bank):
    s = jax.nn.sigmoid
    expected = 2 * s(X9 + 0.125) - s(X9 - 0.125) + 0.3 * s(X9 - 0.2) * (1 - s(X9 - 0.2))
    np.testing.assert_allclose(pair_bank.forward(X9), expected, rtol=0, atol=3e-16)


def test_pair_bank_digest_is_the_spec_digest(pair_bank):
    assert cb.snapshot_digest(pair_bank.portable_snapshot()) == PB_DIGEST


def test_pair_commit_keeps_forward_and_gives_the_spec_digest(pair_bank, pair_committed_bank):
    assert cb.snapshot_digest(pair_committed_bank.portable_snapshot()) == PB_PAIR_DIGEST
    np.testing.assert_allclose(
        pair_committed_bank.forward(X9), pair_bank.forward(X9), rtol=0, atol=3e-16
    )


def test_jit_forward_equals_eager_forward_bitwise(pair_committed_bank, jit_forward):
    x = jnp.asarray([-0.3, 0.2])
    np.testing.assert_array_equal(
        jit_forward(pair_committed_bank, x), pair_committed_bank.forward(x)
    )


def test_parameter_gradient_is_finite_and_reaches_the_odd_moment(pair_committed_bank):
    x = jnp.asarray([-0.3, 0.2])

    def objective(parameters):
        return jnp.sum(pair_committed_bank.with_parameters(parameters).forward(x) ** 2)

    gradients = jax.jit(jax.grad(objective))(pair_committed_bank.parameters)
    assert all(bool(jnp.all(jnp.isfinite(value))) for value in gradients.values())
    assert float(jnp.abs(gradients["odd_moments"][0])) > 0


def test_retract_projects_negative_spreads_to_exactly_zero(pair_committed_bank):
    boundary = dataclasses.replace(
        pair_committed_bank, rho=pair_committed_bank.rho.at[0].set(-0.5)
    ).retract()
    assert float(boundary.rho[0]) == 0.0
    np.testing.assert_array_equal(boundary.rho[1:], pair_committed_bank.rho[1:])


def test_moment_mode_slot_gives_a_finite_jitted_forward(pair_committed_bank, jit_forward):
    bank = set_rows(pair_committed_bank, [("modes", 0, 2), ("rho", 0, 0.0)])
    bank = dataclasses.replace(
        bank, moment_coefficients=bank.moment_coefficients.at[0, :2].set(jnp.array([0.7, 0.2]))
    )
    value = jit_forward(bank, jnp.asarray([-0.3, 0.2]))
    assert bool(jnp.all(jnp.isfinite(value)))


def test_slot_terms_have_one_row_per_slot_and_inactive_rows_are_zero(pair_bank):
    z = jnp.zeros((2, 3))
    terms = pair_bank.slot_terms(z)
    assert terms.shape == (4, 2, 3)
    np.testing.assert_array_equal(terms[3], 0.0)
    np.testing.assert_array_equal(cb.bank_slot_terms(pair_bank, z), terms)


def test_forward_accepts_any_input_shape(pair_bank):
    z = X9.reshape(3, 3)
    np.testing.assert_array_equal(
        cb.bank_forward(pair_bank, z), pair_bank.forward(X9).reshape(3, 3)
    )
    assert pair_bank.forward(jnp.asarray(0.1)).shape == ()


def test_an_ordinary_order_outside_the_budget_gives_zero(pair_bank):
    bank = set_rows(pair_bank, [("orders", 2, 7)])
    np.testing.assert_array_equal(bank.slot_terms(X9)[2], 0.0)


def test_pack_term_norms_are_the_active_slots_l2_norms(pair_bank):
    terms = np.asarray(pair_bank.slot_terms(X9))
    norms = pair_bank.pack_term_norms(X9)
    assert isinstance(norms, list) and all(isinstance(n, float) for n in norms)
    np.testing.assert_allclose(norms, np.sqrt(np.sum(terms[:3] ** 2, axis=1)), rtol=1e-15)


def test_host_reads_use_one_device_transfer(pair_bank, monkeypatch):
    calls = []
    real = jax.device_get

    def counting(value):
        calls.append(1)
        return real(value)

    monkeypatch.setattr(jax, "device_get", counting)
    pair_bank.portable_snapshot()
    assert len(calls) == 1
    pair_bank.pack_term_norms(X9)
    assert len(calls) == 2


def test_portable_snapshot_has_the_spec_layout(pair_bank):
    snapshot = pair_bank.portable_snapshot()
    assert set(snapshot) == {*cb.STATE_NAMES, "__configuration__"}
    assert snapshot["centers"] == {
        "shape": [4],
        "dtype": "float64",
        "values": [-0.125, 0.125, 0.2, 0.0],
    }
    assert snapshot["moment_coefficients"]["shape"] == [4, 4]
    assert snapshot["transition_version"] == {"shape": [], "dtype": "int64", "values": [0]}
    assert snapshot["active"]["values"] == [True, True, True, False]
    assert snapshot["__configuration__"] == {
        "activation": "sigmoid",
        "max_order": 3,
        "max_packs": 4,
        "schema_version": 1,
        "series_terms": 6,
        "series_radius": 0.01,
    }


def test_checkpoint_wraps_the_snapshot(pair_bank):
    assert pair_bank.checkpoint() == {
        "schema_version": 1,
        "base": "sigmoid",
        "max_order": 3,
        "state": pair_bank.portable_snapshot(),
    }


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("propose_pair", (0, 1), {"error_budget": 0.5}),
        ("propose_cluster", ((0, 1),), {"order": 2, "error_budget": 0.1}),
        ("propose_derivative", (0,), {"error_budget": 0.2}),
        ("propose_remove_zero", (3,), {}),
        ("propose_birth", (3, cb.RefinedPack(0, 0.0)), {}),
    ],
)
def test_propose_methods_delegate_to_the_proposal_rules(
    pair_bank, monkeypatch, method, args, kwargs
):
    from confluent_bank import _proposals as proposals

    seen = []
    monkeypatch.setattr(proposals, method, lambda *a, **k: seen.append((a, k)) or "proposal")
    assert getattr(pair_bank, method)(*args, **kwargs) == "proposal"
    assert seen == [((pair_bank, *args), kwargs)]


def test_banks_are_immutable(pair_bank):
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair_bank.weights = pair_bank.weights  # type: ignore[misc]


def test_key_paths_name_the_state_blocks():
    bank = cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 1.0)], max_packs=2, max_order=1)
    paths = [
        jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(bank)[0]
    ]
    assert paths == [f".{name}" for name in cb.STATE_NAMES]
