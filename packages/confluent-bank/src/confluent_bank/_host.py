"""The host-side layout of a bank's state: block names, one host view per transaction,
snapshots, digests.

Host decisions (proposals, commits, error bounds, checkpoints) work on numpy copies of the
bank's blocks read from the device in a single transfer, never on per-element device reads.
A transaction (`transaction(bank)`, opened by `commit_transition` and by the transition hook)
reads the bank at most once (on first use) and digests it at most once; every
`HostView.read(bank)` of the same bank object inside it (the proposal rules, the staleness
check, the acceptance callback's error bounds, the optimizer-state carry) gets that one view.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
from fractions import Fraction
from functools import cached_property
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


@dataclasses.dataclass(frozen=True, eq=False)
class HostView:
    """One host copy of a bank's state, its static configuration and (lazily) its digest.

    **Fields:** `base`, `max_order`, `source` (the bank object it reads; a transaction hands
    this view to every reader of that same object), and `max_pairs` (`None` when every slot
    may hold a pair). `host` (`{name: numpy array}` in `STATE_NAMES` order) is read from the
    device on first use, once.
    """

    base: str
    max_order: int
    source: Any = dataclasses.field(repr=False, default=None)
    max_pairs: int | None = None

    @classmethod
    def read(cls, bank: Any) -> HostView:
        """The open transaction's view of `bank`, or a fresh one (one device read, on first
        use of `host`)."""
        active = _ACTIVE.get()
        if active is not None and active.source is bank:
            return active
        max_pairs = getattr(bank, "max_pairs", None)
        return cls(str(bank.base), int(bank.max_order), bank, max_pairs)

    @cached_property
    def host(self) -> dict[str, np.ndarray]:
        """Every state block as a numpy array. Read lazily: a transition hook opens a
        transaction on every bank after every step, and most steps propose nothing, so an
        eager read would synchronise with the device (and copy every block) for nothing."""
        return read_host_state(self.source)

    @property
    def max_packs(self) -> int:
        return int(self.host["centers"].shape[0])

    @property
    def version(self) -> int:
        return int(self.host["transition_version"])

    @cached_property
    def digest(self) -> str:
        """`snapshot_digest` of the bank's portable snapshot, computed once per view."""
        return snapshot_digest(
            snapshot_from_host(
                self.host, base=self.base, max_order=self.max_order, max_pairs=self.max_pairs
            )
        )

    def exact(self, name: str, slot: int) -> Fraction:
        """`name[slot]` as the exact binary rational of its float value."""
        return Fraction(float(self.host[name][slot]))

    def slot_id(self, slot: int) -> int:
        return int(self.host["slot_ids"][slot])

    def positions(self, slot_ids: tuple[int, ...]) -> tuple[int, ...]:
        """The slot positions of stable `slot_ids`; `ValueError` for an id the bank lacks."""
        ids = [int(i) for i in self.host["slot_ids"]]
        unknown = [i for i in slot_ids if i not in ids]
        if unknown:
            raise ValueError(f"proposal contains unknown stable slot IDs {unknown}; bank has {ids}")
        return tuple(ids.index(i) for i in slot_ids)


_ACTIVE: contextvars.ContextVar[HostView | None] = contextvars.ContextVar(
    "confluent_bank_host_view", default=None
)


@contextlib.contextmanager
def transaction(bank: Any) -> Iterator[HostView]:
    """Open one host transaction on `bank`: read and digest it at most once for everything
    inside (on first use).

    Re-entrant: inside a transaction on the same bank object the open view is reused. The view
    is bound to the object, not its values, so a bank built inside (a candidate) is read anew.
    """
    view = HostView.read(bank)
    token = _ACTIVE.set(view)
    try:
        yield view
    finally:
        _ACTIVE.reset(token)


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


def configuration(
    *, base: str, max_order: int, max_packs: int, max_pairs: int | None = None
) -> dict[str, Any]:
    """The `"__configuration__"` entry of a portable snapshot.

    `"max_pairs"` is written only for a bank built with a pair capacity, so the snapshots and
    digests of every other bank are those of the banks before the capacity existed.
    """
    entry: dict[str, Any] = {
        "activation": base,
        "max_order": max_order,
        "max_packs": max_packs,
        "schema_version": SCHEMA_VERSION,
        "series_terms": SERIES_TERMS,
        "series_radius": SERIES_RADIUS,
    }
    if max_pairs is not None:
        entry["max_pairs"] = max_pairs
    return entry


def snapshot_from_host(
    host: Mapping[str, np.ndarray], *, base: str, max_order: int, max_pairs: int | None = None
) -> dict[str, Any]:
    """Build the portable snapshot (spec 2.3) from host arrays, without touching the device.

    **Arguments:**

    - `host`: the output of `read_host_state`.
    - `base`: the bank's activation name.
    - `max_order`: the bank's highest ordinary order.
    - `max_pairs`: the bank's pair capacity (`None`: every slot).

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
        base=base,
        max_order=int(max_order),
        max_packs=int(np.shape(host["centers"])[0]),
        max_pairs=max_pairs,
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
