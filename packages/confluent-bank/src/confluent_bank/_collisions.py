"""Collisions: which atoms the growing policy merges, and the merge.

Two ordinary order-0 atoms with one input slope `s` whose centres came within
`merge_distance / |s|` of each other have collided. They merge into one truncated moment
slot (`"cluster_to_moments"` at the lowest order whose remainder the acceptance bounds within
an error budget; with every atom joined to them through collisions, when that group fits the
budget as one slot), or into a centred pair, the bank's own exact `"centered_pair"` transition
found by `detect_transitions` (only a merge of a colliding pair itself qualifies: merging one
of its atoms with a far one also lowers the count of collisions, but is not the near-exact
merge the policy means). A pair is exact, but a bank built without `max_pairs` evaluates the
pair formulas on every slot once it holds one; a moment slot costs what an ordinary atom does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._commit import detect_transitions
from confluent_bank._host import HostView, transaction
from confluent_bank._proposals import propose_cluster
from confluent_bank._records import SlotMode, TransitionProposal

MERGE_TARGETS = ("pair", "moments")


def _collisions(bank: ConfluentPackBank, merge_distance: float) -> list[tuple[int, int]]:
    """Slot positions of the collided pairs: ordinary order-0 atoms with one input slope,
    `merge_distance` apart in the slope's units."""
    host = HostView.read(bank).host
    live = np.flatnonzero(
        host["active"] & (host["modes"] == SlotMode.ORDINARY) & (host["orders"] == 0)
    )
    pairs = []
    for a, first in enumerate(live):
        for second in live[a + 1 :]:
            scale = host["scales"][first]
            if scale != host["scales"][second] or scale == 0:
                continue
            gap = abs(scale * (host["centers"][first] - host["centers"][second]))
            if gap <= merge_distance:
                pairs.append((int(first), int(second)))
    return pairs


def _gap(view: HostView, first: int, second: int) -> float:
    scale = float(view.host["scales"][first])
    return abs(scale * float(view.host["centers"][first] - view.host["centers"][second]))


def _group(pairs: list[tuple[int, int]], seed: tuple[int, int]) -> tuple[int, ...]:
    """The slots joined to `seed` through collided pairs, in slot order (so the first, which
    keeps a cluster, is the lowest position). All share one slope: only such atoms collide."""
    group = set(seed)
    grown = True
    while grown:
        joined = {slot for pair in pairs if group & set(pair) for slot in pair}
        grown = not joined <= group
        group |= joined
    return tuple(sorted(group))


def _spread(view: HostView, slots: tuple[int, ...]) -> float:
    """The largest distance `|s·(c_i − c_j)|` within a group of one slope."""
    return max(_gap(view, a, b) for a in slots for b in slots if a < b)


def _merge_proposal(
    bank: ConfluentPackBank,
    merge_distance: float,
    into: str = "pair",
    budget: float = 0.0,
    accept: Callable[[ConfluentPackBank, TransitionProposal], bool] | None = None,
) -> tuple[TransitionProposal, float] | None:
    """A collided pair's merge and its distance `|s·(c₁ − c₂)|`, or `None`.

    `into="moments"`: the closest collided pair, with every atom joined to it through
    collisions, as one moment slot, with `budget` as the proposal's error budget, at the
    lowest order that `accept` passes (the fewest new coefficients for the optimiser to
    move); when no order up to `max_order` passes for the group, the closest pair alone; when
    none passes for it either, the centred pair below instead. `into="pair"`: the first merge
    `detect_transitions` ranks among the collided pairs (none while the bank holds
    `max_pairs` pairs). The distance returned is the merged atoms' largest.
    """
    with transaction(bank) as view:  # one device read for the search and the distance
        colliding = _collisions(bank, merge_distance)
        if not colliding:
            return None
        if into == "moments" and accept is not None:
            closest = min(colliding, key=lambda p: _gap(view, *p))
            group = _group(colliding, closest)
            for slots in dict.fromkeys((group, closest)):  # the group first, then the pair
                for order in range(bank.max_order + 1):
                    proposal = propose_cluster(bank, slots, order=order, error_budget=budget)
                    if accept(bank, proposal):
                        return proposal, _spread(view, slots)
        wanted = {frozenset(p) for p in colliding}
        ids = [int(x) for x in view.host["slot_ids"]]
        found = [
            p
            for p in detect_transitions(bank, lambda b: -len(_collisions(b, merge_distance)))
            if frozenset(ids.index(s) for s in p.slot_ids) in wanted
        ]
        if not found:
            return None
        first, second = view.positions(found[0].slot_ids)
        return found[0], _gap(view, first, second)
