"""Checkpoints: validated loading in the spec's order, stricter inputs, atomic files (spec 2.3,
2.4; issue 3 points 4 and 5)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PB_DIGEST

import confluent_bank as cb
import confluent_bank._atomic as atomic


def corrupt(bank, edit):
    data = copy.deepcopy(bank.checkpoint())
    edit(data)
    return data


def test_round_trip_gives_an_identical_snapshot(pair_bank):
    restored = cb.bank_from_checkpoint(pair_bank.checkpoint())
    assert restored.portable_snapshot() == pair_bank.portable_snapshot()
    assert restored.max_order == 3 and restored.base == "sigmoid"


def test_round_trip_through_json_text_keeps_the_digest(pair_committed_bank):
    text = json.dumps(pair_committed_bank.checkpoint())
    restored = cb.bank_from_checkpoint(json.loads(text))
    assert cb.snapshot_digest(restored.portable_snapshot()) == cb.snapshot_digest(
        pair_committed_bank.portable_snapshot()
    )


def test_snapshot_digest_is_sha256_of_the_canonical_json(pair_bank):
    snapshot = pair_bank.portable_snapshot()
    canonical = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert cb.snapshot_digest(snapshot) == hashlib.sha256(canonical.encode()).hexdigest()
    assert cb.snapshot_digest(snapshot) == PB_DIGEST


def test_digest_binds_the_configuration(pair_bank):
    snapshot = pair_bank.portable_snapshot()
    snapshot["__configuration__"]["activation"] = "tanh"
    assert cb.snapshot_digest(snapshot) != PB_DIGEST


def test_a_changed_top_level_base_is_a_configuration_error(pair_bank):
    with pytest.raises(ValueError, match="configuration"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d.update(base="tanh")))


def test_an_out_of_range_mode_is_a_representation_error(pair_bank):
    def edit(data):
        data["state"]["modes"]["values"][0] = 8

    with pytest.raises(ValueError, match="representation"):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


def test_non_boolean_activity_flags_are_rejected(pair_bank):
    def edit(data):
        data["state"]["active"]["dtype"] = "float64"

    with pytest.raises(ValueError, match="boolean"):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("schema_version",), 2, "schema"),
        (("state", "__configuration__", "series_terms"), 7, "configuration"),
        (("state", "__configuration__", "max_packs"), 5, "configuration"),
        (("max_order",), 4, "configuration"),
        (("state", "weights", "dtype"), "int64", "real floating"),
        (("state", "weights", "dtype"), "complex128", "real floating"),
        (("state", "weights", "dtype"), "float32", "real floating"),
        (("state", "orders", "dtype"), "float64", "integer"),
        (("state", "rho", "shape"), [5], "rho"),
        (("state", "centers", "dtype"), "float16x", "centers"),
        (("state", "orders", "values", 2), 4, "representation"),
        (("state", "rho", "values", 0), -0.5, "representation"),
        (("state", "slot_ids", "values", 1), 0, "representation"),
        (("state", "ages", "values", 0), -1, "representation"),
        (("state", "transition_version", "values", 0), -1, "representation"),
        (("state", "weights", "values", 0), float("nan"), "finite"),
        (("state", "weights", "values", 0), float("inf"), "finite"),
    ],
)
def test_each_invalid_field_is_a_value_error(pair_bank, path, value, match):
    def edit(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    with pytest.raises(ValueError, match=match):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


@pytest.mark.parametrize("value", [None, [], "checkpoint", 3, (1, 2)])
def test_non_mapping_input_is_a_value_error(value):
    with pytest.raises(ValueError, match="mapping"):
        cb.bank_from_checkpoint(value)


def test_missing_and_unknown_blocks_are_rejected(pair_bank):
    with pytest.raises(ValueError, match="missing or unknown"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d["state"].pop("rho")))
    with pytest.raises(ValueError, match="missing or unknown"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d["state"].update(extra={})))
    with pytest.raises(ValueError, match="missing or unknown"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d.pop("state")))


def test_missing_and_unknown_top_level_keys_are_rejected(pair_bank):
    with pytest.raises(ValueError, match="keys"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d.update(note="hi")))
    with pytest.raises(ValueError, match="keys"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d.pop("base")))


def test_wrong_value_lengths_are_a_value_error_naming_the_block(pair_bank):
    def edit(data):
        data["state"]["scales"]["values"].append(1.0)

    with pytest.raises(ValueError, match="scales"):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


@pytest.mark.parametrize(
    ("block", "value"),
    [
        ("weights", "1.0"),
        ("weights", None),
        ("weights", [1.0]),
        ("weights", True),
        ("orders", 1.5),
        ("orders", 1.0),
        ("orders", True),
        ("orders", 2**70),
        ("active", 1),
        ("modes", "1"),
    ],
)
def test_non_numeric_or_mistyped_values_are_a_value_error(pair_bank, block, value):
    def edit(data):
        data["state"][block]["values"][0] = value

    with pytest.raises(ValueError, match=block):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


def test_values_must_be_exactly_representable_in_the_stored_dtype():
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(0, 0.5)], max_packs=2, max_order=1, dtype=jnp.float32
    )
    restored = cb.bank_from_checkpoint(bank.checkpoint())
    assert restored.centers.dtype == jnp.float32

    def edit(data):
        data["state"]["centers"]["values"][0] = 0.1  # not a float32 number

    with pytest.raises(ValueError, match="exactly representable"):
        cb.bank_from_checkpoint(corrupt(bank, edit))


def test_block_entries_must_have_exactly_shape_dtype_values(pair_bank):
    with pytest.raises(ValueError, match="rho"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d["state"]["rho"].pop("shape")))
    with pytest.raises(ValueError, match="rho"):
        cb.bank_from_checkpoint(corrupt(pair_bank, lambda d: d["state"].update(rho=[0.0] * 4)))


def test_mixed_integer_dtypes_of_a_migrated_bank_round_trip():
    legacy = cb.init_pack_bank([cb.RefinedPack(0, 0.1, 0.7)], max_packs=2, max_order=1, base="tanh")
    migrated = cb.migrate_legacy(legacy)
    restored = cb.bank_from_checkpoint(migrated.checkpoint())
    assert restored.orders.dtype == jnp.int32 and restored.modes.dtype == jnp.int64
    assert restored.portable_snapshot() == migrated.portable_snapshot()


def test_save_and_load_round_trip(tmp_path, pair_committed_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_committed_bank)
    restored = cb.load_checkpoint(path)
    assert restored.portable_snapshot() == pair_committed_bank.portable_snapshot()
    assert sorted(os.listdir(tmp_path)) == ["bank.json"]


def test_a_failed_rename_leaves_the_previous_file_intact(tmp_path, pair_bank, monkeypatch):
    path = tmp_path / "bank.json"
    cb.save_checkpoint(path, pair_bank)
    before = path.read_bytes()

    def failing(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", failing)
    changed = pair_bank.with_parameters({**pair_bank.parameters, "weights": pair_bank.weights * 2})
    with pytest.raises(OSError, match="disk full"):
        cb.save_checkpoint(path, changed)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["bank.json"]


def test_a_failed_serialisation_leaves_the_previous_file_intact(tmp_path, pair_bank):
    path = tmp_path / "bank.json"
    cb.save_checkpoint(path, pair_bank)
    before = path.read_bytes()
    broken = dataclasses.replace(pair_bank, weights=pair_bank.weights.at[0].set(jnp.nan))
    with pytest.raises(ValueError):
        cb.save_checkpoint(path, broken)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["bank.json"]


def test_a_failed_write_removes_the_temporary_file(tmp_path, pair_bank, monkeypatch):
    def failing(_descriptor):
        raise OSError("fsync failed")

    monkeypatch.setattr(atomic.os, "fsync", failing)
    with pytest.raises(OSError, match="fsync failed"):
        cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    assert os.listdir(tmp_path) == []


def test_a_truncated_file_is_a_value_error(tmp_path, pair_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    text = path.read_text()
    for cut in (0, 1, len(text) // 2, len(text) - 1):
        path.write_text(text[:cut])
        with pytest.raises(ValueError):
            cb.load_checkpoint(path)


def test_a_hand_edited_invalid_file_is_a_value_error(tmp_path, pair_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    data = json.loads(path.read_text())
    data["state"]["modes"]["values"][1] = 5
    # A deliberate edit that also rewrites the checksum still meets the full validation.
    data["snapshot_digest"] = cb.snapshot_digest(data["state"])
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="representation"):
        cb.load_checkpoint(path)


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00", b'{"schema_version": NaN}', b"[1, 2"])
def test_non_json_files_are_a_value_error(tmp_path, payload):
    path = tmp_path / "bank.json"
    path.write_bytes(payload)
    with pytest.raises(ValueError):
        cb.load_checkpoint(path)


def test_loading_never_returns_a_partially_valid_bank(tmp_path, pair_bank):
    # The last block is invalid: nothing is returned, even though every earlier block was fine.
    data = pair_bank.checkpoint()
    data["state"]["transition_version"]["values"] = [-3]
    with pytest.raises(ValueError, match="representation"):
        cb.bank_from_checkpoint(data)
    np.testing.assert_array_equal(pair_bank.transition_version, 0)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["state"]["centers"].update(shape=[10**12]),
        lambda d: d.update(max_order=10**9),
    ],
)
def test_huge_declared_sizes_are_rejected_before_allocating(pair_bank, edit):
    with pytest.raises(ValueError, match=r"centers|configuration"):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))


@pytest.mark.parametrize("dtype", ["float64,", "f8", "<f8", "(2,)float64", "object", "", 64])
def test_dtype_names_outside_the_snapshot_format_are_a_value_error(pair_bank, dtype):
    # numpy would parse some of these (or raise SyntaxError on "float64,"); none is a name a
    # snapshot writes.
    def edit(data):
        data["state"]["centers"]["dtype"] = dtype

    with pytest.raises(ValueError, match="centers"):
        cb.bank_from_checkpoint(corrupt(pair_bank, edit))
