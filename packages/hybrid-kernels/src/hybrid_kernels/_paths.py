"""The one rule for paths given to a save or a load.

Every public save and load in hybrid_kernels checks its path here before touching it, so the
same mistake gets the same `ValueError` everywhere (and the same wording as confluent_bank):

- a directory where a file is expected, or a file where a directory is expected;
- a missing parent folder (saving) or a missing file or folder (loading);
- a file the operating system refuses to read (permissions, a broken mount...).

Each message names the argument and the path: `path='runs/a' is a file; expected a directory`.
"""

from __future__ import annotations

import os
from pathlib import Path


def wrong_kind(arg: str, path: Path, *, want_file: bool) -> ValueError:
    if want_file:
        return ValueError(f"{arg}={str(path)!r} is a directory; expected a file")
    return ValueError(f"{arg}={str(path)!r} is a file; expected a directory")


def _parent_exists(arg: str, path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{arg}={str(path)!r}: the folder {str(parent)!r} does not exist")


def file_to_write(path: str | os.PathLike[str], arg: str = "path") -> Path:
    """`path` as a `Path`, after checking that a file can be written there."""
    path = Path(path)
    if path.is_dir():
        raise wrong_kind(arg, path, want_file=True)
    _parent_exists(arg, path)
    return path


def folder_to_write(path: str | os.PathLike[str], arg: str = "path") -> Path:
    """`path` as a `Path`, after checking that a folder can be created or replaced there."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise wrong_kind(arg, path, want_file=False)
    _parent_exists(arg, path)
    return path


def file_to_read(path: str | os.PathLike[str], arg: str = "path") -> Path:
    """`path` as a `Path`, after checking that it is an existing file."""
    path = Path(path)
    if path.is_dir():
        raise wrong_kind(arg, path, want_file=True)
    if not path.exists():
        raise ValueError(f"{arg}={str(path)!r} does not exist")
    return path


def folder_to_read(path: str | os.PathLike[str], arg: str = "path") -> Path:
    """`path` as a `Path`, after checking that it is an existing folder."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{arg}={str(path)!r} does not exist")
    if not path.is_dir():
        raise wrong_kind(arg, path, want_file=False)
    return path


def unreadable(arg: str, path: Path, error: OSError) -> ValueError:
    return ValueError(f"{arg}={str(path)!r} cannot be read: {error.strerror}")


def read_bytes(path: str | os.PathLike[str], arg: str = "path") -> bytes:
    """The bytes of the file at `path`; every failure is a `ValueError` naming `arg` and `path`."""
    path = file_to_read(path, arg)
    try:
        return path.read_bytes()
    except IsADirectoryError:  # became a folder since the check
        raise wrong_kind(arg, path, want_file=True) from None
    except FileNotFoundError:  # deleted since the check
        raise ValueError(f"{arg}={str(path)!r} does not exist") from None
    except OSError as error:
        raise unreadable(arg, path, error) from None
