"""Transition proposals: host rules that turn a bank into a `TransitionProposal`.

Every proposal takes one host view of the bank (`HostView.read`: one device read, or the open
transaction's view) and then works on host numbers: float values are read as their exact
binary rationals (`fractions.Fraction`), combined exactly and rounded to float once. The bank
is duck-typed (`max_packs`, `max_order`, `base` and the state blocks);
`ConfluentPackBank.propose_*` delegate here, and `_verify` reruns the same rules to check a
proposal at commit time.

Naming trap kept from the reference: the error texts call the input slope (the `scales`
block) the "weight"; the `weights` block holds output coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_bank._host import HostView
from confluent_bank._moments import initialize_moments
from confluent_bank._records import (
    RefinedPack,
    SlotMode,
    SlotUpdate,
    TransitionKind,
    TransitionProposal,
    as_index,
)

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

_PAIR_IDENTITY = "exact_real_coordinate_identity_with_recorded_float_operands"


class _Transition(NamedTuple):
    """What a rule gives for one bank: the slot positions, the updates, the kind and why."""

    slots: tuple[int, ...]
    updates: tuple[SlotUpdate, ...]
    kind: TransitionKind
    identity: str


def _describe(view: HostView, slot: int) -> str:
    return (
        f"slot {slot} has active={bool(view.host['active'][slot])}, "
        f"mode={int(view.host['modes'][slot])}, order={int(view.host['orders'][slot])}"
    )


def _is_ordinary_order_zero(view: HostView, slot: int) -> bool:
    return (
        bool(view.host["active"][slot])
        and int(view.host["modes"][slot]) == SlotMode.ORDINARY
        and int(view.host["orders"][slot]) == 0
    )


def _proposal(view: HostView, transition: _Transition, error_budget: Any) -> TransitionProposal:
    return TransitionProposal(
        view.digest,
        view.version,
        tuple(view.slot_id(i) for i in transition.slots),
        transition.updates,
        transition.kind,
        transition.identity,
        error_budget,
    )


def _position(value: Any, argument: str, what: str = "an integer slot position") -> int:
    return as_index(value, argument, what)


def _check_slot(bank: Any, slot: Any) -> int:
    position = _position(slot, "slot")
    if not 0 <= position < bank.max_packs:
        raise ValueError(f"slot is outside the bank: got {position}, capacity is {bank.max_packs}")
    return position


# ---------------------------------------------------------------------------------------------
# Pair


def _pair_proposal(
    view: HostView, first: int, second: int, error_budget: Any
) -> TransitionProposal:
    """The centred-pair proposal on host numbers (shared with `detect_transitions`)."""
    return _proposal(view, _pair(view, first, second), error_budget)


def _pair(view: HostView, first: int, second: int) -> _Transition:
    """The centred-pair rule on host numbers."""
    for i in (first, second):
        if not _is_ordinary_order_zero(view, i):
            raise ValueError(
                "pair proposal requires ordinary order-zero live slots; " + _describe(view, i)
            )
    scale = view.exact("scales", first)
    if scale != view.exact("scales", second) or scale == 0:
        raise ValueError(
            "bias confluence requires identical nonzero weights (the input slopes in block "
            f"'scales'); slots {first} and {second} have scales "
            f"{float(scale)!r} and {float(view.exact('scales', second))!r}"
        )
    b = [-scale * view.exact("centers", i) for i in (first, second)]
    a = [view.exact("weights", i) for i in (first, second)]
    half = abs(b[0] - b[1]) / 2
    mean = (b[0] + b[1]) / 2
    odd = (b[0] - b[1]) * (a[0] - a[1]) / 2
    values: tuple[tuple[str, int, Fraction | int], ...] = (
        ("centers", first, -mean / scale),
        ("weights", first, a[0] + a[1]),
        ("rho", first, half * half),
        ("odd_moments", first, odd),
        ("modes", first, SlotMode.PAIR),
        ("directions", first, 0),
        ("direction_bias", first, 1),
        ("active", second, 0),
        ("weights", second, 0),
        ("odd_moments", second, 0),
    )
    # Fraction -> float is correctly rounded: each stored value is rounded exactly once.
    updates = tuple(SlotUpdate(name, i, float(v)) for name, i, v in values)
    kind = TransitionKind.DUPLICATE_MERGE if half == 0 else TransitionKind.CENTERED_PAIR
    return _Transition((first, second), updates, kind, _PAIR_IDENTITY)


def propose_pair(
    bank: ConfluentPackBank, first: int, second: int, *, error_budget: float = 0.0
) -> TransitionProposal:
    """Two ordinary order-0 atoms with one common input slope → one centred-pair slot.

    With common scale `s`, centres `c₁, c₂` and weights `a₁, a₂` (all read as exact
    rationals), `b_j = −s c_j`, `h = |b₁ − b₂|/2`, `mean = (b₁ + b₂)/2` and
    `odd = (b₁ − b₂)(a₁ − a₂)/2`. Slot `first` becomes a mode-1 slot with centre `−mean/s`,
    `m0 = a₁ + a₂`, `ρ = h²` and `m1 = odd`; slot `second` is switched off. The function is
    unchanged in real arithmetic; the four stored values are each rounded once.

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `first`, `second`: distinct slot positions of active, ordinary, order-0 slots.
    - `error_budget`: declared tolerance (exact rule, so 0 by default).

    **Returns:** a `TransitionProposal` of kind `"centered_pair"` (or `"duplicate_merge"`
    when the centres coincide).

    **Raises:** `ValueError` for equal or out-of-range slots ("two distinct live slots"),
    a slot that is not active, ordinary and order 0, or scales that differ or are zero.
    """
    first = _position(first, "first")
    second = _position(second, "second")
    if first == second or any(not 0 <= i < bank.max_packs for i in (first, second)):
        raise ValueError(
            f"two distinct live slots required: got first={first}, second={second} for a bank "
            f"of {bank.max_packs} slots"
        )
    return _pair_proposal(HostView.read(bank), first, second, error_budget)


# ---------------------------------------------------------------------------------------------
# Cluster, derivative, removal, birth


def propose_cluster(
    bank: ConfluentPackBank, slots: Sequence[int], *, order: int, error_budget: float
) -> TransitionProposal:
    """Ordinary order-0 atoms with one common input slope → one truncated moment slot.

    With common scale `s` and the exact mean centre `c̄`, the moment row is
    `m_k = Σ_j a_j (−s(c_j − c̄))^k / k!` for `k = 0..order` (exact, rounded once), padded
    with zeros to `max_order + 1`. The first slot becomes a mode-2 slot centred at
    `float(c̄)`; the others are switched off. This truncates a Taylor series: bound the
    remainder with `cluster_remainder` and compare it with `error_budget` in the acceptance
    callback.

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `slots`: non-empty, distinct slot positions (the first one keeps the cluster).
    - `order`: truncation order, `0 ≤ order ≤ max_order`.
    - `error_budget`: the declared tolerance the acceptance callback will check.

    **Returns:** a `TransitionProposal` of kind `"cluster_to_moments"`.

    **Raises:** `ValueError` for empty, repeated or out-of-range slots or an order outside
    `0..max_order`; a zero common scale; a slot that is not an active ordinary order-0 atom
    with exactly the first slot's scale.
    """
    if not isinstance(slots, Sequence) or isinstance(slots, str):
        raise TypeError(f"slots must be a sequence of slot positions, got {slots!r}")
    positions = tuple(_position(i, "slots") for i in slots)
    order = _position(order, "order", "an integer")
    if (
        not positions
        or len(set(positions)) != len(positions)
        or not 0 <= order <= bank.max_order
        or any(not 0 <= i < bank.max_packs for i in positions)
    ):
        raise ValueError(
            "valid distinct slots and an order within the bank budget required: got slots "
            f"{positions} and order {order} for a bank of {bank.max_packs} slots and "
            f"max_order {bank.max_order}"
        )
    view = HostView.read(bank)
    return _proposal(view, _cluster(view, positions, order), error_budget)


def _cluster(view: HostView, positions: tuple[int, ...], order: int) -> _Transition:
    """The cluster rule on host numbers (positions distinct and in range, order in range)."""
    first = positions[0]
    scale = view.exact("scales", first)
    if scale == 0:
        raise ValueError(f"nonzero common weight required: slot {first} has scale 0")
    for i in positions:
        if not _is_ordinary_order_zero(view, i) or view.exact("scales", i) != scale:
            raise ValueError(
                "cluster requires ordinary order-zero atoms with a common weight; "
                f"{_describe(view, i)}, scale={float(view.exact('scales', i))!r} (first slot's "
                f"scale {float(scale)!r})"
            )
    centers = [view.exact("centers", i) for i in positions]
    center = sum(centers, Fraction()) / len(positions)
    moments = initialize_moments(
        tuple(-scale * c for c in centers),
        tuple(float(view.host["weights"][i]) for i in positions),
        center=-scale * center,
        order=order,
    )
    row = tuple(moments.moments) + (0.0,) * (view.max_order - order)
    updates = [
        SlotUpdate("centers", first, float(center)),
        SlotUpdate("modes", first, SlotMode.MOMENTS),
        SlotUpdate("orders", first, order),
        SlotUpdate("moment_coefficients", first, row),
    ]
    for i in positions[1:]:
        updates.extend((SlotUpdate("active", i, 0), SlotUpdate("weights", i, 0)))
    return _Transition(
        positions,
        tuple(updates),
        TransitionKind.CLUSTER_TO_MOMENTS,
        "finite-spread truncation with explicit remainder",
    )


def propose_derivative(
    bank: ConfluentPackBank, slot: int, *, error_budget: float
) -> TransitionProposal:
    """A centred pair → its limit atom `m0 σ(u) + m1 η σ'(u)` (sets `ρ = 0`).

    Not exact: the value changes by `O(ρ)`, bounded by `pair_derivative_error`; the
    acceptance callback must compare that bound with `error_budget`.

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `slot`: position of an active mode-1 slot.
    - `error_budget`: the declared tolerance the acceptance callback will check.

    **Returns:** a `TransitionProposal` of kind `"pair_to_derivative"`.

    **Raises:** `ValueError` for a slot outside the bank or one that is not a live
    centred pair.
    """
    slot = _check_slot(bank, slot)
    view = HostView.read(bank)
    return _proposal(view, _derivative(view, slot), error_budget)


def _derivative(view: HostView, slot: int) -> _Transition:
    if not bool(view.host["active"][slot]) or int(view.host["modes"][slot]) != SlotMode.PAIR:
        raise ValueError("a live centered-pair slot is required; " + _describe(view, slot))
    return _Transition(
        (slot,),
        (SlotUpdate("rho", slot, 0.0),),
        TransitionKind.PAIR_TO_DERIVATIVE,
        "limit_atom; finite-spread error requires acceptance",
    )


def propose_remove_zero(bank: ConfluentPackBank, slot: int) -> TransitionProposal:
    """Switch off an ordinary slot whose output coefficient is exactly zero (exact).

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `slot`: position of an active mode-0 slot with `weights[slot] == 0`.

    **Returns:** a `TransitionProposal` of kind `"remove_zero"` with budget 0.

    **Raises:** `ValueError` for a slot outside the bank, or one that is inactive, not
    ordinary or has a non-zero weight.
    """
    slot = _check_slot(bank, slot)
    view = HostView.read(bank)
    return _proposal(view, _remove_zero(view, slot), 0.0)


def _remove_zero(view: HostView, slot: int) -> _Transition:
    weight = float(view.host["weights"][slot])
    ordinary = int(view.host["modes"][slot]) == SlotMode.ORDINARY
    if not bool(view.host["active"][slot]) or not ordinary or weight != 0:
        raise ValueError(
            "an exactly zero ordinary output coefficient is required; "
            f"{_describe(view, slot)}, weight={weight!r}"
        )
    return _Transition(
        (slot,), (SlotUpdate("active", slot, 0),), TransitionKind.REMOVE_ZERO, "exact_zero_output"
    )


def propose_birth(bank: ConfluentPackBank, slot: int, pack: RefinedPack) -> TransitionProposal:
    """Reuse an inactive slot for a new ordinary atom with exactly zero output (exact).

    Every block of the row is written (centre, weight 0, scale, order, age from `pack`;
    active, mode 0, `ρ = 0`, `m1 = 0`, direction `(0, 1)`, a zero moment row), so nothing
    stale survives; the slot keeps its stable id.

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `slot`: position of an inactive slot.
    - `pack`: a `RefinedPack` with `weight == 0` and `order ≤ max_order`.

    **Returns:** a `TransitionProposal` of kind `"zero_output_birth"` with budget 0.

    **Raises:** `TypeError` if `pack` is not a `RefinedPack`; `ValueError` for a slot
    outside the bank, an active slot ("inactive"), or a pack with non-zero weight or too
    high an order ("zero output").
    """
    slot = _check_slot(bank, slot)
    if not isinstance(pack, RefinedPack):
        raise TypeError(f"pack must be a RefinedPack, got {type(pack).__name__}")
    view = HostView.read(bank)
    return _proposal(view, _birth(view, slot, pack), 0.0)


def _birth(view: HostView, slot: int, pack: RefinedPack) -> _Transition:
    if bool(view.host["active"][slot]):
        raise ValueError(f"birth requires an allocated inactive slot; slot {slot} is active")
    if pack.weight != 0 or pack.order > view.max_order:
        raise ValueError(
            "birth requires zero output weight and an order within budget; got weight "
            f"{pack.weight!r} and order {pack.order} (max_order {view.max_order})"
        )
    updates = (
        SlotUpdate("centers", slot, pack.center),
        SlotUpdate("weights", slot, 0),
        SlotUpdate("scales", slot, pack.scale),
        SlotUpdate("orders", slot, pack.order),
        SlotUpdate("ages", slot, pack.age),
        SlotUpdate("active", slot, 1),
        SlotUpdate("modes", slot, SlotMode.ORDINARY),
        SlotUpdate("rho", slot, 0),
        SlotUpdate("odd_moments", slot, 0),
        SlotUpdate("directions", slot, 0),
        SlotUpdate("direction_bias", slot, 1),
        SlotUpdate("moment_coefficients", slot, (0.0,) * (view.max_order + 1)),
    )
    return _Transition(
        (slot,),
        updates,
        TransitionKind.ZERO_OUTPUT_BIRTH,
        "exact_zero_output_with_full_slot_state_initialization",
    )
