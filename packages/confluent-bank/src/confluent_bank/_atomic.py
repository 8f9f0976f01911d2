"""The one atomic file writer: every save in confluent-bank goes through `write_atomic`.

The bytes go to a hidden temporary file in the target's folder whose name is unique per call
(two threads or processes saving the same path never share one), are flushed and fsynced,
replace the target in one `os.replace`, and the folder is fsynced so the rename survives a
crash. A reader therefore sees the old file or the new one, never a mixture.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import NoReturn


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

    **Returns:** the destination as a `Path`.

    **Raises:** `FileNotFoundError` naming `path` when its folder does not exist,
    `IsADirectoryError` when `path` is a folder, and any other `OSError` of the write with a
    message naming `path`.
    """
    target = Path(path)
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
