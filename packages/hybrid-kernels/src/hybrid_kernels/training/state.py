"""`TrainingState`: everything needed to continue a run, and its atomic file format.

The file is a NumPy `.npz` archive: the array leaves of the predictors, the optimiser state and
the best snapshot (exact bytes, so a resumed run is bit-identical), plus one JSON document with
the step counters, the histories and a description of every array for validation. Non-array
leaves (activation functions, static fields) are not stored: they come from the template the
loader is given, which must have the same structure.

Writes are atomic: the archive goes to a temporary file in the same folder, is flushed to disk,
then renamed over the target, so a run killed mid-write leaves the previous file intact.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["TrainingState", "load_training_state", "save_training_state"]

_FORMAT = "hybrid_kernels.TrainingState"
_VERSION = 1
_TREES = ("predictors", "opt_state", "best_predictors")


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
    - `events`: the hook's events so far (`LossHistory.events`).
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
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _array_leaves(tree: Any) -> list[Any]:
    return [leaf for leaf in jax.tree_util.tree_leaves(tree) if eqx.is_array(leaf)]


def _key_to_host(key: Any) -> tuple[np.ndarray, str | None]:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key)), str(jax.random.key_impl(key))
    return np.asarray(key), None


def save_training_state(path: str | os.PathLike[str], state: TrainingState) -> None:
    """Write `state` to `path` atomically (temporary file, flush, rename).

    **Arguments:**

    - `path`: the target file; its folder must exist.
    - `state`: the [`TrainingState`][hybrid_kernels.TrainingState] to save.
    """
    path = Path(path)
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
        "step": state.step,
        "phase": state.phase,
        "phase_step": state.phase_step,
        "key_impl": key_impl,
        "best_loss": state.best_loss,
        "best_step": state.best_step,
        "history": state.history,
        "penalties": state.penalties,
        "val_history": [list(p) for p in state.val_history],
        "bad_steps": state.bad_steps,
        "since_best": state.since_best,
        "bad_in_row": state.bad_in_row,
        "tournament_done": state.tournament_done,
        "fingerprint": state.fingerprint,
        "phase_starts": state.phase_starts,
        "events": state.events,
        "arrays": described,
    }
    arrays["meta"] = np.asarray(json.dumps(meta))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_training_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON part of a saved state (counters, histories, fingerprint), without arrays."""
    with np.load(path, allow_pickle=False) as archive:
        if "meta" not in archive:
            raise ValueError(f"{os.fspath(path)!r} is not a saved TrainingState (no metadata)")
        meta = json.loads(str(archive["meta"]))
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a saved TrainingState")
    if meta.get("version") != _VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} has TrainingState format version {meta.get('version')}; "
            f"this hybrid_kernels reads version {_VERSION}"
        )
    return meta


def _fill(name: str, template: Any, archive: Any, described: list[dict[str, Any]]) -> Any:
    dynamic, static = eqx.partition(template, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    if len(leaves) != len(described):
        raise ValueError(
            f"saved {name} has {len(described)} arrays but the template has {len(leaves)}; "
            "resume with the same model and optimiser that saved the state"
        )
    restored = []
    for i, (ref, info) in enumerate(zip(leaves, described, strict=True)):
        if tuple(info["shape"]) != tuple(ref.shape) or info["dtype"] != str(ref.dtype):
            raise ValueError(
                f"saved {name} array {i} has shape {tuple(info['shape'])} and dtype "
                f"{info['dtype']}; the template expects {tuple(ref.shape)} and {ref.dtype}"
            )
        data = archive[f"{name}/{i}"]
        if str(data.dtype) != info["dtype"]:  # e.g. bfloat16, which .npz keeps as raw bytes
            data = data.view(ref.dtype)
        restored.append(jnp.asarray(data, dtype=ref.dtype))
    return eqx.combine(jax.tree_util.tree_unflatten(treedef, restored), static)


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

    **Raises:** `ValueError` when the file is not a saved state or the templates do not match.
    """
    meta = read_training_meta(path)
    templates = {
        "predictors": predictors,
        "opt_state": opt_state,
        "best_predictors": predictors,
    }
    with np.load(path, allow_pickle=False) as archive:
        trees = {
            name: _fill(name, templates[name], archive, meta["arrays"][name]) for name in _TREES
        }
        key_data = archive["key"]
    if meta["key_impl"] is None:
        key = jnp.asarray(key_data)
    else:
        key = jax.random.wrap_key_data(jnp.asarray(key_data), impl=meta["key_impl"])
    return TrainingState(
        predictors=trees["predictors"],
        opt_state=trees["opt_state"],
        step=int(meta["step"]),
        phase=int(meta["phase"]),
        phase_step=int(meta["phase_step"]),
        key=key,
        best_predictors=trees["best_predictors"],
        best_loss=float(meta["best_loss"]),
        best_step=int(meta["best_step"]),
        history=[float(v) for v in meta["history"]],
        penalties=[float(v) for v in meta["penalties"]],
        val_history=[(int(s), float(v)) for s, v in meta["val_history"]],
        bad_steps=[int(s) for s in meta["bad_steps"]],
        since_best=int(meta["since_best"]),
        bad_in_row=int(meta["bad_in_row"]),
        tournament_done=bool(meta["tournament_done"]),
        fingerprint=str(meta["fingerprint"]),
        phase_starts=[int(s) for s in meta["phase_starts"]],
        events=list(meta.get("events", [])),
    )
