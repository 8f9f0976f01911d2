"""Portable checkpoints: validated loading, atomic files, digests.

`bank_from_checkpoint` validates a checkpoint in the spec's order (schema, block set,
configuration, per-block shape/dtype/values, representation) and builds the bank only after
every check passed, so a bad checkpoint gives `ValueError` and never a half-loaded bank. It never
changes a dtype or a value silently: every stored value must be exactly representable in its
stored dtype.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank._host import (
    PARAMETER_NAMES,
    SCHEMA_VERSION,
    STATE_NAMES,
    configuration,
    snapshot_digest,
)
from confluent_bank.bank import ConfluentPackBank, init_confluent_bank

__all__ = ["bank_from_checkpoint", "load_checkpoint", "save_checkpoint", "snapshot_digest"]

_TOP_LEVEL = {"schema_version", "base", "max_order", "state"}
_BLOCK_KEYS = {"shape", "dtype", "values"}
_CONFIGURATION = "__configuration__"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _block(state: Mapping[str, Any], name: str) -> tuple[tuple[int, ...], str, list[Any]]:
    item = state[name]
    if not isinstance(item, Mapping) or set(item) != _BLOCK_KEYS:
        raise ValueError(f"checkpoint block {name} must be a mapping with shape, dtype and values")
    shape, dtype, values = item["shape"], item["dtype"], item["values"]
    if not isinstance(shape, list | tuple) or not all(_is_int(n) and n >= 0 for n in shape):
        raise ValueError(f"checkpoint shape/dtype not supported for {name}: bad shape {shape!r}")
    if not isinstance(dtype, str):
        raise ValueError(f"checkpoint shape/dtype not supported for {name}: bad dtype {dtype!r}")
    if not isinstance(values, list | tuple):
        raise ValueError(f"checkpoint values for {name} must be a list")
    return tuple(shape), dtype, list(values)


# The only dtype names a snapshot can hold. Anything else is rejected before numpy parses it:
# numpy's dtype parser accepts (and chokes on) far more, e.g. "f8,", which raises SyntaxError.
_DTYPE_NAMES = frozenset(
    {"bool", "bfloat16", "float16", "float32", "float64", "complex64", "complex128"}
    | {f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)}
)


def _dtype(name: str, dtype: str) -> np.dtype:
    if not isinstance(dtype, str) or dtype not in _DTYPE_NAMES:
        raise ValueError(
            f"checkpoint shape/dtype not supported for {name}: unknown dtype {dtype!r}"
        )
    parsed = jnp.dtype(dtype)
    if str(parsed) != dtype or jax.dtypes.canonicalize_dtype(parsed) != parsed:
        # e.g. float64 while x64 is disabled: loading would silently truncate.
        raise ValueError(
            f"checkpoint shape/dtype not supported for {name}: dtype {dtype!r} cannot be "
            "reproduced in this JAX configuration"
        )
    return parsed


def _values(name: str, values: list[Any], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    expected = math.prod(shape)
    if len(values) != expected:
        raise ValueError(
            f"checkpoint values for {name} have length {len(values)}, expected {expected} for "
            f"shape {list(shape)}"
        )
    if dtype == np.bool_:
        ok = all(isinstance(v, bool) for v in values)
    elif jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        ok = all(_is_int(v) and info.min <= v <= info.max for v in values)
    else:
        ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if ok and not all(math.isfinite(v) for v in values):
            raise ValueError(f"checkpoint state must be finite ({name})")
    if not ok:
        raise ValueError(f"checkpoint values for {name} must be numbers of dtype {dtype}")
    try:
        array = np.asarray(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError):
        raise ValueError(f"checkpoint values for {name} cannot be stored as {dtype}") from None
    readback = array.astype(np.float64) if jnp.issubdtype(dtype, jnp.floating) else array
    if readback.reshape(-1).tolist() != values:
        raise ValueError(f"checkpoint values for {name} are not exactly representable as {dtype}")
    return array


def bank_from_checkpoint(checkpoint: Mapping[str, Any]) -> ConfluentPackBank:
    """Validate a portable checkpoint and build its bank (host; never silently changes a dtype).

    **Arguments:**

    - `checkpoint`: `{"schema_version": 1, "base", "max_order", "state"}` as produced by
      `ConfluentPackBank.checkpoint()` (or parsed from its JSON).

    Raises `ValueError` for anything that is not exactly a valid checkpoint: non-mapping input,
    an unknown schema, missing or unknown keys or blocks, a configuration that disagrees with
    the state ("configuration"), a wrong shape, dtype, value count or value type, non-finite
    values, or invalid representation metadata ("representation").
    """
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"checkpoint must be a mapping, got {type(checkpoint).__name__}")
    schema = checkpoint.get("schema_version")
    if not _is_int(schema) or schema != SCHEMA_VERSION:
        raise ValueError(f"unsupported checkpoint schema {schema!r}; expected 1")
    state = checkpoint.get("state")
    if not isinstance(state, Mapping) or set(state) != {*STATE_NAMES, _CONFIGURATION}:
        raise ValueError("checkpoint contains missing or unknown state blocks")
    if set(checkpoint) != _TOP_LEVEL:
        raise ValueError(f"checkpoint must have exactly the keys {sorted(_TOP_LEVEL)}")
    base, max_order = checkpoint["base"], checkpoint["max_order"]
    if not isinstance(base, str) or not _is_int(max_order):
        raise ValueError("checkpoint base must be a string and max_order an integer")

    blocks = {name: _block(state, name) for name in STATE_NAMES}
    center_shape, center_dtype, center_values = blocks["centers"]
    if len(center_shape) != 1 or center_shape[0] != len(center_values):
        raise ValueError(
            "checkpoint shape/dtype not supported for centers: expected shape [P] with P values"
        )
    # The capacity and order are checked against the stored data before anything is allocated,
    # so a hand-edited shape or max_order cannot request a huge empty bank.
    if center_shape[0] * (max_order + 1) != len(blocks["moment_coefficients"][2]):
        raise ValueError(
            "checkpoint configuration disagrees with its bound state: moment_coefficients does "
            f"not hold max_packs x (max_order + 1) = {center_shape[0]} x {max_order + 1} values"
        )
    float_dtype = _dtype("centers", center_dtype)
    if not jnp.issubdtype(float_dtype, jnp.floating):
        raise ValueError("checkpoint trainables must share a real floating dtype")
    fresh = init_confluent_bank(
        (), max_packs=center_shape[0], max_order=max_order, base=base, dtype=float_dtype
    )
    expected_configuration = configuration(
        base=fresh.base, max_order=fresh.max_order, max_packs=fresh.max_packs
    )
    if state[_CONFIGURATION] != expected_configuration:
        raise ValueError("checkpoint configuration disagrees with its bound state")

    arrays: dict[str, np.ndarray] = {}
    for name in STATE_NAMES:
        shape, dtype_name, values = blocks[name]
        dtype = _dtype(name, dtype_name)
        if shape != tuple(getattr(fresh, name).shape):
            raise ValueError(
                f"checkpoint shape/dtype not supported for {name}: shape {list(shape)}, "
                f"expected {list(getattr(fresh, name).shape)}"
            )
        if name in PARAMETER_NAMES:
            if not jnp.issubdtype(dtype, jnp.floating) or dtype != float_dtype:
                raise ValueError(
                    f"checkpoint trainables must share a real floating dtype ({name} is "
                    f"{dtype}, centers is {float_dtype})"
                )
        elif name == "active":
            if dtype != np.bool_:
                raise ValueError(f"checkpoint activity flags must be boolean, got {dtype}")
        elif not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(f"checkpoint representation metadata must be integer ({name})")
        arrays[name] = _values(name, values, dtype, shape)

    problems = []
    if not np.all((arrays["modes"] >= 0) & (arrays["modes"] <= 2)):
        problems.append("modes outside 0..2")
    if not np.all((arrays["orders"] >= 0) & (arrays["orders"] <= max_order)):
        problems.append(f"orders outside 0..{max_order}")
    if not np.all(arrays["rho"] >= 0):
        problems.append("negative rho")
    for name in ("slot_ids", "ages", "transition_version"):
        if not np.all(arrays[name] >= 0):
            problems.append(f"negative {name}")
    if len(set(arrays["slot_ids"].tolist())) != arrays["slot_ids"].shape[0]:
        problems.append("repeated slot_ids")
    if problems:
        raise ValueError(f"checkpoint representation state is invalid: {', '.join(problems)}")
    device = jax.device_put(tuple(arrays[name] for name in STATE_NAMES))
    return ConfluentPackBank(*device, max_order=max_order, base=base)


def _reject_constant(name: str) -> float:
    raise ValueError(f"checkpoint file must not contain {name}")


def save_checkpoint(path: str | os.PathLike[str], bank: ConfluentPackBank) -> Path:
    """Write `bank.checkpoint()` as JSON to `path` atomically (temp file, fsync, rename).

    If anything fails, the previous file at `path` is left intact and the temp file is removed.

    **Arguments:**

    - `path`: destination file.
    - `bank`: the bank to save.

    **Returns:** the destination as a `Path`.
    """
    target = Path(path)
    text = json.dumps(bank.checkpoint(), sort_keys=True, separators=(",", ":"), allow_nan=False)
    descriptor, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)
    return target


def _fsync_directory(directory: Path) -> None:
    # Makes the rename durable; not every platform can open a directory.
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def load_checkpoint(path: str | os.PathLike[str]) -> ConfluentPackBank:
    """Read a checkpoint file written by `save_checkpoint` and validate it.

    **Arguments:**

    - `path`: the file.

    Raises `ValueError` for a truncated, non-JSON or hand-edited invalid file (see
    `bank_from_checkpoint`).
    """
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"checkpoint file {os.fspath(path)!r} is not JSON: {error}") from None
    return bank_from_checkpoint(data)
