"""The one atomic file writer: every save in confluent-bank goes through `write_atomic`.

The bytes go to a hidden temporary file in the target's folder whose name is unique per call
(`.<target name>.<16 hex digits>.tmp`; two threads or processes saving the same path never
share one), are flushed and fsynced, replace the target in one `os.replace`, and the folder
is fsynced so the rename survives a crash. A reader therefore sees the old file or the new
one, never a mixture.

A save killed mid-write (SIGKILL, power loss) leaves its temporary behind. Each save first
deletes the temporaries of its own target that no running save holds, so killed saves leave
at most one temporary between them. A writer holds an exclusive `flock` on its temporary from
creation until after the rename, and the operating system drops that lock when the writer
dies, however it dies: a temporary whose lock can be taken belongs to a dead save, one whose
lock cannot belongs to a running one and is left alone. A lock is used rather than the
writer's pid in the name because a pid can be reused by an unrelated process and says
nothing across hosts sharing a folder, while a lock is released exactly when its holder
dies. Where `flock` is emulated with POSIX locks (NFS), a process does not conflict with its
own locks, so the temporaries this process is writing are also kept in a set and skipped.
Without `fcntl` (Windows) the operating system refuses to delete a file that is still open,
which gives the same guarantee.

With several JAX processes (`jax.process_count() > 1`) only process 0 writes; the others
wait at a barrier until it has finished and then return the same path, or raise the same
kind of error if process 0 could not write. Every process must therefore call the save, as
the trainer does; a save called on one process only would wait for the others forever.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np

from confluent_bank import _paths

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# The temporaries that threads of this process are writing (see the module docstring: NFS).
_LIVE: set[str] = set()
_LIVE_LOCK = threading.Lock()
_ATTEMPTS = 16


def _refuse(error: OSError, target: Path) -> NoReturn:
    # The user named the target; the hidden temporary would only confuse them.
    reason = error.strerror or str(error)
    message = f"cannot write {os.fspath(target)!r}: {reason}"
    raise (
        type(error)(error.errno, message) if error.errno is not None else type(error)(message)
    ) from error


def write_atomic(path: str | os.PathLike[str], data: bytes, *, arg: str = "path") -> Path:
    """Replace the file at `path` by `data` atomically (unique temp file, fsync, rename).

    If anything fails, the previous file at `path` is left intact and the temporary file is
    removed. A file that already exists keeps its permission bits; a new one gets `0o644`.
    Temporaries of `path` left by killed saves are deleted first (never one a running save
    is writing); see the module docstring.

    **Arguments:**

    - `path`: the destination file; its folder must exist.
    - `data`: the complete new content.
    - `arg`: the name of the caller's path argument, for error messages.

    **Returns:** the destination as a `Path`. With several JAX processes only process 0
    writes; see the module docstring.

    **Raises:** `ValueError` naming `arg` and `path` when `path` is a directory or its folder
    does not exist (the rule of `_paths`), and any other `OSError` of the write (a full
    disk, no permission) with a message naming `path`.
    """
    target = Path(path)
    return _single_writer(target, lambda: _write_here(target, data, arg))


def _write_here(target: Path, data: bytes, arg: str = "path") -> Path:
    _paths.target_file(target, arg)
    folder = target.parent
    _remove_stale(target)
    descriptor, temporary = _create_temporary(target, arg)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
            os.chmod(temporary, mode)
            if fcntl is not None:
                # Renamed while still open and locked, so no cleanup can take it for stale.
                os.replace(temporary, target)
        if fcntl is None:
            os.replace(temporary, target)  # Windows cannot rename a file that is still open
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, IsADirectoryError | NotADirectoryError | FileNotFoundError):
            # The folder vanished or the target became a folder meanwhile: the path rule.
            _paths.target_file(target, arg)
        _refuse(error, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        _forget(temporary)
    _fsync_folder(folder)
    return target


def _temporary_pattern(target: Path) -> re.Pattern[str]:
    # Exactly the names `_create_temporary` makes for this target: `.a.json.<hex>.tmp` never
    # matches the target `a`, whose pattern needs 16 hex digits right after `.a.`.
    return re.compile(rf"\.{re.escape(target.name)}\.[0-9a-f]{{16}}\.tmp")


def _lock(descriptor: int) -> bool:
    """Take the exclusive lock on `descriptor` without waiting; False if another holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except OSError:
        return False


def _remove_stale(target: Path) -> None:
    """Delete the temporaries of `target` left by saves that are no longer running."""
    pattern = _temporary_pattern(target)
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return
    for name in names:
        if not pattern.fullmatch(name):
            continue
        candidate = target.parent / name
        with _LIVE_LOCK:
            if str(candidate) in _LIVE:
                continue
        try:
            descriptor = os.open(candidate, os.O_RDWR | getattr(os, "O_BINARY", 0))
        except OSError:
            continue  # renamed or deleted meanwhile, or not ours to open
        try:
            # Locked and still the file under that name (not a target it was renamed to).
            if _lock(descriptor) and _same_file(descriptor, candidate):
                candidate.unlink()
        except OSError:
            pass  # Windows: still open in a running save
        finally:
            os.close(descriptor)


def _create_temporary(target: Path, arg: str) -> tuple[int, Path]:
    """Create and lock a new temporary for `target`; its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(_ATTEMPTS):
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        with _LIVE_LOCK:
            try:
                descriptor = os.open(temporary, flags, 0o600)
            except FileExistsError:
                continue
            except OSError as error:
                if isinstance(error, FileNotFoundError | NotADirectoryError):
                    _paths.target_file(target, arg)
                _refuse(error, target)
            _LIVE.add(str(temporary))
        # Another process's cleanup may have taken the new file for stale between its
        # creation and our lock; then the name no longer points at our descriptor: retry.
        if _lock(descriptor) and _same_file(descriptor, temporary):
            return descriptor, temporary
        os.close(descriptor)
        _forget(temporary)
    raise OSError(
        f"cannot write {os.fspath(target)!r}: no free temporary name in {_ATTEMPTS} tries"
    )


def _forget(temporary: Path) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(str(temporary))


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
