"""Run manifests as JSON: plain data with tuples tagged, histories and configurations.

`save_run` writes these into `run.json` and `load_run` reads them back; see `run_dir`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax

from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.history import LossHistory

_TUPLE = "__tuple__"  # JSON has no tuples; a tagged list brings them back as tuples


def to_json(value: Any) -> Any:
    """Plain data with tuples tagged; raises `TypeError` for anything else."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic | np.ndarray | jax.Array) and np.ndim(value) == 0:
        return np.asarray(value).item()
    if isinstance(value, tuple):
        return {_TUPLE: [to_json(v) for v in value]}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: to_json(v) for k, v in value.items()}
    raise TypeError(f"{type(value).__name__} is not JSON data")


def from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(from_json(v) for v in value[_TUPLE])
        return {k: from_json(v) for k, v in value.items()}
    return value


def history_to_json(history: LossHistory) -> dict[str, Any]:
    # Every attribute, generically: a field added to LossHistory later round-trips unchanged.
    attributes, skipped = {}, []
    for name, value in vars(history).items():
        try:
            attributes[name] = to_json(value)
        except TypeError:
            skipped.append(name)
    if skipped:
        warnings.warn(
            f"save_run: history attribute(s) {skipped} are not JSON data (numbers, strings, "
            "lists, tuples, dicts) and were not saved",
            RuntimeWarning,
            stacklevel=3,
        )
    return {"values": [float(v) for v in history], "attributes": attributes}


def history_from_json(data: dict[str, Any]) -> LossHistory:
    history = LossHistory(data["values"])
    for name, value in data["attributes"].items():
        setattr(history, name, from_json(value))
    return history


def config_field(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [config_field(v) for v in value]}
    if isinstance(value, optax.GradientTransformation):
        return {"callable": "optax.GradientTransformation"}
    if callable(value):
        return {"callable": getattr(value, "__qualname__", type(value).__name__)}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "shape"):
        return {"array": np.asarray(value).tolist()}
    return to_json(value)


def has_callable(value: Any) -> bool:
    if isinstance(value, dict):
        return "callable" in value or any(has_callable(v) for v in value.values())
    if isinstance(value, list):
        return any(has_callable(v) for v in value)
    return False


def rebuild_field(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"array"}:
        return np.asarray(value["array"])
    if isinstance(value, dict) and set(value) == {_TUPLE}:
        return tuple(rebuild_field(v) for v in value[_TUPLE])
    return value


def rebuild_config(fields: dict[str, Any]) -> OptaxTrainingConfig | None:
    if has_callable(fields):
        return None
    return OptaxTrainingConfig(**{k: rebuild_field(v) for k, v in fields.items()})
