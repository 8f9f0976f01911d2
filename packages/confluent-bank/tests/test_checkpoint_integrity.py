"""Checkpoint files never load a different bank and never hold an unloadable one (issue 11,
items 5 and 6, the checkpoint `OverflowError`, and the atomic writer)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest

import confluent_bank as cb
import confluent_bank._atomic as atomic

# --- item 5: every state save_checkpoint accepts loads back equal ----------------------------


def test_the_retracted_bank_saves_and_loads_back_equal(tmp_path, pair_committed_bank):
    mid_training = dataclasses.replace(
        pair_committed_bank, rho=pair_committed_bank.rho.at[0].set(-1e-3)
    )
    retracted = mid_training.retract()
    restored = cb.load_checkpoint(cb.save_checkpoint(tmp_path / "bank.json", retracted))
    assert cb.snapshot_digest(restored.portable_snapshot()) == cb.snapshot_digest(
        retracted.portable_snapshot()
    )


def test_a_bank_that_could_not_be_loaded_is_refused_at_save_time(tmp_path, pair_bank):
    broken = dataclasses.replace(pair_bank, modes=pair_bank.modes.at[0].set(5))
    with pytest.raises(ValueError, match="representation"):
        cb.save_checkpoint(tmp_path / "bank.json", broken)
    assert os.listdir(tmp_path) == []


# --- item 6: a content checksum, verified on load --------------------------------------------


def test_a_saved_file_records_the_snapshot_digest(tmp_path, pair_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    data = json.loads(path.read_text())
    assert data["snapshot_digest"] == cb.snapshot_digest(pair_bank.portable_snapshot())


def test_one_changed_value_digit_is_detected(tmp_path, pair_committed_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_committed_bank)
    data = json.loads(path.read_text())
    data["state"]["odd_moments"]["values"][0] = 0.376  # was 0.375: a valid, different bank
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="snapshot_digest"):
        cb.load_checkpoint(path)


def _loads_the_same_bank_or_fails(path, original_digest):
    try:
        restored = cb.load_checkpoint(path)
    except ValueError:
        return "refused"
    assert cb.snapshot_digest(restored.portable_snapshot()) == original_digest
    return "same"


def test_changed_digits_never_load_a_different_bank(tmp_path, pair_committed_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_committed_bank)
    text = path.read_text()
    digest = cb.snapshot_digest(pair_committed_bank.portable_snapshot())
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    outcomes = []
    for i in digits[:: max(1, len(digits) // 150)]:
        changed = str((int(text[i]) + 1) % 10)
        path.write_text(text[:i] + changed + text[i + 1 :])
        outcomes.append(_loads_the_same_bank_or_fails(path, digest))
    assert outcomes.count("refused") >= len(outcomes) - 2


def test_bit_flips_never_load_a_different_bank(tmp_path, pair_committed_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_committed_bank)
    raw = path.read_bytes()
    digest = cb.snapshot_digest(pair_committed_bank.portable_snapshot())
    for position in range(0, len(raw), max(1, len(raw) // 40)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[position] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            _loads_the_same_bank_or_fails(path, digest)


def test_a_changed_digest_is_detected(tmp_path, pair_bank):
    path = cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    data = json.loads(path.read_text())
    data["snapshot_digest"] = "0" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="snapshot_digest"):
        cb.load_checkpoint(path)


def test_a_file_without_a_digest_is_refused_and_points_to_the_legacy_path(tmp_path, pair_bank):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(pair_bank.checkpoint()))  # a file from before checksums
    with pytest.raises(ValueError, match="bank_from_checkpoint"):
        cb.load_checkpoint(path)
    restored = cb.bank_from_checkpoint(json.loads(path.read_text()))  # the documented path
    assert restored.portable_snapshot() == pair_bank.portable_snapshot()


def test_a_migrated_legacy_bank_round_trips_through_a_file(tmp_path):
    legacy = cb.init_pack_bank([cb.RefinedPack(0, 0.1, 0.7)], max_packs=2, max_order=1, base="tanh")
    migrated = cb.migrate_legacy(legacy)
    restored = cb.load_checkpoint(cb.save_checkpoint(tmp_path / "bank.json", migrated))
    assert restored.portable_snapshot() == migrated.portable_snapshot()


# --- OverflowError in bank_from_checkpoint ---------------------------------------------------


@pytest.mark.parametrize(
    ("block", "value"),
    [("weights", 10**400), ("weights", -(10**400)), ("orders", 10**400), ("active", 10**400)],
    ids=["weights+", "weights-", "orders", "active"],
)
def test_a_huge_integer_value_is_a_value_error_naming_the_block(pair_bank, block, value):
    data = copy.deepcopy(pair_bank.checkpoint())
    data["state"][block]["values"][0] = value
    with pytest.raises(ValueError, match=block):
        cb.bank_from_checkpoint(data)


@pytest.mark.parametrize(
    "path",
    [("max_order",), ("schema_version",), ("state", "rho", "shape", 0)],
    ids=["max_order", "schema_version", "shape"],
)
def test_a_huge_integer_elsewhere_is_a_value_error(pair_bank, path):
    data = copy.deepcopy(pair_bank.checkpoint())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = 10**400
    with pytest.raises(ValueError):
        cb.bank_from_checkpoint(data)


# --- the atomic writer -----------------------------------------------------------------------


def test_saving_into_a_missing_folder_names_the_target(tmp_path, pair_bank):
    target = tmp_path / "missing" / "bank.json"
    with pytest.raises(ValueError) as caught:
        cb.save_checkpoint(target, pair_bank)
    message = str(caught.value)
    assert str(target) in message and ".tmp" not in message


def test_temporary_names_are_unique_per_call(tmp_path, monkeypatch):
    seen = []
    real = os.replace

    def spy(source, destination):
        seen.append(os.path.basename(source))
        return real(source, destination)

    monkeypatch.setattr(atomic.os, "replace", spy)
    for _ in range(3):
        atomic.write_atomic(tmp_path / "file.json", b"{}")
    assert len(set(seen)) == 3 and all(name.startswith(".file.json.") for name in seen)


def test_the_writer_syncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    atomic.write_atomic(tmp_path / "file.json", b"{}")
    assert len(synced) == 2  # the file's content, then the rename in its folder


def test_the_writer_keeps_an_existing_file_mode(tmp_path):
    path = tmp_path / "file.json"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    atomic.write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and (path.stat().st_mode & 0o777) == 0o600


def test_saving_onto_a_folder_names_the_target(tmp_path, pair_bank):
    target = tmp_path / "bank.json"
    target.mkdir()
    with pytest.raises(ValueError, match=r"bank\.json"):
        cb.save_checkpoint(target, pair_bank)
    assert sorted(os.listdir(tmp_path)) == ["bank.json"]
    assert os.listdir(target) == []
