"""Host records: slot modes and transition kinds, one atom's description and JSON-portable
transition proposals."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import operator
from typing import Any

import numpy as np

from confluent_bank._host import PARAMETER_NAMES

_PROPOSAL_SCHEMA_VERSION = 1


class SlotMode(enum.IntEnum):
    """What a slot of a bank holds: the values of the `modes` block.

    An `IntEnum`, so `bank.modes == SlotMode.PAIR` works on arrays and the stored integers
    (and hence checkpoints) are the plain values 0, 1 and 2.
    """

    ORDINARY = 0
    """An ordinary atom `w · s^n · σ^(n)(s(z − c))` of order `n = orders[i]`."""
    PAIR = 1
    """A centred pair (collision slot) with spread `ρ`, `m0 = weights`, `m1 = odd_moments`."""
    MOMENTS = 2
    """A truncated moment expansion with the row `moment_coefficients[i, :orders[i] + 1]`."""


def active_pairs(host: Any) -> int:
    """How many slots of a host state (`{name: numpy array}`) are active centred pairs: what
    a bank's `max_pairs` bounds."""
    return int(np.sum(host["active"] & (host["modes"] == SlotMode.PAIR)))


class TransitionKind(enum.StrEnum):
    """The built-in transition kinds: the `kind` of the proposals the `propose_*` rules make.

    A `StrEnum`, so `proposal.kind == "centered_pair"` and
    `proposal.kind == TransitionKind.CENTERED_PAIR` both hold; proposals store the plain string,
    and any other string is a custom kind (checked for structure only, judged by the caller's
    acceptance callback).
    """

    CENTERED_PAIR = "centered_pair"
    DUPLICATE_MERGE = "duplicate_merge"
    CLUSTER_TO_MOMENTS = "cluster_to_moments"
    PAIR_TO_DERIVATIVE = "pair_to_derivative"
    REMOVE_ZERO = "remove_zero"
    ZERO_OUTPUT_BIRTH = "zero_output_birth"


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        # Floats holding an integer (e.g. 2.0) are accepted, anything else is not.
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            as_float = float(value)
            if math.isfinite(as_float) and as_float == int(as_float):
                return int(as_float)
        raise TypeError(f"{what} must be an integer, got {value!r}")
    return int(value)


def as_index(value: Any, argument: str, what: str = "an integer") -> int:
    """`value` as a Python int when it is an integer type (not a bool, not a float holding an
    integer); `TypeError` "`argument` must be `what`, got ..." otherwise."""
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{argument} must be {what}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argument} must be {what}, got {value!r}") from None


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class RefinedPack:
    """One ordinary atom `weight · scale^order · σ^(order)(scale · (x − center))`.

    **Arguments:**

    - `order`: derivative order `n ≥ 0` of the activation.
    - `center`: finite centre `c`.
    - `weight`: finite output coefficient `w` (default 0).
    - `scale`: finite, non-zero input slope `s` (default 1).
    - `age`: non-negative bookkeeping counter (default 0).

    Values are coerced: `order`/`age` to `int`, the rest to `float`. Invalid values raise
    `ValueError` (wrong types raise `TypeError`).
    """

    order: int
    center: float
    weight: float = 0.0
    scale: float = 1.0
    age: int = 0

    def __post_init__(self) -> None:
        order = _as_int(self.order, "RefinedPack order")
        center = _as_float(self.center, "RefinedPack center")
        weight = _as_float(self.weight, "RefinedPack weight")
        scale = _as_float(self.scale, "RefinedPack scale")
        age = _as_int(self.age, "RefinedPack age")
        if order < 0:
            raise ValueError(f"RefinedPack order must be >= 0, got {order}")
        if not math.isfinite(center) or not math.isfinite(weight):
            raise ValueError("RefinedPack center and weight must be finite")
        if not math.isfinite(scale) or scale == 0:
            raise ValueError(f"RefinedPack scale must be finite and non-zero, got {scale}")
        if age < 0:
            raise ValueError(f"RefinedPack age must be >= 0, got {age}")
        for name, value in (
            ("order", order),
            ("center", center),
            ("weight", weight),
            ("scale", scale),
            ("age", age),
        ):
            object.__setattr__(self, name, value)


# The widest dtypes a bank holds: a value outside them cannot be stored in any bank, so it is
# refused when the update (or a proposal's JSON) is built; the bank's own, possibly narrower
# dtype is checked again when the proposal is committed.
_INT64 = np.iinfo(np.int64)


def _check_value(name: str, index: int, value: Any) -> float | int | tuple[float | int, ...]:
    if isinstance(value, list | tuple):
        field = f"{name}[{index}]"
        return tuple(_check_scalar(f"{field}[{k}]", name, item) for k, item in enumerate(value))
    return _check_scalar(f"{name}[{index}]", name, value)


def _check_scalar(field: str, name: str, value: Any) -> float | int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        integer = int(value)
        if name in PARAMETER_NAMES:
            if not _fits_float64(integer):
                raise ValueError(
                    f"SlotUpdate {field}: value {_short(integer)} does not fit float64 "
                    "(it overflows to inf)"
                )
        elif not _INT64.min <= integer <= _INT64.max:
            raise ValueError(f"SlotUpdate {field}: value {_short(integer)} does not fit int64")
        return integer
    if isinstance(value, numbers.Real):
        as_float = float(value)
        if not math.isfinite(as_float):
            # JSON's 1e400 arrives here already parsed to inf.
            raise ValueError(f"SlotUpdate {field}: value must be finite, got {as_float}")
        return as_float
    raise TypeError(
        f"SlotUpdate {field}: value must be a number or a tuple of numbers, got {value!r}"
    )


def _fits_float64(integer: int) -> bool:
    try:
        return math.isfinite(float(integer))
    except OverflowError:
        return False


def _as_int64(value: Any, what: str) -> int:
    """`_as_int`, refusing integers outside int64 (the widest integer a bank stores)."""
    integer = _as_int(value, what)
    if not _INT64.min <= integer <= _INT64.max:
        raise ValueError(f"{what} {_short(integer)} does not fit int64")
    return integer


def _short(integer: int) -> str:
    # A 400-digit literal would bury the message.
    text = str(integer)
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} digits)"


@dataclasses.dataclass(frozen=True)
class SlotUpdate:
    """Set row `index` (a slot position) of state block `name` to `value`.

    **Arguments:**

    - `name`: a state block name (see `STATE_NAMES`).
    - `index`: the slot position.
    - `value`: a finite number, or a tuple of finite numbers for a moment row. Python types are
      kept (`1.0` stays a float, `2` stays an int); a list becomes a tuple.

    Raises `ValueError`, naming `name[index]`, for a value that no bank could store: a
    non-finite float, an integer beyond float64's range for a trainable block, or beyond
    int64 for any other block (the bank's own dtype is checked again at commit), and for an
    index beyond int64. Wrong types raise `TypeError`.
    """

    name: str
    index: int
    value: float | int | tuple[float | int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"SlotUpdate name must be a string, got {self.name!r}")
        index = _as_int64(self.index, f"SlotUpdate {self.name} index")
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "value", _check_value(self.name, index, self.value))


_PROPOSAL_FIELDS = (
    "source_digest",
    "source_version",
    "slot_ids",
    "updates",
    "kind",
    "coordinate_identity",
    "error_budget",
    "schema_version",
)


@dataclasses.dataclass(frozen=True)
class TransitionProposal:
    """A host-side, JSON-portable description of one bank transition.

    **Arguments:**

    - `source_digest`: `snapshot_digest` of the bank the proposal was computed from.
    - `source_version`: that bank's `transition_version`.
    - `slot_ids`: stable ids of the affected slots (distinct).
    - `updates`: the `SlotUpdate`s to apply, in order.
    - `kind`: a `TransitionKind` (e.g. `"centered_pair"`, `"cluster_to_moments"`) or any other
      string for a custom kind; stored as a plain `str`.
    - `coordinate_identity`: why the change is exact, or what must bound its error.
    - `error_budget`: the declared, finite, non-negative tolerance (default 0).
    - `schema_version`: must be 1.

    Raises `ValueError` for a negative or non-finite (NaN, inf) `error_budget`, an unknown
    `schema_version`, repeated slot ids, or a `source_version` or slot id beyond int64 (the
    widest integer a bank stores), naming the field.
    """

    source_digest: str
    source_version: int
    slot_ids: tuple[int, ...]
    updates: tuple[SlotUpdate, ...]
    kind: str
    coordinate_identity: str
    error_budget: float = 0.0
    schema_version: int = _PROPOSAL_SCHEMA_VERSION

    def __post_init__(self) -> None:
        for name in ("source_digest", "kind", "coordinate_identity"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"TransitionProposal {name} must be a string")
        version = _as_int64(self.source_version, "TransitionProposal source_version")
        schema = _as_int(self.schema_version, "TransitionProposal schema_version")
        budget = _as_float(self.error_budget, "TransitionProposal error_budget")
        if isinstance(self.slot_ids, str | bytes) or not isinstance(self.slot_ids, list | tuple):
            raise TypeError("TransitionProposal slot_ids must be a sequence of integers")
        slot_ids = tuple(_as_int64(i, "TransitionProposal slot id") for i in self.slot_ids)
        if not isinstance(self.updates, list | tuple) or not all(
            isinstance(update, SlotUpdate) for update in self.updates
        ):
            raise TypeError("TransitionProposal updates must be a sequence of SlotUpdate")
        if math.isnan(budget) or budget < 0 or math.isinf(budget):
            raise ValueError(
                f"error_budget must be a finite non-negative number, got {self.error_budget!r}"
            )
        if schema != _PROPOSAL_SCHEMA_VERSION:
            raise ValueError(f"unsupported proposal schema_version {schema}; expected 1")
        if len(set(slot_ids)) != len(slot_ids):
            raise ValueError(f"proposal slot_ids must be distinct, got {slot_ids}")
        # A plain str: JSON, equality and error messages read the same for enum and string kinds.
        object.__setattr__(self, "kind", str(self.kind))
        object.__setattr__(self, "source_version", version)
        object.__setattr__(self, "schema_version", schema)
        object.__setattr__(self, "error_budget", budget)
        object.__setattr__(self, "slot_ids", slot_ids)
        object.__setattr__(self, "updates", tuple(self.updates))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, compact separators, NaN/inf forbidden."""
        return json.dumps(
            dataclasses.asdict(self), sort_keys=True, separators=(",", ":"), allow_nan=False
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> TransitionProposal:
        """Parse `to_json` output, re-running every construction check.

        Raises `ValueError` for malformed JSON, a wrong field set, or a value that does not fit
        the widest dtype of its field, naming the field: `1e400` (parsed as inf) or a
        400-digit integer for `weights` (float64), an integer beyond int64 for `orders`,
        `source_version` or a slot id. The bank's own dtype is checked again at commit.
        """
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"proposal JSON could not be parsed: {error}") from None
        if not isinstance(data, dict) or set(data) != set(_PROPOSAL_FIELDS):
            raise ValueError(f"proposal JSON must be an object with exactly {_PROPOSAL_FIELDS}")
        raw_updates = data["updates"]
        if not isinstance(raw_updates, list) or not all(
            isinstance(item, dict) and set(item) == {"name", "index", "value"}
            for item in raw_updates
        ):
            raise ValueError("proposal updates must be objects with name, index and value")
        if not isinstance(data["slot_ids"], list):
            raise ValueError("proposal slot_ids must be a list")
        try:
            updates = tuple(SlotUpdate(**item) for item in raw_updates)
            return cls(**{**data, "slot_ids": tuple(data["slot_ids"]), "updates": updates})
        except TypeError as error:
            raise ValueError(f"proposal JSON has a field of the wrong type: {error}") from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"proposal JSON must not contain {name}")
