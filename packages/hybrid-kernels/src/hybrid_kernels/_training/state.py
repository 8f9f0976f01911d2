"""`TrainingState`: everything needed to continue a run, and its atomic file format.

The file is a NumPy `.npz` archive: the array leaves of the predictors, the optimiser state and
the best snapshot (exact bytes, so a resumed run is bit-identical), one JSON document with the
step counters, the histories (every field of `TrainingState` that is not an array tree or the
key) and a description of every array, plus a SHA-256 checksum of all the other members.
Non-array leaves (activation functions, static fields) are not stored: they come from the
template the loader is given, which must have the same structure.

Loading checks the checksum before it interprets anything, so a truncated, altered or foreign
file raises `ValueError`; and it checks every array's stored shape and dtype against the
template before reading its data, so a file declaring a huge array allocates nothing.

Writes are atomic (`hybrid_kernels._atomic`): the archive goes to a temporary file unique to the
call, is flushed to disk, then renamed over the target, so a run killed mid-write leaves the
previous file intact and threads saving at once never mix their bytes. The next save deletes
temporaries of the same target left by killed saves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from hybrid_kernels._atomic import write_atomic
from hybrid_kernels._npy import read_npy
from hybrid_kernels._paths import read_bytes

_FORMAT = "hybrid_kernels.TrainingState"
_VERSION = 2
_TREES = ("predictors", "opt_state", "best_predictors")
_CHECKSUM = "checksum.npy"


def _floats(values: Any) -> list[float]:
    return [float(v) for v in values]


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _identity(value: Any) -> Any:
    return value


def _failed(value: Any) -> dict[int, tuple[str, ...]]:
    # JSON turns the int step keys into strings and the id tuples into lists.
    return {int(step): tuple(str(i) for i in ids) for step, ids in value.items()}


# How each stored field comes back from JSON; a field not listed comes back as JSON gave it.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "failed": _failed,
    "step": int,
    "phase": int,
    "phase_step": int,
    "best_loss": float,
    "best_step": int,
    "history": _floats,
    "penalties": _floats,
    "val_history": lambda pairs: [(int(s), float(v)) for s, v in pairs],
    "bad_steps": _ints,
    "since_best": int,
    "bad_in_row": int,
    "tournament_done": bool,
    "fingerprint": str,
    "phase_starts": _ints,
}


@dataclasses.dataclass
class TrainingState:
    """A snapshot of a run between two steps.

    **Arguments:**

    - `predictors`, `opt_state`: the parameters and optimiser state the next step starts from.
    - `step`: steps completed so far, over all phases.
    - `phase`, `phase_step`: the phase the next step belongs to, and the steps it has done.
    - `key`: the run's root key.
    - `best_predictors`, `best_loss`, `best_step`: the best snapshot so far (`best_step` is
        -1 before the first finite step).
    - `history`, `penalties`: per-step data loss and penalty.
    - `val_history`: `(step, score)` pairs of the validation runs.
    - `bad_steps`: the global indices of steps that were skipped as non-finite.
    - `since_best`: the patience counter; `bad_in_row`: the current run of skipped steps.
    - `tournament_done`: whether the tournament already ran (it does not run again on resume).
    - `fingerprint`: the settings of the run that saved this state; a resume must match.
    - `phase_starts`: the step index at which each phase so far began.
    - `failed`: step → the `exp_id`s whose solve failed at that step (`throw=False`).
    - `events`: the hook's events so far (`LossHistory.events`).
    - `hook_state`: what the hook's `state_dict()` returned (JSON), or `None` for a hook
        without `state_dict`/`load_state_dict`; a resume hands it to `load_state_dict`.
    """

    predictors: Any
    opt_state: Any
    step: int
    phase: int
    phase_step: int
    key: Any
    best_predictors: Any
    best_loss: float
    best_step: int
    history: list[float]
    penalties: list[float]
    val_history: list[tuple[int, float]]
    bad_steps: list[int]
    since_best: int = 0
    bad_in_row: int = 0
    tournament_done: bool = False
    fingerprint: str = ""
    phase_starts: list[int] = dataclasses.field(default_factory=list)
    failed: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hook_state: dict[str, Any] | None = None


def _array_leaves(tree: Any) -> list[Any]:
    return [leaf for leaf in jax.tree_util.tree_leaves(tree) if eqx.is_array(leaf)]


def _key_to_host(key: Any) -> tuple[np.ndarray, str | None]:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key)), str(jax.random.key_impl(key))
    return np.asarray(key), None


def _stored_fields() -> list[dataclasses.Field[Any]]:
    """The fields kept in the JSON document: all but the array trees and the key."""
    return [f for f in dataclasses.fields(TrainingState) if f.name not in (*_TREES, "key")]


def _digest(members: Mapping[str, bytes]) -> str:
    """SHA-256 over every member's name and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(members):
        h.update(name.encode() + b"\0" + len(members[name]).to_bytes(8, "little"))
        h.update(members[name])
    return h.hexdigest()


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def save_training_state(path: str | os.PathLike[str], state: TrainingState) -> None:
    """Write `state` to `path` atomically (unique temporary file, fsync, rename).

    **Arguments:**

    - `path`: the target file; its folder must exist.
    - `state`: the [`TrainingState`][hybrid_kernels.TrainingState] to save.

    The file carries a checksum of its contents, verified on load. Concurrent saves to one
    `path` (threads or processes) never mix: each writes its own temporary
    (`.<name>.<random>.tmp` in the same folder) and the last rename wins. Temporaries of
    `path` left behind by a killed save are deleted by the next save to `path`.

    **Raises:** `ValueError` naming `path` when it is a directory or its folder does not exist.
    """
    arrays: dict[str, np.ndarray] = {}
    described: dict[str, list[dict[str, Any]]] = {}
    for name in _TREES:
        host = jax.device_get(_array_leaves(getattr(state, name)))
        described[name] = []
        for i, leaf in enumerate(host):
            leaf = np.asarray(leaf)
            arrays[f"{name}/{i}"] = leaf
            described[name].append({"shape": list(leaf.shape), "dtype": str(leaf.dtype)})
    key_data, key_impl = _key_to_host(state.key)
    arrays["key"] = key_data
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "key_impl": key_impl,
        "arrays": described,
        **{f.name: getattr(state, f.name) for f in _stored_fields()},
    }
    arrays["meta"] = np.asarray(json.dumps(meta))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with zipfile.ZipFile(buffer, "a") as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
        archive.writestr(_CHECKSUM, _npy_bytes(np.asarray(_digest(members))))
    write_atomic(path, buffer.getvalue())


def _damaged(path: str | os.PathLike[str], why: str) -> ValueError:
    return ValueError(f"{os.fspath(path)!r} is not a readable saved TrainingState: {why}")


def _read_members(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every member of the archive at `path`, after checking the checksum."""
    data = read_bytes(path)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
                raise ValueError("compressed members")  # ours never are: no decompression bombs
            members = {info.filename: archive.read(info) for info in infos}
            if len(members) != len(infos):
                raise ValueError("duplicate members")
    except Exception as err:  # zipfile reports damage in many ways; all of them mean the same
        raise _damaged(path, f"it is truncated, damaged or not a .npz archive ({err})") from None
    if "meta.npy" not in members:
        raise ValueError(f"{os.fspath(path)!r} is not a saved TrainingState (no metadata)")
    if _CHECKSUM not in members:
        raise _damaged(path, "it has no checksum (written by an older version?)")
    stored = members.pop(_CHECKSUM)
    try:
        expected = str(read_npy(stored, shape=(), dtype=np.dtype("<U64"), what="the checksum"))
    except ValueError as err:
        raise _damaged(path, str(err)) from None
    if _digest(members) != expected:
        raise _damaged(
            path, "its checksum does not match its contents (truncated or altered after saving)"
        )
    return members


def _parse_meta(path: str | os.PathLike[str], members: Mapping[str, bytes]) -> dict[str, Any]:
    try:
        text = read_npy(members["meta.npy"], shape=(), dtype=None, what="the metadata")
        meta = json.loads(str(text)) if text.dtype.kind == "U" else None
    except ValueError:  # unreadable header, or not JSON
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a saved TrainingState")
    if meta.get("version") != _VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} has TrainingState format version {meta.get('version')}; "
            f"this hybrid_kernels reads version {_VERSION}"
        )
    return meta


def read_training_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON part of a saved state (counters, histories, fingerprint), without arrays.

    The whole file's checksum is verified first.
    """
    return _parse_meta(path, _read_members(path))


def _fill(
    name: str, template: Any, members: Mapping[str, bytes], described: Any, where: str
) -> Any:
    dynamic, static = eqx.partition(template, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    if not isinstance(described, list) or not all(isinstance(d, dict) for d in described):
        raise _damaged(where, f"its metadata does not describe the {name} arrays")
    if len(leaves) != len(described):
        raise ValueError(
            f"saved {name} has {len(described)} arrays but the template has {len(leaves)}; "
            "resume with the same model and optimiser that saved the state"
        )
    restored = []
    for i, (ref, info) in enumerate(zip(leaves, described, strict=True)):
        if info != {"shape": list(ref.shape), "dtype": str(ref.dtype)}:
            shape = info.get("shape")
            raise ValueError(
                f"saved {name} array {i} has shape "
                f"{tuple(shape) if isinstance(shape, list) else shape} and dtype "
                f"{info.get('dtype')}; the template expects {tuple(ref.shape)} and {ref.dtype}"
            )
        if f"{name}/{i}.npy" not in members:
            raise _damaged(where, f"the archive lacks {name} array {i}")
        # The stored header, not only the metadata, is checked before any data is read.
        data = read_npy(
            members[f"{name}/{i}.npy"],
            shape=tuple(ref.shape),
            dtype=np.dtype(ref.dtype),
            what=f"saved {name} array {i} in {where!r}",
        )
        restored.append(jnp.asarray(data, dtype=ref.dtype))
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, restored), static)


def _key(meta: Mapping[str, Any], members: Mapping[str, bytes], where: str) -> Any:
    try:
        data = jnp.asarray(
            read_npy(members["key.npy"], shape=None, dtype=np.dtype("uint32"), what="its key")
        )
        if meta.get("key_impl") is None:
            return data
        return jax.random.wrap_key_data(data, impl=meta["key_impl"])
    except (KeyError, TypeError, ValueError) as err:
        raise _damaged(where, f"its key is unreadable ({err})") from None


def load_training_state(
    path: str | os.PathLike[str], *, predictors: Any, opt_state: Any
) -> TrainingState:
    """Read a state saved by [`save_training_state`][hybrid_kernels.save_training_state].

    **Arguments:**

    - `path`: the file.
    - `predictors`, `opt_state`: templates with the structure, shapes and dtypes of the saved
        trees (for example the initial predictors and a fresh optimiser state); their
        non-array leaves are reused.

    **Returns:** the [`TrainingState`][hybrid_kernels.TrainingState].

    **Raises:** `ValueError` naming `path` when it does not exist, is a directory or cannot be
    read; when the file is not a saved state, is truncated or damaged (its
    checksum does not match), or the templates do not match; every stored array's shape and
    dtype is checked against the templates before its data is read.
    """
    members = _read_members(path)
    meta = _parse_meta(path, members)
    templates = {"predictors": predictors, "opt_state": opt_state, "best_predictors": predictors}
    described = meta.get("arrays")
    if not isinstance(described, dict):
        raise _damaged(path, "its metadata has no array descriptions")
    trees = {
        name: _fill(name, templates[name], members, described.get(name), os.fspath(path))
        for name in _TREES
    }
    fields = _decoded_fields(path, meta)
    return TrainingState(**trees, key=_key(meta, members, os.fspath(path)), **fields)


def _decoded_fields(path: str | os.PathLike[str], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The stored fields of `TrainingState` (all but the arrays and the key), decoded; a
    field saved by an older version that lacks it is left out, to take its default."""
    fields: dict[str, Any] = {}
    for field in _stored_fields():
        if field.name in meta:
            try:
                fields[field.name] = _DECODE.get(field.name, _identity)(meta[field.name])
            except (TypeError, ValueError):
                raise _damaged(path, f"its {field.name} is malformed") from None
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise _damaged(path, f"its metadata lacks {field.name}")
    return fields


def read_training_state_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The counters and histories of the state saved at `path`, without templates.

    The counterpart of [`hybrid_kernels.read_predictors_metadata`][] for
    [`hybrid_kernels.save_training_state`][] files (and checkpoints `train_with_optax` writes):
    what [`hybrid_kernels.load_training_state`][] would put in every `TrainingState` field
    except the array trees (`predictors`, `opt_state`, `best_predictors`) and the `key`, e.g.
    `step`, `phase`, `phase_step`, `best_loss`, `best_step`, `history` and `fingerprint`,
    with the same types. No array data is read, but the whole file's checksum is verified.

    **Raises:** `ValueError` naming `path` when the file is not a saved `TrainingState`, was
    written by another format version, or is truncated or altered.
    """
    return _decoded_fields(path, read_training_meta(path))
