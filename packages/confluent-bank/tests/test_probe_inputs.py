"""The probe's bank-input scenarios (issue 22, item 6): nothing that cannot be a bank gets in.

`with_parameters` refuses NaN and infinities (naming the block and the slots) while staying
usable under `jit`/`grad`; a capacity that cannot be allocated is refused before allocating,
stating the bytes; a proposal's JSON is refused when a value fits no bank's dtype, naming the
field.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb
import confluent_bank._sizes as sizes

# --- with_parameters ----------------------------------------------------------------------

NON_FINITE = {"nan": jnp.nan, "inf": jnp.inf, "-inf": -jnp.inf}


@pytest.mark.parametrize("value", NON_FINITE, ids=list(NON_FINITE))
@pytest.mark.parametrize("name", cb.PARAMETER_NAMES)
def test_with_parameters_refuses_a_non_finite_value_naming_the_block_and_slot(
    pair_committed_bank, name, value
):
    block = getattr(pair_committed_bank, name)
    index = (2, 1) if block.ndim == 2 else (2,)
    parameters = {**pair_committed_bank.parameters, name: block.at[index].set(NON_FINITE[value])}
    with pytest.raises(ValueError, match=rf"parameter {name} is not finite at slots \[2\]"):
        pair_committed_bank.with_parameters(parameters)


def test_with_parameters_lists_every_bad_slot(pair_bank):
    weights = pair_bank.weights.at[1].set(jnp.nan).at[3].set(jnp.inf)
    with pytest.raises(ValueError, match=r"weights is not finite at slots \[1, 3\]"):
        pair_bank.with_parameters({**pair_bank.parameters, "weights": weights})


def test_with_parameters_refuses_non_finite_numpy_arrays_too(pair_bank):
    rho = np.asarray(pair_bank.rho).copy()
    rho[0] = np.nan
    with pytest.raises(ValueError, match=r"rho is not finite at slots \[0\]"):
        pair_bank.with_parameters({**pair_bank.parameters, "rho": rho})


def test_with_parameters_still_traces_under_jit_and_grad(pair_committed_bank):
    z = jnp.linspace(-1.0, 1.0, 5)

    def loss(parameters):
        return jnp.sum(pair_committed_bank.with_parameters(parameters).forward(z) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(pair_committed_bank.parameters)
    assert np.isfinite(value) and set(grads) == set(cb.PARAMETER_NAMES)
    assert np.asarray(
        jax.vmap(lambda w: loss({**pair_committed_bank.parameters, "weights": w}))(
            jnp.stack([pair_committed_bank.weights] * 2)
        )
    ).shape == (2,)


def test_with_parameters_does_not_read_arrays_spread_over_other_processes(pair_bank, monkeypatch):
    # Simulated: in a multi-process run one process cannot read a global array.
    weights = pair_bank.weights.at[0].set(jnp.nan)
    read = []
    monkeypatch.setattr(type(weights), "is_fully_addressable", property(lambda _: False))
    monkeypatch.setattr(jax, "device_get", lambda tree: read.append(tree) or tree)
    updated = pair_bank.with_parameters({**pair_bank.parameters, "weights": weights})
    assert updated.weights is weights and read == [{}]


def test_with_parameters_accepts_finite_values_unchanged(pair_bank):
    parameters = {name: value * 0.5 for name, value in pair_bank.parameters.items()}
    updated = pair_bank.with_parameters(parameters)
    assert all(updated.parameters[name] is parameters[name] for name in cb.PARAMETER_NAMES)


# --- sizes are checked before allocating ------------------------------------------------------

HUGE = {
    "init_confluent_bank": lambda: cb.init_confluent_bank([], max_packs=10**12),
    "ConfluentPackBank.create": lambda: cb.ConfluentPackBank.create([], max_packs=10**12),
    "init_pack_bank": lambda: cb.init_pack_bank([], max_packs=10**12),
}


@pytest.mark.parametrize("build", HUGE)
def test_a_capacity_beyond_memory_is_refused_stating_the_bytes(build, monkeypatch):
    allocated = []
    real = np.zeros
    monkeypatch.setattr(np, "zeros", lambda *a, **k: allocated.append(a) or real(*a, **k))
    with pytest.raises(ValueError) as caught:
        HUGE[build]()
    message = str(caught.value)
    assert "max_packs=1000000000000" in message and "max_order=8" in message
    assert re.search(r"\d+ bytes \([\d.]+ TiB\)", message) and "physical memory" in message
    assert allocated == []  # refused before anything was allocated


def test_the_stated_size_is_the_size_of_the_bank(monkeypatch):
    # A bank of 3 slots and order 2 is 3 x (7 + 3) float64, 3 x 4 + 1 int64 and 3 bools.
    monkeypatch.setattr(sizes, "physical_memory", lambda: 100)
    with pytest.raises(ValueError, match=r"would need 46 values, 347 bytes \(347 B\), more than"):
        cb.init_confluent_bank([], max_packs=3, max_order=2)


def test_a_bank_that_fits_is_built_whatever_the_reported_memory(monkeypatch):
    monkeypatch.setattr(sizes, "physical_memory", lambda: 347)
    assert cb.init_confluent_bank([], max_packs=3, max_order=2).max_packs == 3
    monkeypatch.setattr(sizes, "physical_memory", lambda: None)  # unknown: no limit
    assert cb.init_confluent_bank([], max_packs=3, max_order=2).max_packs == 3


def test_slot_ids_that_do_not_fit_the_metadata_integer_are_refused():
    with pytest.raises(ValueError, match=r"slot ids 0\.\.9223372036854775808 do not fit"):
        cb.init_confluent_bank([], max_packs=2**63 + 1)


# --- TransitionProposal.from_json -------------------------------------------------------------


@pytest.fixture(scope="module")
def pair_json(pair_bank):
    return json.loads(pair_bank.propose_pair(0, 1).to_json())


def _with_value(data, name, index, literal):
    """The proposal's JSON text with the value of update `name[index]` replaced by the raw
    JSON `literal` (so `1e400` reaches the parser as written)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    for update in data["updates"]:
        if update["name"] == name and update["index"] == index:
            old = json.dumps(update, sort_keys=True, separators=(",", ":"))
            new = old.replace(f'"value":{json.dumps(update["value"])}', f'"value":{literal}')
            return text.replace(old, new)
    raise AssertionError(f"no update {name}[{index}]")


BIG = "1" + "0" * 400
OVERFLOWING_UPDATES = {
    "weight 1e400": ("weights", 0, "1e400", r"weights\[0\]: value must be finite, got inf"),
    "weight -1e400": ("weights", 0, "-1e400", r"weights\[0\]: value must be finite, got -inf"),
    "weight of 400 digits": ("weights", 0, BIG, r"weights\[0\]: value 100000000000.*float64"),
    "rho of 400 digits": ("rho", 0, BIG, r"rho\[0\]: value .*\(401 digits\) does not fit"),
    "mode beyond int64": ("modes", 0, str(2**63), r"modes\[0\]: value .* does not fit int64"),
    "flag beyond int64": ("active", 1, str(-(2**63) - 1), r"active\[1\]: .* does not fit int64"),
}


@pytest.mark.parametrize("case", OVERFLOWING_UPDATES)
def test_from_json_refuses_an_update_value_no_bank_can_store_naming_it(pair_json, case):
    name, index, literal, match = OVERFLOWING_UPDATES[case]
    with pytest.raises(ValueError, match=match):
        cb.TransitionProposal.from_json(_with_value(pair_json, name, index, literal))


OVERFLOWING_FIELDS = {
    "source_version": ('"source_version":0', f'"source_version":{2**63}'),
    "slot id": ('"slot_ids":[0,1]', f'"slot_ids":[0,{2**64}]'),
    "update index": ('{"index":1,', f'{{"index":{2**63},'),
    "error_budget": ('"error_budget":0.0', '"error_budget":1e400'),
}


@pytest.mark.parametrize("field", OVERFLOWING_FIELDS)
def test_from_json_refuses_a_field_beyond_its_widest_dtype_naming_it(pair_json, field):
    text = json.dumps(pair_json, sort_keys=True, separators=(",", ":"))
    old, new = OVERFLOWING_FIELDS[field]
    assert old in text
    with pytest.raises(ValueError, match=field.split()[-1]):
        cb.TransitionProposal.from_json(text.replace(old, new, 1))


def test_values_at_the_edge_of_the_widest_dtypes_are_still_accepted(pair_json):
    text = _with_value(pair_json, "weights", 0, "1.7976931348623157e308")
    assert cb.TransitionProposal.from_json(text).updates[1].value == 1.7976931348623157e308
    text = _with_value(pair_json, "modes", 0, str(2**63 - 1))
    assert cb.TransitionProposal.from_json(text).updates[4].value == 2**63 - 1
