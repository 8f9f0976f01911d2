"""Atomic file writes: the one way every save in hybrid_kernels reaches the disk.

`write_atomic` writes to a temporary file beside the target, under a name unique to the call
(`.<target name>.<16 hex digits>.tmp`), flushes it to disk, renames it over the target and
flushes the folder. The target therefore always holds either the previous file or the new
one, complete, even when the process is killed mid-write or when several threads or processes
save to the same target at once (the last rename wins).

A killed save leaves its temporary behind. The next save to the same target deletes every
such temporary that no running save holds: a writer keeps its temporary locked (`flock`)
until the rename, so only the remains of dead writers can be locked and deleted. Where
`fcntl` is missing (Windows), the operating system itself refuses to delete a file that is
still open, which gives the same guarantee.

Why a lock and not the writer's process id in the name: the kernel drops a lock the moment
its holder dies, however it dies (SIGKILL included), so "lockable" means exactly "no running
save owns it", with no guess about process-id reuse or which host wrote the file on a shared
disk.

Folders written as one unit (`save_run`) follow the same rule: the new folder is staged as
`.<name>.new.<16 hex digits>.tmp`, locked by its save (`staging_folder`), and swapped with
the folder it replaces in one step where Linux can (`exchange`), after which the staging name
holds the old folder until it is deleted. Elsewhere the old folder is first set aside as
`.<name>.old.<16 hex digits>.tmp`, also locked (`set_aside`). `remove_stale_folders` deletes
unlocked staging folders, and puts an unlocked old folder back in place when the target is
missing (the save was killed between the two renames, so the old run is the only complete
one); it removes nothing where folders cannot be locked (Windows).

With several JAX processes (`jax.process_count() > 1`) only process 0 writes; the others
wait at a barrier until it has finished and then return the same path, or raise the same
kind of error if process 0 could not write. Every process must therefore call the save, as
the trainer does; a save called on one process only would wait for the others forever.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hybrid_kernels._paths import file_to_write

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


# Temporaries that threads of this process are writing. POSIX locks emulating `flock` (on
# NFS) do not exclude threads of one process, so the process also keeps its own list.
_LIVE: set[str] = set()
_LIVE_LOCK = threading.Lock()
_ATTEMPTS = 16


def _temporary_pattern(target: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(target.name)}\.[0-9a-f]{{16}}\.tmp")


def _lock(fd: int) -> bool:
    """Take the exclusive lock on `fd` without waiting; False when another writer holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


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
            fd = os.open(candidate, os.O_RDWR | getattr(os, "O_BINARY", 0))
        except OSError:
            continue  # already renamed or deleted, or not ours to open
        try:
            if _lock(fd):
                candidate.unlink()
        except OSError:
            pass  # Windows: still open in a running save
        finally:
            os.close(fd)


def _create_temporary(target: Path) -> tuple[int, Path]:
    """Create and lock a new temporary for `target`; returns its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(_ATTEMPTS):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        with _LIVE_LOCK:
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue
            except OSError as err:
                raise OSError(
                    err.errno, f"cannot save to {str(target)!r}: {err.strerror}"
                ) from None
            _LIVE.add(str(tmp))
        # Another process's cleanup may have deleted the file between its creation and the
        # lock; then the name no longer points at our descriptor, and we start again.
        if _lock(fd) and _same_file(fd, tmp):
            return fd, tmp
        os.close(fd)
        _forget(tmp)
    raise OSError(f"cannot save to {str(target)!r}: no free temporary name after {_ATTEMPTS} tries")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _forget(tmp: Path) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(str(tmp))


def _folder_pattern(target: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(target.name)}\.(new|old)\.[0-9a-f]{{16}}\.tmp")


def _folder_name(target: Path, role: str) -> Path:
    return target.with_name(f".{target.name}.{role}.{secrets.token_hex(8)}.tmp")


def release(fd: int | None) -> None:
    """Close a folder's descriptor from `staging_folder` or `set_aside`, dropping its lock."""
    if fd is not None:
        os.close(fd)


def staging_folder(target: Path) -> tuple[int | None, Path]:
    """A new empty folder `.<name>.new.<16 hex>.tmp` beside `target`, locked by this process.

    The lock (on a descriptor of the folder, held until the caller `release`s it) tells
    `remove_stale_folders` that a running save still owns the folder. Where folders cannot
    be locked (no `fcntl`: Windows, which cannot open a folder either) there is no
    descriptor, and no cleanup either.
    """
    for _ in range(_ATTEMPTS):
        name = _folder_name(target, "new")
        try:
            name.mkdir()
        except FileExistsError:
            continue
        if fcntl is None:
            return None, name
        fd = os.open(name, os.O_RDONLY)
        # As for files: a cleanup may have taken the fresh folder before the lock; retry.
        if _lock(fd) and _same_file(fd, name):
            return fd, name
        os.close(fd)
    raise OSError(f"cannot save to {str(target)!r}: no free temporary name after {_ATTEMPTS} tries")


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap the folders `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`).

    Returns False, having changed nothing, where the system or the file system cannot.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):  # no renameat2 (macOS, old glibc, Windows)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"cannot swap {str(a)!r} and {str(b)!r}: {os.strerror(code)}")


def set_aside(target: Path) -> tuple[int | None, Path]:
    """Rename the folder `target` to `.<name>.old.<16 hex>.tmp`, locked by this process
    (where folders can be locked; see `staging_folder`)."""
    name = _folder_name(target, "old")
    if fcntl is None:
        os.replace(target, name)
        return None, name
    fd = os.open(target, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another save still holds it
        os.replace(target, name)
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def remove_stale_folders(target: Path) -> None:
    """Clean up after saves of the folder `target` that were killed before they finished.

    A staging folder (`new`) is deleted. A set-aside old folder (`old`) is deleted when
    `target` exists, and renamed back to `target` when it does not: the save was killed
    between moving the old run aside and moving the new one in, and the old run is the only
    complete one. Folders still locked by a running save are left alone; without `fcntl`
    (Windows) nothing is removed, since a folder cannot be locked there.
    """
    if fcntl is None:
        return
    pattern = _folder_pattern(target)
    try:
        names = [entry.name for entry in os.scandir(target.parent)]
    except OSError:
        return
    for name in names:
        found = pattern.fullmatch(name)
        if found is None:
            continue
        candidate = target.parent / name
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue
        try:
            if not (_lock(fd) and _same_file(fd, candidate)):
                continue
            if found.group(1) == "old" and not os.path.lexists(target):
                os.replace(candidate, target)
            else:
                shutil.rmtree(candidate, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(fd)


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable; not every platform can open a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_GATE = threading.local()


def _single_writer(target: Path, write: Callable[[], Path]) -> Path:
    """Run `write` on process 0 only; the other processes wait until the file is complete.

    Saves nested inside `write` (a folder of several files written as one unit) write
    directly: the outer call is the only barrier.
    """
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1 or getattr(_GATE, "inside", False):
        return write()
    failure: BaseException | None = None
    if jax.process_index() == 0:
        _GATE.inside = True
        try:
            write()
        except Exception as error:  # re-raised below, after the others have been told
            failure = error
        finally:
            _GATE.inside = False
    # A collective, so it is also the barrier: nobody reads the file before it is complete.
    written = multihost_utils.broadcast_one_to_all(np.int32(failure is None))
    if failure is not None:
        raise failure
    if not int(written):
        raise OSError(f"cannot write {os.fspath(target)!r}: process 0 failed to write it")
    return target


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace the file at `path` by `data`, atomically and durably.

    **Arguments:**

    - `path`: the target file; its folder must exist. An existing file is replaced.
    - `data`: the complete new contents.

    **Returns:** the target path. With several JAX processes only process 0 writes; see the
    module docstring.

    Raises `ValueError` naming `path` when it is a directory or its folder does not exist
    (the rule of `hybrid_kernels._paths`). Stale temporaries of
    the same target (from killed saves) are deleted first; see the module docstring.
    """
    target = Path(path)
    return _single_writer(target, lambda: _write_here(target, data))


def _write_here(target: Path, data: bytes) -> Path:
    file_to_write(target)
    _remove_stale(target)
    fd, tmp = _create_temporary(target)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            if fcntl is not None:
                # Renamed while still open and locked, so no cleanup can take it for stale.
                os.replace(tmp, target)
        if fcntl is None:
            os.replace(tmp, target)  # Windows cannot rename a file that is still open
        _fsync_folder(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _forget(tmp)
    return target
