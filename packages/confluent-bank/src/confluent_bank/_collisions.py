"""Collisions: which atoms the growing policy merges into a centred pair, and the merge.

Two ordinary order-0 atoms with one input slope `s` whose centres came within
`merge_distance / |s|` of each other have collided. Their merge is the bank's own exact
`"centered_pair"` transition, found by `detect_transitions`; only a merge of a colliding pair
itself qualifies (merging one of its atoms with a far one also lowers the count of
collisions, but is not the near-exact merge the policy means).
"""

from __future__ import annotations

import numpy as np

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._commit import detect_transitions
from confluent_bank._host import HostView, transaction
from confluent_bank._records import SlotMode, TransitionProposal


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


def _merge_proposal(
    bank: ConfluentPackBank, merge_distance: float
) -> tuple[TransitionProposal, float] | None:
    """The first collided pair's merge and its distance `|s·(c₁ − c₂)|`, or `None`."""
    with transaction(bank) as view:  # one device read for the search and the distance
        colliding = {frozenset(p) for p in _collisions(bank, merge_distance)}
        if not colliding:
            return None
        ids = [int(x) for x in view.host["slot_ids"]]
        found = [
            p
            for p in detect_transitions(bank, lambda b: -len(_collisions(b, merge_distance)))
            if frozenset(ids.index(s) for s in p.slot_ids) in colliding
        ]
        if not found:
            return None
        first, second = view.positions(found[0].slot_ids)
        scale = float(view.host["scales"][first])
        gap = abs(scale * (view.host["centers"][first] - view.host["centers"][second]))
    return found[0], float(gap)
