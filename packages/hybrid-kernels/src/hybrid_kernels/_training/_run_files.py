"""Binding a run folder's files to its manifest, so one folder can never mix two runs.

`run.json` records the SHA-256 of every other file of the run (`"digests"`), and its own
checksum covers those digests. Loading compares each file with its digest before reading it:

- a file copied from another run (or altered) has another digest, and is named;
- a `run.json` copied from another run records the digests of that run's files, so none of
    the files beside it matches: then `run.json` is named, since it is the odd one out;
- with a single data file the two cannot be told apart, and both are named.

Run folders written before the digests (format version 1) are still read, with a warning
that their files cannot be checked against each other; saving them again binds them.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

from hybrid_kernels._paths import read_bytes

MANIFEST = "run.json"


def file_digests(folder: Path, names: list[str]) -> dict[str, str]:
    """SHA-256 of each named file of `folder`."""
    return {name: hashlib.sha256(read_bytes(folder / name)).hexdigest() for name in names}


def check_bound(folder: Path, manifest: dict[str, Any], *, legacy: bool) -> None:
    """Raise `ValueError` naming the file(s) of `folder` that do not belong to `manifest`."""
    where = str(folder / MANIFEST)
    names = [name for name in manifest["files"].values() if name is not None]
    if legacy:
        warnings.warn(
            f"load_run: {where!r} was written before run files were bound to their manifest "
            f"(format version 1): {names} cannot be checked to come from this run. Save the "
            "run again to bind them.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    recorded = manifest.get("digests")
    if not isinstance(recorded, dict) or sorted(recorded) != sorted(names):
        raise ValueError(f"load_run: {where!r} is damaged: it lacks the digests of {names}")
    found = file_digests(folder, names)
    wrong = [name for name in names if found[name] != recorded[name]]
    if not wrong:
        return
    if len(names) == 1:
        file = str(folder / wrong[0])
        raise ValueError(
            f"load_run: {where!r} and {file!r} come from different saves: the file's SHA-256 "
            "is not the one run.json records (one of them was copied from another run, or "
            "altered after saving)"
        )
    if len(wrong) == len(names):
        raise ValueError(
            f"load_run: {where!r} does not belong to the files beside it: none of {names} has "
            "the SHA-256 it records (a run.json copied from another run?)"
        )
    file = str(folder / wrong[0])
    raise ValueError(
        f"load_run: {file!r} does not belong to this run: its SHA-256 is not the one {where!r} "
        "records (a file copied from another run, or altered after saving)"
    )
