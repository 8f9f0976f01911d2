"""The one rule for paths the user names: a wrong kind, a missing folder or file and an
unreadable file are `ValueError`s that name the argument and the path.

Every public function of confluent-bank that takes a path (`save_checkpoint`,
`load_checkpoint`) goes through `target_file` (a file about to be written) or `read_file`
(a file to read). hybrid-kernels applies the same rule with the same sentences, so a user
reads one wording for both packages:

- wrong kind: `path='x' is a directory; expected a file`;
- missing folder of a file to write: `path='a/b.json': the folder 'a' does not exist` (also
  when `a` is a file: no folder of that name exists);
- missing file to read: `path='x' does not exist`;
- unreadable file: `path='x' cannot be read: Permission denied` (the operating system's
  reason).

Other failures of a write (a full disk, a folder the user may not write to) stay `OSError`s
and are raised by the writer, naming the path; see `_atomic`.
"""

from __future__ import annotations

import os
from pathlib import Path

# Messages show `Path(path)`, as hybrid-kernels does, so both packages print a path alike.


def _is_a_directory(arg: str, path: Path) -> ValueError:
    return ValueError(f"{arg}={str(path)!r} is a directory; expected a file")


def _missing_folder(arg: str, path: Path) -> ValueError:
    return ValueError(f"{arg}={str(path)!r}: the folder {str(path.parent)!r} does not exist")


def target_file(path: str | os.PathLike[str], arg: str) -> Path:
    """`path` as a `Path`, after checking that a file can be written there.

    **Arguments:**

    - `path`: the file to write (it may or may not exist yet).
    - `arg`: the name of the user's argument, for the message.

    **Raises:** `ValueError` naming `arg` and `path` when `path` is a directory or its folder
    does not exist.
    """
    target = Path(path)
    if target.is_dir():
        raise _is_a_directory(arg, target)
    if not target.parent.is_dir():
        raise _missing_folder(arg, target)
    return target


def read_file(path: str | os.PathLike[str], arg: str) -> bytes:
    """The bytes of the file at `path`.

    The file is opened first and the failure explained afterwards, so a file that vanishes
    between a check and the read cannot slip through as a bare `OSError`.

    **Arguments:**

    - `path`: the file to read.
    - `arg`: the name of the user's argument, for the message.

    **Raises:** `ValueError` naming `arg` and `path` when `path` is a directory, does not
    exist (nor does its folder), or cannot be read (the message carries the operating
    system's reason, e.g. "Permission denied").
    """
    source = Path(path)
    try:
        return source.read_bytes()
    except IsADirectoryError:
        raise _is_a_directory(arg, source) from None
    except (FileNotFoundError, NotADirectoryError):
        # NotADirectoryError: a component of the path is a file ('bank.json/x').
        raise ValueError(f"{arg}={str(source)!r} does not exist") from None
    except OSError as os_error:
        reason = os_error.strerror or str(os_error)
        if source.is_dir():  # e.g. Windows reports a folder as "Permission denied"
            raise _is_a_directory(arg, source) from None
        raise ValueError(f"{arg}={str(source)!r} cannot be read: {reason}") from None
