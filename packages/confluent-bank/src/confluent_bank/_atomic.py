"""The one atomic file writer: every save in confluent-bank goes through `write_atomic`.

The bytes go to a hidden temporary file in the target's folder whose name is unique per call
(two threads or processes saving the same path never share one), are flushed and fsynced,
replace the target in one `os.replace`, and the folder is fsynced so the rename survives a
crash. A reader therefore sees the old file or the new one, never a mixture.

With several JAX processes (`jax.process_count() > 1`) only process 0 writes; the others
wait at a barrier until it has finished and then return the same path, or raise the same
kind of error if process 0 could not write. Every process must therefore call the save, as
the trainer does; a save called on one process only would wait for the others forever.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np


def _refuse(error: OSError, target: Path) -> NoReturn:
    # The user named the target; the hidden temporary would only confuse them.
    reason = error.strerror or str(error)
    message = f"cannot write {os.fspath(target)!r}: {reason}"
    raise (
        type(error)(error.errno, message) if error.errno is not None else type(error)(message)
    ) from error


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace the file at `path` by `data` atomically (unique temp file, fsync, rename).

    If anything fails, the previous file at `path` is left intact and the temporary file is
    removed. A file that already exists keeps its permission bits; a new one gets `0o644`.

    **Arguments:**

    - `path`: the destination file; its folder must exist.
    - `data`: the complete new content.

    **Returns:** the destination as a `Path`. With several JAX processes only process 0
    writes; see the module docstring.

    **Raises:** `FileNotFoundError` naming `path` when its folder does not exist,
    `IsADirectoryError` when `path` is a folder, and any other `OSError` of the write with a
    message naming `path`.
    """
    target = Path(path)
    return _single_writer(target, lambda: _write_here(target, data))


def _write_here(target: Path, data: bytes) -> Path:
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"cannot write {os.fspath(target)!r}: the folder {os.fspath(folder)!r} does not exist"
        )
    if target.is_dir():
        raise IsADirectoryError(f"cannot write {os.fspath(target)!r}: it is a folder")
    try:
        descriptor, temporary = tempfile.mkstemp(
            dir=folder, prefix=f".{target.name}.", suffix=".tmp"
        )
    except OSError as error:
        _refuse(error, target)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        _refuse(error, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_folder(folder)
    return target


def _single_writer(target: Path, write: Callable[[], Path]) -> Path:
    """Run `write` on process 0 only; the other processes wait until the file is complete."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return write()
    failure: BaseException | None = None
    if jax.process_index() == 0:
        try:
            write()
        except Exception as error:  # re-raised below, after the others have been told
            failure = error
    # A collective, so it is also the barrier: nobody reads the file before it is complete.
    written = multihost_utils.broadcast_one_to_all(np.int32(failure is None))
    if failure is not None:
        raise failure
    if not int(written):
        raise OSError(f"cannot write {os.fspath(target)!r}: process 0 failed to write it")
    return target


def _fsync_folder(folder: Path) -> None:
    # Makes the rename durable; not every platform can open a folder.
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
