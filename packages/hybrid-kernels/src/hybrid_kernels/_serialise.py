"""Saving trained predictors, and loading them back safely.

One file holds everything: a text header line, one line of JSON metadata, the leaves as
written by `eqx.tree_serialise_leaves`, then the SHA-256 digest (32 bytes) of all that comes
before it. The metadata records a fingerprint of the pytree (its structure, static
configuration included, and every leaf's path, shape and dtype), so loading into a template
that differs in any of these raises a `ValueError` that names the difference, instead of
silently reading numbers into the wrong places. The digest is checked before anything is
read, so a truncated or altered file (even by one bit) raises a `ValueError` instead of
loading other values. Writes are atomic (`hybrid_kernels._atomic`): an interrupted save never
leaves a truncated file behind, and its temporary is deleted by the next save.

What is not saved: `simulate_fn`, `state_to_output`, the dataset, the trainable mask. Loading
needs a template: a freshly built pytree of the same architecture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from hybrid_kernels.__about__ import __version__
from hybrid_kernels._atomic import write_atomic
from hybrid_kernels._npy import check_npy_header
from hybrid_kernels._paths import read_bytes

_MAGIC = b"hybrid-kernels predictors\n"
_FORMAT = 2
_DIGEST = hashlib.sha256
_DIGEST_SIZE = _DIGEST().digest_size
# Reprs of functions held in static fields carry memory addresses that change per process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe_leaf(leaf: Any) -> dict[str, Any]:
    if eqx.is_array(leaf) or isinstance(leaf, np.generic):
        return {"shape": list(np.shape(leaf)), "dtype": np.dtype(leaf.dtype).name}
    name = getattr(leaf, "__qualname__", None) or getattr(leaf, "__name__", None)
    if callable(leaf) and isinstance(name, str):
        return {"type": type(leaf).__name__, "name": name}
    return {"type": type(leaf).__name__}


def _modules(tree: Any, prefix: str = "") -> list[dict[str, Any]]:
    """Class and static configuration of every module in `tree`, outermost first."""
    found: list[dict[str, Any]] = []
    nested = lambda x: isinstance(x, eqx.Module) and x is not tree  # noqa: E731
    nodes = (
        [("", tree)]
        if isinstance(tree, eqx.Module)
        else jtu.tree_flatten_with_path(tree, is_leaf=nested)[0]
    )
    for path, node in nodes:
        if not isinstance(node, eqx.Module):
            continue
        where = prefix + (path if isinstance(path, str) else jtu.keystr(path))
        cls = type(node)
        static, children = {}, []
        for field in dataclasses.fields(node):
            value = getattr(node, field.name, None)
            if field.metadata.get("static", False):
                static[field.name] = _ADDRESS.sub("", repr(value))
            else:
                children.append((field.name, value))
        found.append({"path": where, "class": _class_path(cls), "static": static})
        for name, value in children:
            found.extend(_modules(value, f"{where}.{name}"))
    return found


def _module_part(part: str) -> str:
    # Modules went private (`hybrid_kernels.bounded` -> `hybrid_kernels._bounded`) without the
    # classes changing; recording the path without leading underscores keeps files written
    # before and after that move comparable. A dunder name (`__main__`) is kept whole.
    if part.startswith("__") and part.endswith("__"):
        return part
    return part.lstrip("_") or part


def _class_path(cls: type) -> str:
    module = ".".join(_module_part(part) for part in cls.__module__.split("."))
    return f"{module}.{cls.__qualname__}"


def _saved_class(name: str) -> str:
    # Files written before dunder names were kept record `__main__.X` as `main__.X`.
    return "__main__." + name[len("main__.") :] if name.startswith("main__.") else name


def _script_class(saved: str, template: str) -> bool:
    """True when one side was defined in a script (`__main__`) and the class names agree."""
    s_module, _, s_name = saved.rpartition(".")
    t_module, _, t_name = template.rpartition(".")
    return s_name == t_name and "__main__" in (s_module, t_module) and s_module != t_module


def _warn_script_class(saved: str, template: str, where: str) -> None:
    warnings.warn(
        f"load_predictors: the file holds {saved} at {where} and the template has {template}; "
        "one of them was defined in a script run as __main__, so they are matched by class "
        f"name ({saved.rpartition('.')[2]}), static configuration and leaf shapes. To silence "
        "this, define the class in a module that both the saving and the loading code import.",
        UserWarning,
        stacklevel=4,
    )


def _fingerprint(predictors: Any) -> dict[str, Any]:
    leaves = jtu.tree_flatten_with_path(predictors)[0]
    return {
        "modules": _modules(predictors),
        "leaves": [{"path": jtu.keystr(path), **_describe_leaf(x)} for path, x in leaves],
    }


def _fingerprint_mismatch(saved: dict[str, Any], template: dict[str, Any]) -> str | None:
    for s, t in zip(saved["modules"], template["modules"], strict=False):
        where = t["path"] or "(root)"
        s = {**s, "class": _saved_class(s["class"])}
        if s["class"] != t["class"] and s["path"] == t["path"]:
            if _script_class(s["class"], t["class"]):
                _warn_script_class(s["class"], t["class"], where)
                s = {**s, "class": t["class"]}
            elif "__main__" in (s["class"].rpartition(".")[0], t["class"].rpartition(".")[0]):
                return (
                    f"the template has {t['class']} at {where}, but the file holds "
                    f"{s['class']} at {s['path'] or '(root)'} (a class defined in a script run "
                    "as __main__ is matched by its class name only; build the template from a "
                    f"class named {s['class'].rpartition('.')[2]})"
                )
        if s == t:
            continue
        if s["class"] != t["class"] or s["path"] != t["path"]:
            return (
                f"the template has {t['class']} at {where}, but the file holds {s['class']} "
                f"at {s['path'] or '(root)'}"
            )
        fields = sorted(set(s["static"]) | set(t["static"]))
        diffs = [
            f"{k} is {t['static'].get(k)} in the template but {s['static'].get(k)} in the file"
            for k in fields
            if s["static"].get(k) != t["static"].get(k)
        ]
        return f"{t['class'].rsplit('.', 1)[-1]} at {where}: " + "; ".join(diffs)
    if len(saved["modules"]) != len(template["modules"]):
        return (
            f"the file holds {len(saved['modules'])} modules, the template "
            f"{len(template['modules'])}"
        )
    saved_leaves, template_leaves = saved["leaves"], template["leaves"]
    for s, t in zip(saved_leaves, template_leaves, strict=False):
        if s != t:
            return (
                f"leaf {t['path'] or '(root)'} of the template is {_leaf_text(t)}, but the file "
                f"holds {_leaf_text(s)} at {s['path'] or '(root)'}"
            )
    if len(saved_leaves) != len(template_leaves):
        return f"the file holds {len(saved_leaves)} leaves, the template {len(template_leaves)}"
    return None


def _leaf_text(leaf: dict[str, Any]) -> str:
    if "shape" in leaf:
        return f"an array of shape {tuple(leaf['shape'])} and dtype {leaf['dtype']}"
    if "name" in leaf:
        return f"the callable {leaf['name']}"
    return f"a Python {leaf['type']}"


def save_predictors(
    path: str | os.PathLike[str],
    predictors: Any,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write `predictors` (any pytree of modules and arrays) to one file, atomically.

    **Arguments:**

    - `path`: destination file; its parent directory must exist. An existing file is replaced.
    - `predictors`: the pytree to save.
    - `metadata`: optional JSON-serialisable mapping stored beside the leaves (for example the
      solver's `to_dict()` or a loss history); read back with `read_predictors_metadata`.

    **Returns:** the path written.

    The file ends with a checksum of its contents, verified on load. It is written to a
    temporary file unique to this call (`.<name>.<random>.tmp` in the same folder) and renamed
    over `path`, so concurrent saves never mix; temporaries of `path` left by a killed save
    are deleted by the next save to `path`.

    **Raises:** `ValueError` naming `path` when it is a directory or its folder does not
    exist; `TypeError` when `metadata` is not JSON-serialisable.
    """
    path = Path(path)
    try:
        user = json.loads(json.dumps(dict(metadata or {}), allow_nan=True))
    except TypeError as err:
        raise TypeError(f"metadata must be JSON-serialisable: {err}") from None
    header = {
        "format": _FORMAT,
        "hybrid_kernels": __version__,
        "jax": jax.__version__,
        "equinox": eqx.__version__,
        "fingerprint": _fingerprint(predictors),
        "metadata": user,
    }
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, predictors)
    blob = _MAGIC + json.dumps(header).encode() + b"\n" + buffer.getvalue()
    return write_atomic(path, blob + _DIGEST(blob).digest())


def _valid_header(header: dict[str, Any]) -> bool:
    fingerprint = header.get("fingerprint")
    return (
        isinstance(header.get("metadata"), dict)
        and isinstance(fingerprint, dict)
        and all(isinstance(fingerprint.get(k), list) for k in ("modules", "leaves"))
    )


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], bytes]:
    """The header and leaf bytes of the file at `path`, after checking its digest."""
    data = read_bytes(path)
    if not data.startswith(_MAGIC):
        raise ValueError(f"{str(path)!r} is not a file written by save_predictors")
    head, sep, rest = data[len(_MAGIC) :].partition(b"\n")
    try:
        header = json.loads(head) if sep else None
    except ValueError:  # not JSON, or not UTF-8
        header = None
    if not isinstance(header, dict) or "fingerprint" not in header:
        raise ValueError(f"{str(path)!r} has a damaged header")
    if header.get("format") != _FORMAT:
        raise ValueError(
            f"{str(path)!r} uses file format {header.get('format')!r}; this version of "
            f"hybrid_kernels reads format {_FORMAT}"
        )
    body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
    if len(rest) < _DIGEST_SIZE or _DIGEST(body).digest() != digest:
        raise ValueError(
            f"{str(path)!r} is damaged: its checksum does not match its contents (the file "
            "was truncated or altered after it was saved)"
        )
    if not _valid_header(header):
        raise ValueError(f"{str(path)!r} has a damaged header")
    return header, rest[:-_DIGEST_SIZE]


def read_predictors_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `metadata` mapping given to `save_predictors` for the file at `path`.

    Raises `ValueError` naming `path` when it does not exist, is a directory or cannot be
    read, and when the file is not a predictors file or fails its checksum.
    """
    return _read(path)[0]["metadata"]


def _checked_leaf(f: Any, like: Any) -> Any:
    """`eqx.default_deserialise_filter_spec`, after checking the stored array's header."""
    if eqx.is_array(like) or isinstance(like, (np.generic, bool, int, float, complex)):
        start = f.tell()
        check_npy_header(f, shape=np.shape(like), dtype=None, what="a leaf")
        f.seek(start)
    return eqx.default_deserialise_filter_spec(f, like)


def load_predictors(path: str | os.PathLike[str], template: Any) -> Any:
    """Read predictors saved by `save_predictors`, into the shape of `template`.

    **Arguments:**

    - `path`: the file.
    - `template`: a pytree built the same way as the saved one (same classes, static
      configuration, leaf shapes and dtypes); its array values are ignored and not modified.

    **Returns:** a new pytree like `template` holding the saved values.

    Raises `ValueError` naming `path` when it does not exist, is a directory or cannot be
    read; when the file is not a predictors file, fails its checksum (it was
    truncated or altered), or when the template does not match what was saved (the message
    names the first differing leaf or the structure).

    A class defined in a script (recorded as `__main__.Name`) matches a template class of the
    same name from any module, and the other way round, with a `UserWarning` that names both;
    a different class name raises, naming the class the file holds.
    """
    header, leaves = _read(path)
    try:
        mismatch = _fingerprint_mismatch(header["fingerprint"], _fingerprint(template))
    except (KeyError, TypeError, AttributeError):  # a well-formed but crafted header
        raise ValueError(f"{str(path)!r} has a damaged header") from None
    if mismatch is not None:
        raise ValueError(
            f"template does not match the predictors saved in {str(path)!r}: {mismatch}"
        )
    stream = io.BytesIO(leaves)
    try:
        loaded = eqx.tree_deserialise_leaves(stream, template, filter_spec=_checked_leaf)
    except Exception as err:  # whatever the leaf bytes hold, the caller gets a ValueError
        cause = err
        while cause.__cause__ is not None:  # equinox wraps the error with the leaf's path
            cause = cause.__cause__
        leaf = getattr(err, "path", None)
        at = f" at leaf {jtu.keystr(leaf)}" if isinstance(leaf, tuple) else ""
        raise ValueError(
            f"{str(path)!r} holds leaf data that does not match its header{at}: {cause}"
        ) from None
    if stream.read(1):
        raise ValueError(f"{str(path)!r} holds more leaf data than the template reads")
    return loaded
