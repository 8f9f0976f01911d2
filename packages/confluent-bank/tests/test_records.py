"""Host records: RefinedPack, SlotUpdate, TransitionProposal and its JSON (spec 2.1, 2.2)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import confluent_bank as cb

# The spec's PB pair proposal, verbatim (section 6 regression values).
PAIR_JSON = (
    '{"coordinate_identity":"exact_real_coordinate_identity_with_recorded_float_operands",'
    '"error_budget":0.0,"kind":"centered_pair","schema_version":1,"slot_ids":[0,1],'
    '"source_digest":"fb65eb322b8867ba9e7c9b3d12aa75d640c096cc17fded5a27d9e8fe6fcf23ff",'
    '"source_version":0,"updates":[{"index":0,"name":"centers","value":0.0},'
    '{"index":0,"name":"weights","value":1.0},{"index":0,"name":"rho","value":0.015625},'
    '{"index":0,"name":"odd_moments","value":0.375},{"index":0,"name":"modes","value":1.0},'
    '{"index":0,"name":"directions","value":0.0},{"index":0,"name":"direction_bias","value":1.0},'
    '{"index":1,"name":"active","value":0.0},{"index":1,"name":"weights","value":0.0},'
    '{"index":1,"name":"odd_moments","value":0.0}]}'
)


def proposal(**changes):
    fields = {
        "source_digest": "abc",
        "source_version": 3,
        "slot_ids": (4, 1),
        "updates": (
            cb.SlotUpdate("rho", 0, 0.25),
            cb.SlotUpdate("moment_coefficients", 1, (1.0, 0.5, 0)),
            cb.SlotUpdate("modes", 1, 2),
        ),
        "kind": "cluster_to_moments",
        "coordinate_identity": "finite-spread truncation with explicit remainder",
        "error_budget": 1e-7,
    }
    return cb.TransitionProposal(**{**fields, **changes})


def test_refined_pack_positional_order_and_defaults():
    pack = cb.RefinedPack(0, -0.125, 2.0)
    assert (pack.order, pack.center, pack.weight, pack.scale, pack.age) == (0, -0.125, 2.0, 1.0, 0)
    pack = cb.RefinedPack(2, 0.2, 0.5, 0.7)
    assert (pack.order, pack.center, pack.weight, pack.scale) == (2, 0.2, 0.5, 0.7)


def test_refined_pack_coerces_types():
    pack = cb.RefinedPack(2.0, 1, 3, 2, age=4.0)
    assert type(pack.order) is int and type(pack.age) is int
    assert type(pack.center) is float and type(pack.weight) is float and type(pack.scale) is float


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 0.0), "order"),
        ((0, float("nan")), "finite"),
        ((0, 0.0, float("inf")), "finite"),
        ((0, 0.0, 1.0, 0.0), "scale"),
        ((0, 0.0, 1.0, float("nan")), "scale"),
        ((0, 0.0, 1.0, 1.0, -1), "age"),
    ],
)
def test_refined_pack_rejects_invalid_values(args, match):
    with pytest.raises(ValueError, match=match):
        cb.RefinedPack(*args)


def test_refined_pack_rejects_non_numbers():
    with pytest.raises(TypeError, match="order"):
        cb.RefinedPack(0.5, 0.0)
    with pytest.raises(TypeError, match="center"):
        cb.RefinedPack(0, "zero")


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        cb.RefinedPack(0, 0.0).order = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        proposal().kind = "other"  # type: ignore[misc]


def test_slot_update_keeps_python_types_and_turns_lists_into_tuples():
    assert cb.SlotUpdate("modes", 0, 1.0).value == 1.0
    assert type(cb.SlotUpdate("modes", 0, 2).value) is int
    update = cb.SlotUpdate("moment_coefficients", 0, [1.0, 0])
    assert update.value == (1.0, 0)


def test_slot_update_rejects_non_finite_and_non_numeric_values():
    with pytest.raises(ValueError, match="finite"):
        cb.SlotUpdate("rho", 0, float("nan"))
    with pytest.raises(ValueError, match="finite"):
        cb.SlotUpdate("moment_coefficients", 0, (1.0, float("inf")))
    with pytest.raises(TypeError, match="number"):
        cb.SlotUpdate("rho", 0, "1.0")
    with pytest.raises(TypeError, match="name"):
        cb.SlotUpdate(3, 0, 1.0)


def test_proposal_fields_and_defaults():
    fields = [f.name for f in dataclasses.fields(cb.TransitionProposal)]
    assert fields == [
        "source_digest",
        "source_version",
        "slot_ids",
        "updates",
        "kind",
        "coordinate_identity",
        "error_budget",
        "schema_version",
    ]
    plain = cb.TransitionProposal("d", 0, (0,), (), "remove_zero", "exact_zero_output")
    assert plain.error_budget == 0.0 and plain.schema_version == 1


def test_proposal_rejects_a_negative_budget():
    with pytest.raises(ValueError, match="error_budget"):
        proposal(error_budget=-1e-9)


@pytest.mark.parametrize("budget", [float("nan"), float("inf")])
def test_proposal_rejects_a_non_finite_budget(budget):
    with pytest.raises(ValueError, match="error_budget"):
        proposal(error_budget=budget)


def test_proposal_rejects_an_unknown_schema_version():
    with pytest.raises(ValueError, match="schema_version"):
        proposal(schema_version=2)


def test_proposal_rejects_repeated_slot_ids():
    with pytest.raises(ValueError, match="distinct"):
        proposal(slot_ids=(1, 1))


def test_proposal_rejects_updates_that_are_not_slot_updates():
    with pytest.raises(TypeError, match="SlotUpdate"):
        proposal(updates=(("rho", 0, 0.0),))


def test_to_json_is_sorted_compact_json():
    text = proposal().to_json()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert data["slot_ids"] == [4, 1]
    assert data["updates"][1] == {
        "index": 1,
        "name": "moment_coefficients",
        "value": [1.0, 0.5, 0],
    }


def test_json_round_trip_is_exact():
    original = proposal(error_budget=0.1 + 0.2)
    restored = cb.TransitionProposal.from_json(original.to_json())
    assert restored == original
    assert type(restored.updates[2].value) is int
    assert isinstance(restored.slot_ids, tuple) and isinstance(restored.updates[1].value, tuple)


def test_the_spec_pair_proposal_json_round_trips_verbatim():
    parsed = cb.TransitionProposal.from_json(PAIR_JSON)
    assert parsed.slot_ids == (0, 1) and parsed.kind == "centered_pair"
    assert parsed.updates[4] == cb.SlotUpdate("modes", 0, 1.0)
    assert parsed.to_json() == PAIR_JSON


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"kind": "x"}',
        PAIR_JSON.replace('"error_budget":0.0', '"error_budget":NaN'),
        PAIR_JSON.replace('"error_budget":0.0', '"error_budget":-1.0'),
        PAIR_JSON.replace('"slot_ids":[0,1]', '"slot_ids":[0,0]'),
        PAIR_JSON.replace('"slot_ids":[0,1]', '"slot_ids":"01"'),
        PAIR_JSON.replace('"name":"centers"', '"name":7'),
        PAIR_JSON.replace('{"index":0,"name":"centers","value":0.0}', '[0,"centers",0.0]'),
    ],
)
def test_from_json_rejects_malformed_text_with_value_error(text):
    with pytest.raises(ValueError):
        cb.TransitionProposal.from_json(text)


# --- slot modes and transition kinds ---------------------------------------------------------


def test_slot_modes_keep_the_stored_integers():
    assert [int(mode) for mode in cb.SlotMode] == [0, 1, 2]
    assert [mode.name for mode in cb.SlotMode] == ["ORDINARY", "PAIR", "MOMENTS"]


def test_slot_modes_compare_with_the_modes_block(pair_committed_bank):
    modes = pair_committed_bank.modes
    assert (modes == cb.SlotMode.PAIR).tolist() == [True, False, False, False]
    assert (modes == cb.SlotMode.ORDINARY).tolist() == [False, True, True, True]


def test_transition_kinds_are_the_strings_the_proposals_carry(pair_bank):
    kind = pair_bank.propose_pair(0, 1).kind
    assert kind == cb.TransitionKind.CENTERED_PAIR and kind == "centered_pair"
    assert {str(k) for k in cb.TransitionKind} == {
        "centered_pair",
        "duplicate_merge",
        "cluster_to_moments",
        "pair_to_derivative",
        "remove_zero",
        "zero_output_birth",
    }


def test_an_enum_kind_is_stored_as_a_plain_string():
    record = proposal(kind=cb.TransitionKind.REMOVE_ZERO)
    assert type(record.kind) is str
    assert record == proposal(kind="remove_zero")
    assert record.to_json() == proposal(kind="remove_zero").to_json()
