"""The probe's path scenarios (issue 22, item 5): one rule for every path a user names.

A directory where a file is expected, a missing folder or file and an unreadable file are
`ValueError`s naming the argument and the path, in the wording hybrid-kernels uses too; never
a bare `IsADirectoryError`/`FileNotFoundError`/`PermissionError`, and nothing is left behind.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import confluent_bank as cb
import confluent_bank._atomic as atomic


def _folder_as_target(tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "bank.json"
    target.mkdir()
    return target, f"path={str(target)!r} is a directory; expected a file"


def _missing_folder(tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "missing" / "bank.json"
    folder = str(tmp_path / "missing")
    return target, f"path={str(target)!r}: the folder {folder!r} does not exist"


def _file_as_folder(tmp_path: Path) -> tuple[Path, str]:
    # No folder of that name exists: a file does.
    (tmp_path / "notes.txt").write_text("not a folder")
    target = tmp_path / "notes.txt" / "bank.json"
    folder = str(tmp_path / "notes.txt")
    return target, f"path={str(target)!r}: the folder {folder!r} does not exist"


SAVE_SCENARIOS = {
    "a directory where the file should go": _folder_as_target,
    "a folder that does not exist": _missing_folder,
    "a file where the folder should be": _file_as_folder,
}


@pytest.mark.parametrize("scenario", SAVE_SCENARIOS)
def test_save_checkpoint_refuses_a_bad_path_with_a_value_error_naming_it(
    tmp_path, pair_bank, scenario
):
    target, expected = SAVE_SCENARIOS[scenario](tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError) as caught:
        cb.save_checkpoint(target, pair_bank)
    assert str(caught.value) == expected
    assert not isinstance(caught.value, OSError)
    assert sorted(os.listdir(tmp_path)) == before  # no temporary left anywhere


@pytest.mark.parametrize("scenario", SAVE_SCENARIOS)
def test_the_atomic_writer_names_the_callers_argument(tmp_path, scenario):
    target, expected = SAVE_SCENARIOS[scenario](tmp_path)
    with pytest.raises(ValueError) as caught:
        atomic.write_atomic(target, b"{}", arg="bank_file")
    assert str(caught.value) == expected.replace("path=", "bank_file=", 1)


def test_a_string_path_is_named_as_given(tmp_path, pair_bank):
    target = os.path.join(str(tmp_path), "missing", "bank.json")
    with pytest.raises(ValueError, match=r"^path='.*bank\.json': the folder"):
        cb.save_checkpoint(target, pair_bank)


def _read_folder(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "bank.json").mkdir()
    target = tmp_path / "bank.json"
    return target, f"path={str(target)!r} is a directory; expected a file"


def _read_missing_file(tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "bank.json"
    return target, f"path={str(target)!r} does not exist"


def _read_missing_folder(tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "missing" / "bank.json"
    return target, f"path={str(target)!r} does not exist"


def _read_below_a_file(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "notes.txt").write_text("not a folder")
    target = tmp_path / "notes.txt" / "bank.json"
    return target, f"path={str(target)!r} does not exist"


LOAD_SCENARIOS = {
    "a directory": _read_folder,
    "a missing file": _read_missing_file,
    "a missing folder": _read_missing_folder,
    "a path below a file": _read_below_a_file,
}


@pytest.mark.parametrize("scenario", LOAD_SCENARIOS)
def test_load_checkpoint_refuses_a_bad_path_with_a_value_error_naming_it(tmp_path, scenario):
    target, expected = LOAD_SCENARIOS[scenario](tmp_path)
    with pytest.raises(ValueError) as caught:
        cb.load_checkpoint(target)
    assert str(caught.value) == expected
    assert not isinstance(caught.value, OSError)


def test_an_unreadable_checkpoint_is_a_value_error_with_the_systems_reason(
    tmp_path, pair_bank, monkeypatch
):
    # Simulated: the tests may run as root, who can read a file with mode 000.
    target = cb.save_checkpoint(tmp_path / "bank.json", pair_bank)
    real = Path.read_bytes

    def refuse(self):
        if self == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ValueError) as caught:
        cb.load_checkpoint(target)
    assert str(caught.value) == (
        f"path={str(target)!r} cannot be read: {os.strerror(errno.EACCES)}"
    )


def test_a_folder_that_vanishes_during_the_write_is_the_same_value_error(
    tmp_path, pair_bank, monkeypatch
):
    # The check passed, then the folder went away before the temporary could be created.
    folder = tmp_path / "run"
    folder.mkdir()
    target = folder / "bank.json"
    real = os.open

    def vanish(path, flags, *args):
        if str(path).endswith(".tmp") and folder.exists():
            folder.rmdir()
        return real(path, flags, *args)

    monkeypatch.setattr(atomic.os, "open", vanish)
    with pytest.raises(ValueError) as caught:
        cb.save_checkpoint(target, pair_bank)
    assert str(caught.value) == f"path={str(target)!r}: the folder {str(folder)!r} does not exist"
