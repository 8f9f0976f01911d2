"""Run directories: everything a modeller keeps to reproduce or resume a fit, in one folder.

```
run/
  run.json              format, version, package versions, solver, config, history, leaves,
                        the SHA-256 of each other file
  predictors.eqx        save_predictors
  training_state.npz    save_training_state (only when a state was given)
```

The folder is written beside its destination under a temporary name and renamed into place,
so an interrupted save leaves either the previous run or none, never half of one; the next
save to the same path removes what a killed save left behind (`hybrid_kernels._atomic`).
`run.json` ends with a SHA-256 of its other contents, and the two files carry their own
checksums, so a changed digit anywhere is refused on load instead of loading another run.
`run.json` also records the SHA-256 of each other file, so a file copied in from another run,
or a `run.json` from another run, is refused naming the file (`_run_files`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from hybrid_kernels.__about__ import __version__
from hybrid_kernels._atomic import (
    _fsync_folder,
    _single_writer,
    exchange,
    release,
    remove_stale_folders,
    set_aside,
    staging_folder,
    write_atomic,
)
from hybrid_kernels._paths import folder_to_read, folder_to_write, read_bytes
from hybrid_kernels._serialise import load_predictors, save_predictors
from hybrid_kernels._solver import SolverConfig
from hybrid_kernels._trainable import count_trainable_params, path_str
from hybrid_kernels._training._run_files import MANIFEST, check_bound, file_digests
from hybrid_kernels._training._run_json import (
    config_field,
    from_json,
    history_from_json,
    history_to_json,
    rebuild_config,
    to_json,
)
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.history import LossHistory
from hybrid_kernels._training.state import TrainingState, load_training_state, save_training_state

_FORMAT = "hybrid_kernels.run"
_VERSION = 2  # 2: run.json binds the other files by their digests
_READS = (1, 2)  # version 1 loads with a warning: its files cannot be checked (`_run_files`)
_MANIFEST = MANIFEST
_PREDICTORS = "predictors.eqx"
_STATE = "training_state.npz"


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """What [`load_run`][hybrid_kernels.load_run] reads back from a run directory.

    **Attributes:**

    - `predictors`: the trained predictors, in the shape of the template.
    - `solver`: the [`SolverConfig`][hybrid_kernels.SolverConfig].
    - `config`: the [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig], rebuilt when
        every field is plain data; `None` when it held callables (a loss, a penalty, a ready
        optimiser), which a file cannot hold: rebuild it in code and compare with `config_fields`.
    - `config_fields`: the configuration as saved, field by field (callables by name).
    - `history`: the [`LossHistory`][hybrid_kernels.LossHistory], every attribute restored.
    - `state`: the saved [`TrainingState`][hybrid_kernels.TrainingState] (with the optimiser
        state) when there is one and an `opt_state` template was given; else `None`.
    - `metadata`: package versions, the per-leaf descriptions and the user's metadata.
    """

    predictors: Any
    solver: SolverConfig
    config: OptaxTrainingConfig | None
    config_fields: dict[str, Any]
    history: LossHistory
    state: TrainingState | None
    metadata: dict[str, Any]


def _versions() -> dict[str, str]:
    found = {"hybrid_kernels": __version__, "python": platform.python_version()}
    for dist in ("jax", "jaxlib", "equinox", "optax", "diffrax", "numpy"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def _describe_leaves(predictors: Any, trainable: Any) -> list[dict[str, Any]]:
    leaves = jtu.tree_flatten_with_path(predictors)[0]
    flags = [None] * len(leaves) if trainable is None else jax.tree.leaves(trainable)
    described = []
    for (path, leaf), train in zip(leaves, flags, strict=True):
        entry: dict[str, Any] = {"path": path_str(path)}
        if eqx.is_array(leaf):
            entry |= {"shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        else:
            entry["type"] = type(leaf).__name__
        if train is not None:
            entry["trainable"] = bool(train)
        described.append(entry)
    return described


def save_run(
    path: str | os.PathLike[str],
    predictors: Any,
    *,
    solver: SolverConfig,
    config: OptaxTrainingConfig,
    history: LossHistory | None = None,
    state: TrainingState | None = None,
    trainable: Any = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a run directory: predictors, solver, config, history, optimiser state, metadata.

    **Arguments:**

    - `path`: the directory to create; its parent folder must exist.
    - `predictors`: the trained predictors (saved with
        [`save_predictors`][hybrid_kernels.save_predictors]).
    - `solver`: the [`SolverConfig`][hybrid_kernels.SolverConfig] of the fit.
    - `config`: the [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig] of the fit.
    - `history`: the [`LossHistory`][hybrid_kernels.LossHistory] `train_with_optax` returned;
        every attribute that is JSON data is kept, so new ones need no change here.
    - `state`: a [`TrainingState`][hybrid_kernels.TrainingState] holding the optimiser state
        (for example read back from `config.checkpoint_path`), saved with
        [`save_training_state`][hybrid_kernels.save_training_state] for a later resume.
    - `trainable`: the mask of the fit; recorded per leaf and as a parameter count.
    - `metadata`: extra JSON-serialisable information (a dataset name, a seed...).
    - `overwrite`: replace an existing run directory at `path` (never another folder).

    **Returns:** the path written.

    A save killed part-way leaves a locked-then-abandoned temporary folder beside `path`; the
    next save to `path` removes it (or, when the kill came between setting the old run aside
    and moving the new one in, puts the old run back first).

    **Raises:** `ValueError` naming `path` when it is a file (a directory is expected), when
    its parent folder does not exist, when it exists without `overwrite`, or when it is a
    directory that is not a run; `TypeError` for a wrong argument type or metadata that is
    not JSON data.
    """
    path = Path(path)
    if not isinstance(solver, SolverConfig):
        raise TypeError(f"save_run: solver must be a SolverConfig; got {type(solver).__name__}")
    if not isinstance(config, OptaxTrainingConfig):
        raise TypeError(
            f"save_run: config must be an OptaxTrainingConfig; got {type(config).__name__}"
        )
    if state is not None and not isinstance(state, TrainingState):
        raise TypeError(f"save_run: state must be a TrainingState; got {type(state).__name__}")
    try:
        user = to_json(dict(metadata or {}))
    except TypeError as err:
        raise TypeError(f"save_run: metadata must be JSON data: {err}") from None
    history = LossHistory() if history is None else history
    manifest = {
        "format": _FORMAT,
        "version": _VERSION,
        "versions": _versions(),
        "solver": solver.to_dict(),
        "config": {
            f.name: config_field(getattr(config, f.name)) for f in dataclasses.fields(config)
        },
        "config_fingerprint": config.fingerprint(),
        "history": history_to_json(history),
        "leaves": _describe_leaves(predictors, trainable),
        "n_trainable_params": (
            None if trainable is None else count_trainable_params(predictors, trainable)
        ),
        "files": {"predictors": _PREDICTORS, "state": None if state is None else _STATE},
        "metadata": user,
    }
    # With several processes only process 0 writes the folder (its nested saves write
    # directly); the others wait until it is complete. The folder checks run there too, so a
    # slow process cannot find the run process 0 has just written and refuse to overwrite it.
    return _single_writer(
        path, lambda: _write_run(path, predictors, state, manifest, overwrite=overwrite)
    )


def _write_run(
    path: Path, predictors: Any, state: TrainingState | None, manifest: dict, *, overwrite: bool
) -> Path:
    folder_to_write(path)
    remove_stale_folders(path)
    if path.exists():
        if not overwrite:
            raise ValueError(f"save_run: {str(path)!r} exists; pass overwrite=True to replace it")
        if not (path / _MANIFEST).is_file():
            raise ValueError(
                f"save_run: {str(path)!r} exists and is not a run directory; refusing to replace it"
            )
    lock, staging = staging_folder(path)
    try:
        save_predictors(staging / _PREDICTORS, predictors)
        if state is not None:
            save_training_state(staging / _STATE, state)
        names = [name for name in manifest["files"].values() if name is not None]
        manifest = {**manifest, "digests": file_digests(staging, names)}
        body = json.dumps({**manifest, "checksum": _checksum(manifest)}, indent=1)
        write_atomic(staging / _MANIFEST, body.encode())
        _swap_into_place(staging, path)
        _fsync_folder(path.parent)  # makes the swap itself durable
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        release(lock)
    return path


def _swap_into_place(staging: Path, path: Path) -> None:
    # A directory cannot be renamed over a non-empty one: move the old run aside first, so at
    # every moment `path` is either the old complete run or the new one.
    if not path.exists():
        os.replace(staging, path)
        return
    if exchange(staging, path):  # one step: `path` is never missing
        shutil.rmtree(staging, ignore_errors=True)  # now the old run
        return
    lock, old = set_aside(path)
    try:
        try:
            os.replace(staging, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        release(lock)


def _checksum(manifest: Mapping[str, Any]) -> str:
    # Over a canonical dump, so the file's own indentation does not matter.
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _read_manifest(path: Path) -> dict[str, Any]:
    if not (path / _MANIFEST).exists():
        raise ValueError(f"load_run: {str(path)!r} holds no {_MANIFEST}; not a run")
    try:
        manifest = json.loads(read_bytes(path / _MANIFEST))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"load_run: {str(path / _MANIFEST)!r} is damaged: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise ValueError(f"load_run: {str(path / _MANIFEST)!r} is not a run manifest")
    if manifest.get("version") not in _READS:
        raise ValueError(
            f"load_run: {str(path)!r} has run format version {manifest.get('version')!r}; "
            f"this hybrid_kernels reads versions {list(_READS)}"
        )
    stored = manifest.pop("checksum", None)
    if stored != _checksum(manifest):
        raise ValueError(
            f"load_run: {str(path / _MANIFEST)!r} is damaged: its checksum does not match its "
            "contents (altered or truncated after saving)"
        )
    missing = [k for k in ("solver", "config", "history", "leaves", "files") if k not in manifest]
    if missing:
        raise ValueError(f"load_run: {str(path / _MANIFEST)!r} lacks {missing}")
    for name in manifest["files"].values():
        if name is not None and not (path / name).is_file():
            raise ValueError(f"load_run: {str(path)!r} lacks its file {name!r}")
    check_bound(path, manifest, legacy=manifest["version"] == 1)
    return manifest


def load_run(path: str | os.PathLike[str], template: Any, *, opt_state: Any = None) -> SavedRun:
    """Read a run directory written by [`save_run`][hybrid_kernels.save_run].

    **Arguments:**

    - `path`: the run directory.
    - `template`: predictors built the same way as the saved ones (as for
        [`load_predictors`][hybrid_kernels.load_predictors]).
    - `opt_state`: a template of the optimiser state (for example
        `optimizer.init(eqx.filter(template, trainable))`); needed to read a saved training
        state, which is skipped without it.

    **Returns:** a [`SavedRun`][hybrid_kernels.SavedRun].

    **Raises:** `ValueError` when `path` does not exist or is a file (the message names
    `path`), is not a run directory, has another format version, lacks a file, holds a file
    that does not belong to its `run.json` (copied from another run; the message names it),
    or does not match the templates. A run saved by hybrid_kernels before files were bound
    to `run.json` loads with a `RuntimeWarning`.
    """
    path = folder_to_read(path)
    manifest = _read_manifest(path)
    predictors = load_predictors(path / manifest["files"]["predictors"], template)
    state = None
    if manifest["files"]["state"] is not None and opt_state is not None:
        state = load_training_state(
            path / manifest["files"]["state"], predictors=template, opt_state=opt_state
        )
    try:
        solver = SolverConfig.from_dict(manifest["solver"])
        config = rebuild_config(manifest["config"])
        history = history_from_json(manifest["history"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"load_run: {str(path / _MANIFEST)!r} is damaged: {err!r}") from None
    metadata = {
        "versions": manifest.get("versions", {}),
        "leaves": manifest["leaves"],
        "n_trainable_params": manifest.get("n_trainable_params"),
        "config_fingerprint": manifest.get("config_fingerprint"),
        "user": from_json(manifest.get("metadata", {})),
    }
    return SavedRun(
        predictors=predictors,
        solver=solver,
        config=config,
        config_fields=from_json(manifest["config"]),
        history=history,
        state=state,
        metadata=metadata,
    )
