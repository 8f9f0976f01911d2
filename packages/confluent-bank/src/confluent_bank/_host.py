"""The host-side layout of a bank's state: block names, one-read host copies, snapshots, digests.

Host decisions (proposals, commits, checkpoints) work on numpy copies of the bank's blocks read
from the device in a single transfer, never on per-element device reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

PARAMETER_NAMES: tuple[str, ...] = (
    "centers",
    "weights",
    "scales",
    "rho",
    "odd_moments",
    "directions",
    "direction_bias",
    "moment_coefficients",
)
"""The eight trainable blocks, in pytree order (the keys of `ConfluentPackBank.parameters`)."""

STATE_NAMES: tuple[str, ...] = (
    *PARAMETER_NAMES,
    "orders",
    "ages",
    "active",
    "modes",
    "slot_ids",
    "transition_version",
)
"""All fourteen state blocks, in pytree-children order."""

SERIES_TERMS = 6
SERIES_RADIUS = 0.01
SCHEMA_VERSION = 1


def read_host_state(bank: Any) -> dict[str, np.ndarray]:
    """Copy every state block of `bank` to the host with ONE `jax.device_get`.

    **Arguments:**

    - `bank`: a `ConfluentPackBank` (anything with the `STATE_NAMES` attributes).

    **Returns:** a dict `{name: numpy array}` in `STATE_NAMES` order, with the blocks' shapes and
    dtypes.
    """
    blocks = jax.device_get(tuple(getattr(bank, name) for name in STATE_NAMES))
    return {name: np.asarray(value) for name, value in zip(STATE_NAMES, blocks, strict=True)}


def representation_problems(blocks: Mapping[str, np.ndarray], *, max_order: int) -> list[str]:
    """The representation rules (spec 2.4, step 6) that `blocks` break, as short phrases.

    One rule for every reader and writer of state: checkpoint loading checks whole blocks,
    commits check the rows they write. Blocks absent from `blocks` are not checked.

    **Arguments:**

    - `blocks`: `{name: array}` for any subset of `STATE_NAMES` (whole blocks or single rows).
    - `max_order`: the bank's highest ordinary order.

    **Returns:** e.g. `["modes outside 0..2", "negative rho"]`; empty when every rule holds.
    """
    problems = []
    if "modes" in blocks and not np.all((blocks["modes"] >= 0) & (blocks["modes"] <= 2)):
        problems.append("modes outside 0..2")
    if "orders" in blocks and not np.all((blocks["orders"] >= 0) & (blocks["orders"] <= max_order)):
        problems.append(f"orders outside 0..{max_order}")
    if "rho" in blocks and not np.all(blocks["rho"] >= 0):
        problems.append("negative rho")
    for name in ("slot_ids", "ages", "transition_version"):
        if name in blocks and not np.all(blocks[name] >= 0):
            problems.append(f"negative {name}")
    if "slot_ids" in blocks and len(set(np.ravel(blocks["slot_ids"]).tolist())) != np.size(
        blocks["slot_ids"]
    ):
        problems.append("repeated slot_ids")
    return problems


def configuration(*, base: str, max_order: int, max_packs: int) -> dict[str, Any]:
    """The `"__configuration__"` entry of a portable snapshot."""
    return {
        "activation": base,
        "max_order": max_order,
        "max_packs": max_packs,
        "schema_version": SCHEMA_VERSION,
        "series_terms": SERIES_TERMS,
        "series_radius": SERIES_RADIUS,
    }


def snapshot_from_host(
    host: Mapping[str, np.ndarray], *, base: str, max_order: int
) -> dict[str, Any]:
    """Build the portable snapshot (spec 2.3) from host arrays, without touching the device.

    **Arguments:**

    - `host`: the output of `read_host_state`.
    - `base`: the bank's activation name.
    - `max_order`: the bank's highest ordinary order.

    **Returns:** `{name: {"shape", "dtype", "values"}}` for every state block plus
    `"__configuration__"`.
    """
    snapshot: dict[str, Any] = {}
    for name in STATE_NAMES:
        value = np.asarray(host[name])
        snapshot[name] = {
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "values": value.reshape(-1).tolist(),
        }
    snapshot["__configuration__"] = configuration(
        base=base, max_order=int(max_order), max_packs=int(np.shape(host["centers"])[0])
    )
    return snapshot


def snapshot_digest(snapshot: Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of a portable snapshot.

    The canonical form is `json.dumps(snapshot, sort_keys=True, separators=(",", ":"),
    allow_nan=False)` encoded as UTF-8, so the digest binds every value, dtype, the activation,
    the capacity, `max_order`, the series settings and the transition version.

    **Arguments:**

    - `snapshot`: a portable snapshot, e.g. `bank.portable_snapshot()`.

    **Returns:** a 64-character hex string.
    """
    text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
