"""Portable checkpoints: validated loading, checksummed atomic files, digests.

`bank_from_checkpoint` validates a checkpoint in the spec's order (schema, block set,
configuration, per-block shape/dtype/values, representation) and builds the bank only after
every check passed, so a bad checkpoint gives `ValueError` and never a half-loaded bank. It never
changes a dtype or a value silently: every stored value must be exactly representable in its
stored dtype.

A checkpoint *file* is the checkpoint plus `"snapshot_digest"`, the `snapshot_digest` of its
state: `load_checkpoint` recomputes it, so a changed digit or flipped bit never loads another
bank. `save_checkpoint` runs the loader's validation before writing, so every file it writes
loads back equal.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank._atomic import write_atomic
from confluent_bank._bank import ConfluentPackBank, init_confluent_bank
from confluent_bank._host import (
    PARAMETER_NAMES,
    SCHEMA_VERSION,
    STATE_NAMES,
    configuration,
    representation_problems,
    snapshot_digest,
)
from confluent_bank._paths import read_file
from confluent_bank._records import active_pairs

_TOP_LEVEL = {"schema_version", "base", "max_order", "state"}
_BLOCK_KEYS = {"shape", "dtype", "values"}
_CONFIGURATION = "__configuration__"
_DIGEST = "snapshot_digest"


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
        if ok and not all(_finite(v) for v in values):
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


def _finite(value: int | float) -> bool:
    # An integer beyond the float range (10**400) is as unstorable as inf, and math.isfinite
    # would raise OverflowError on it.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


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
    arrays, max_order, base, max_pairs = _validated(checkpoint)
    device = jax.device_put(tuple(arrays[name] for name in STATE_NAMES))
    return ConfluentPackBank(*device, max_order=max_order, base=base, max_pairs=max_pairs)


def _validated(checkpoint: Any) -> tuple[dict[str, np.ndarray], int, str, int | None]:
    """Every check of `bank_from_checkpoint`; the host arrays, `max_order`, `base` and
    `max_pairs`."""
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
    stored = state[_CONFIGURATION]
    max_pairs = stored.get("max_pairs") if isinstance(stored, Mapping) else None
    if max_pairs is not None and not _is_int(max_pairs):
        raise ValueError(f"checkpoint max_pairs must be an integer, got {max_pairs!r}")
    fresh = init_confluent_bank(
        (),
        max_packs=center_shape[0],
        max_order=max_order,
        base=base,
        dtype=float_dtype,
        max_pairs=max_pairs,
    )
    expected_configuration = configuration(
        base=fresh.base,
        max_order=fresh.max_order,
        max_packs=fresh.max_packs,
        max_pairs=fresh.max_pairs,
    )
    if stored != expected_configuration:
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

    problems = representation_problems(arrays, max_order=max_order)
    if max_pairs is not None:
        pairs = active_pairs(arrays)
        if pairs > max_pairs:
            problems.append(f"{pairs} active centred pairs above max_pairs={max_pairs}")
    if problems:
        raise ValueError(f"checkpoint representation state is invalid: {', '.join(problems)}")
    return arrays, max_order, base, max_pairs


def _reject_constant(name: str) -> float:
    raise ValueError(f"checkpoint file must not contain {name}")


def save_checkpoint(path: str | os.PathLike[str], bank: ConfluentPackBank) -> Path:
    """Write `bank.checkpoint()` and its `snapshot_digest` as JSON to `path`, atomically.

    The file is a JSON object with the checkpoint's keys plus `"snapshot_digest"`, the
    `snapshot_digest` of its state (the digest proposals are bound to), which `load_checkpoint`
    verifies. Before anything is written, the checkpoint goes through the loader's validation,
    so every file this writes loads back equal. The write is atomic (unique temporary file,
    fsync, rename, folder fsync): if anything fails, the previous file at `path` is left intact
    and the temporary file is removed. Temporaries of `path` left by earlier saves that were
    killed mid-write are deleted; one that a running save is still writing is never touched.

    A bank mid-training may hold a slightly negative spread `rho` between `retract()` calls,
    which a checkpoint cannot hold (spec 2.4, step 6). Such a bank is saved as
    `bank.retract()` (each negative spread saved as 0, a negative subnormal included): the
    forward pass reads `rho` through `retract_spread` already, so the saved bank represents
    exactly the same function (bit for bit), and `bank` itself is not changed. Only finite
    spreads are retracted; a NaN or infinite `rho` is refused like any other non-finite
    state.

    **Arguments:**

    - `path`: destination file; its folder must exist.
    - `bank`: the bank to save.

    **Returns:** the destination as a `Path`.

    **Raises:** `ValueError` for any state the loader would refuse (e.g. non-finite values),
    and, naming `path`, when `path` is a directory or its folder does not exist; other
    `OSError`s of the write (a full disk, no permission), naming `path`.
    """
    data = bank.checkpoint()
    rho = data["state"]["rho"]["values"]
    if all(_finite(value) for value in rho):
        # `retract_spread`'s where(rho >= 0, rho, 0), applied to the host values: a device
        # that flushes subnormals compares -5e-324 as -0 and keeps it, and so does retract(),
        # whose result the checkpoint's `rho >= 0` would then refuse. The forward pass reads
        # such a spread as 0 as well, so the function saved is the same.
        data["state"]["rho"]["values"] = [0.0 if value < 0 else value for value in rho]
    try:
        _validated(data)
    except ValueError as error:
        raise ValueError(
            f"save_checkpoint({os.fspath(path)!r}): this bank could not be loaded back: {error}"
        ) from None
    data[_DIGEST] = snapshot_digest(data["state"])
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return write_atomic(path, text.encode("utf-8"), arg="path")


def load_checkpoint(path: str | os.PathLike[str]) -> ConfluentPackBank:
    """Read a checkpoint file written by `save_checkpoint`, verify its digest and validate it.

    **Arguments:**

    - `path`: the file.

    Raises `ValueError` naming `path` when it is a directory, does not exist or cannot be
    read (the operating system's reason, e.g. "Permission denied"), and for a truncated,
    non-JSON, corrupted (its state does not match its `"snapshot_digest"`) or hand-edited
    invalid file (see `bank_from_checkpoint`).

    A file without `"snapshot_digest"` (written before checksums were added) is refused too,
    since nothing could tell a damaged one apart. To load such a file deliberately, validate
    it without the checksum and save it again:
    `save_checkpoint(path, bank_from_checkpoint(json.loads(Path(path).read_text())))`.
    """
    name = os.fspath(path)
    raw = read_file(path, "path")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        # UnicodeDecodeError and JSONDecodeError are ValueErrors, as is an integer literal
        # beyond Python's digit limit.
        raise ValueError(f"checkpoint file {name!r} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"checkpoint file {name!r} must hold a JSON object")
    if _DIGEST not in data:
        raise ValueError(
            f"checkpoint file {name!r} has no {_DIGEST!r}: it predates checksums or is damaged. "
            "To load it anyway, check it and use "
            "confluent_bank.bank_from_checkpoint(json.loads(text)), then save it again"
        )
    stored = data.pop(_DIGEST)
    if not isinstance(stored, str) or stored != _digest_or_none(data.get("state")):
        raise ValueError(
            f"checkpoint file {name!r} is corrupted: its state does not match its {_DIGEST!r}"
        )
    return bank_from_checkpoint(data)


def _digest_or_none(state: Any) -> str | None:
    if not isinstance(state, Mapping):
        return None
    try:
        return snapshot_digest(state)
    except (TypeError, ValueError):  # e.g. inf parsed from 1e999
        return None
