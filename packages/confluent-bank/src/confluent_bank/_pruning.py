"""Removal of near-zero atoms: the growing policy's bounded `"remove_near_zero"` transition.

An ordinary slot adds at most `|w|·|s|ⁿ·sup|σ⁽ⁿ⁾|` anywhere, a rigorous bound. A slot whose bound
stays below a fraction of the bank's largest output on the domain for a number of consecutive
checks is switched off (weight and `active` to 0), and the change is accepted only when that
bound is within the proposal's error budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from confluent_bank._bounds import derivative_bound, within_error_budget
from confluent_bank._host import HostView
from confluent_bank._records import SlotMode, SlotUpdate, TransitionProposal

REMOVE_NEAR_ZERO = "remove_near_zero"
"""The kind of the growing policy's removals: weight and `active` of one ordinary slot → 0."""


def _slot_bound(host: Mapping[str, np.ndarray], base: str, slot: int) -> float:
    """`|w|·|s|ⁿ·sup|σ⁽ⁿ⁾|` (a rigorous bound): the most an ordinary slot adds anywhere."""
    order = int(host["orders"][slot])
    weight, scale = float(host["weights"][slot]), float(host["scales"][slot])
    return abs(weight) * abs(scale) ** order * derivative_bound(base, order)


def _removal_acceptance(domain: tuple[float, float]) -> Callable[[Any, TransitionProposal], bool]:
    """`within_error_budget(domain)`, plus the rigorous bound of a near-zero removal."""
    budget = within_error_budget(domain)

    def acceptance(bank: Any, proposal: TransitionProposal) -> bool:
        if proposal.kind != REMOVE_NEAR_ZERO:
            return budget(bank, proposal)
        view = HostView.read(bank)
        (slot,) = view.positions(proposal.slot_ids)
        ordinary = int(view.host["modes"][slot]) == SlotMode.ORDINARY
        if not bool(view.host["active"][slot]) or not ordinary:
            return False
        return _slot_bound(view.host, bank.base, slot) <= proposal.error_budget

    return acceptance


def _quiet_counts(
    view: HostView, base: str, reference: float, quiet: Mapping[int, int]
) -> dict[int, int]:
    """Per active ordinary slot id, how many consecutive checks its bound stayed `<= reference`
    (`quiet` holds the counts of the previous check; a loud slot starts again at 0)."""
    counts: dict[int, int] = {}
    for slot in range(view.max_packs):
        ordinary = int(view.host["modes"][slot]) == SlotMode.ORDINARY
        if not (bool(view.host["active"][slot]) and ordinary):
            continue
        ident = view.slot_id(slot)
        small = _slot_bound(view.host, base, slot) <= reference
        counts[ident] = quiet.get(ident, 0) + 1 if small else 0
    return counts


def _removal(
    view: HostView, base: str, ident: int, budget: float
) -> tuple[TransitionProposal, float]:
    """The proposal that switches slot `ident` off, with `budget` as its error budget, and its
    score (the slot's bound)."""
    slot = view.positions((ident,))[0]
    proposal = TransitionProposal(
        view.digest,
        view.version,
        (ident,),
        (SlotUpdate("weights", slot, 0.0), SlotUpdate("active", slot, 0)),
        REMOVE_NEAR_ZERO,
        "near-zero output; the change is bounded by |w|·|s|^n·sup|σ^(n)|",
        budget,
    )
    return proposal, _slot_bound(view.host, base, slot)
