"""Verification: a proposal of a built-in kind must carry exactly its rule's updates.

`commit_transition` and `within_error_budget` recompute the rule of the proposal's kind on
the bank's host view and refuse a proposal whose updates differ, so neither an edited value
nor a relabelled kind can slip through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from confluent_bank._host import HostView
from confluent_bank._proposals import (
    _birth,
    _cluster,
    _derivative,
    _pair,
    _position,
    _remove_zero,
    _Transition,
)
from confluent_bank._records import RefinedPack, SlotUpdate, TransitionKind, TransitionProposal


def _recorded(proposal: TransitionProposal, name: str, slot: int) -> Any:
    """The one value `proposal` writes to `name[slot]` (these fields parametrise a rule)."""
    values = [u.value for u in proposal.updates if u.name == name and u.index == slot]
    if len(values) != 1:
        raise ValueError(f"it must write {name}[{slot}] exactly once")
    return values[0]


def _count(slots: tuple[int, ...], expected: int, kind: str) -> None:
    if len(slots) != expected:
        raise ValueError(f"a {kind!r} proposal names {expected} slot(s), this one {len(slots)}")


def _pair_rule(view: HostView, slots: tuple[int, ...], proposal: TransitionProposal) -> Any:
    _count(slots, 2, proposal.kind)
    return _pair(view, *slots)


def _cluster_rule(view: HostView, slots: tuple[int, ...], proposal: TransitionProposal) -> Any:
    if not slots:
        raise ValueError("a 'cluster_to_moments' proposal names at least one slot")
    recorded = _recorded(proposal, "orders", slots[0])
    if isinstance(recorded, float) and recorded.is_integer():
        recorded = int(recorded)  # an order written as 2.0 is still order 2
    order = _position(recorded, "its order", "an integer")
    if not 0 <= order <= view.max_order:
        raise ValueError(f"its order {order} is outside 0..{view.max_order}")
    return _cluster(view, slots, order)


def _derivative_rule(view: HostView, slots: tuple[int, ...], proposal: TransitionProposal) -> Any:
    _count(slots, 1, proposal.kind)
    return _derivative(view, slots[0])


def _remove_zero_rule(view: HostView, slots: tuple[int, ...], proposal: TransitionProposal) -> Any:
    _count(slots, 1, proposal.kind)
    return _remove_zero(view, slots[0])


def _birth_rule(view: HostView, slots: tuple[int, ...], proposal: TransitionProposal) -> Any:
    # The pack (centre, scale, order, age) is the proposal's free choice; every other value
    # of the row is fixed by the rule.
    _count(slots, 1, proposal.kind)
    slot = slots[0]
    fields: dict[str, Any] = {
        name: _recorded(proposal, name, slot) for name in ("centers", "scales", "orders", "ages")
    }
    if any(isinstance(value, tuple) for value in fields.values()):
        raise ValueError("its centre, scale, order and age must be numbers")
    pack = RefinedPack(fields["orders"], fields["centers"], 0.0, fields["scales"], fields["ages"])
    return _birth(view, slot, pack)


_RULES: dict[str, Callable[[HostView, tuple[int, ...], TransitionProposal], _Transition]] = {
    TransitionKind.CENTERED_PAIR: _pair_rule,
    TransitionKind.DUPLICATE_MERGE: _pair_rule,
    TransitionKind.CLUSTER_TO_MOMENTS: _cluster_rule,
    TransitionKind.PAIR_TO_DERIVATIVE: _derivative_rule,
    TransitionKind.REMOVE_ZERO: _remove_zero_rule,
    TransitionKind.ZERO_OUTPUT_BIRTH: _birth_rule,
}
"""The built-in kinds and how to recompute a proposal of each from its bank."""


def _same_number(a: float | int, b: float | int) -> bool:
    # Exact comparison that tells -0.0 from 0.0 but not 1 from 1.0 (JSON keeps either).
    if Fraction(a) != Fraction(b):
        return False
    return a != 0 or math.copysign(1.0, a) == math.copysign(1.0, b)


def _same_update(a: SlotUpdate, b: SlotUpdate) -> bool:
    if (a.name, a.index) != (b.name, b.index):
        return False
    left = a.value if isinstance(a.value, tuple) else (a.value,)
    right = b.value if isinstance(b.value, tuple) else (b.value,)
    if isinstance(a.value, tuple) != isinstance(b.value, tuple) or len(left) != len(right):
        return False
    return all(_same_number(x, y) for x, y in zip(left, right, strict=True))


def check_implied_updates(
    view: HostView, proposal: TransitionProposal, slots: tuple[int, ...]
) -> None:
    """Refuse a built-in-kind proposal whose updates are not exactly its rule's for `view`.

    The rule is recomputed from the bank the proposal is bound to, so neither an edited value
    nor a relabelled kind can slip through. Kinds without a rule are left to the caller's
    acceptance callback (`within_error_budget` refuses them); their updates still pass the
    structural and range checks of `commit_transition`.

    **Arguments:**

    - `view`: the host copy of the bank.
    - `proposal`: the proposal.
    - `slots`: the positions of `proposal.slot_ids` in `view`.

    Raises `ValueError` naming the kind when the rule does not apply or gives other updates.
    """
    rule = _RULES.get(proposal.kind)
    if rule is None:
        return
    try:
        expected = rule(view, slots, proposal)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"tampered or inconsistent {proposal.kind!r} proposal for slot ids "
            f"{proposal.slot_ids}: {error}"
        ) from None
    if (
        expected.kind != proposal.kind
        or expected.slots != slots
        or len(expected.updates) != len(proposal.updates)
        or not all(map(_same_update, expected.updates, proposal.updates))
    ):
        raise ValueError(
            f"tampered or inconsistent {proposal.kind!r} proposal for slot ids "
            f"{proposal.slot_ids}: its updates are not the ones the {expected.kind!r} rule "
            "gives for the bank it is bound to; propose again"
        )
