"""The growing policy: a `TransitionHook` that births, merges and removes atoms by itself.

`TransitionHook.growing(objective, domain)` builds a `GrowingHook`. Every `every` steps it
evaluates the objective once and decides, in this order: remove atoms whose contribution has
stayed near zero, merge colliding atoms (`_collisions.py`), and, when training has
plateaued, birth the candidate atoms whose zero weights have the largest normalised gradient
(up to `births` per check), each newborn's weight then set by a line search (`_newborn.py`).
Births and the decision to stop wait while a `row_warmup` still ramps newborns in.
Every transition is one of the bank's own exact (or bounded) commits, so shapes never change
and nothing recompiles; every decision is a `TransitionEvent` with its score.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank import _growing_options as options
from confluent_bank._bank import ConfluentPackBank
from confluent_bank._bounds import EXACT_KINDS
from confluent_bank._candidates import CandidateScorer
from confluent_bank._collisions import MERGE_TARGETS, _merge_proposal
from confluent_bank._domains import BankDomains, Domain, DomainSpec
from confluent_bank._hook import TransitionEvent, TransitionHook
from confluent_bank._host import HostView, transaction
from confluent_bank._newborn import Unseeded, newborn_weight, ramping_in
from confluent_bank._pruning import REMOVE_NEAR_ZERO, _quiet_counts, _removal, _removal_acceptance
from confluent_bank._records import RefinedPack, TransitionKind
from confluent_bank._visit import flatten_banks

_BIRTH = TransitionKind.ZERO_OUTPUT_BIRTH
NEWBORN_WEIGHT = "newborn_weight"
"""The kind of the event that records a newborn's first weight, set by a line search."""
STOP_GROWING = "stop_growing"
"""The kind of the event that records the decision to stop growing (nothing is committed)."""


class GrowingHook(TransitionHook):
    """The hook `TransitionHook.growing` builds (see there for the policy and its options).

    Beyond a `TransitionHook` it has the policy's options as attributes, `candidates` (the
    candidate grid as arrays `centers`, `scales`, `orders`; with a `domain` mapping, one such
    grid per bank path) and `stopped`.
    """

    def __init__(
        self,
        objective: Callable[[Any], Any],
        domain: DomainSpec,
        *,
        every: int = 20,
        max_active: int | None = None,
        plateau: float = 0.1,
        stop_tol: float = 0.01,
        n_centers: int = 41,
        scales: Sequence[float] | None = None,
        orders: Sequence[int] = (0,),
        prune_tol: float = 1e-3,
        prune_checks: int = 3,
        merge_distance: float = 0.05,
        merge_into: Literal["moments", "pair"] = "moments",
        line_search: bool = True,
        births: int = 3,
        adapter: Any = None,
        retract: bool = True,
        n_points: int = 401,
    ) -> None:
        objective = options.objective(objective)
        domains = BankDomains(domain, "TransitionHook.growing", strict=True)
        super().__init__(
            lambda step, path, bank: None,
            domain,
            adapter=adapter,
            retract=retract,
            objective=objective,
            n_points=n_points,
        )
        self._domains = domains  # the same domains; its messages name this constructor
        self.every = options.positive_int(every, "every")
        self.max_active = (
            None if max_active is None else options.positive_int(max_active, "max_active")
        )
        self.plateau = options.non_negative(plateau, "plateau") if plateau != math.inf else math.inf
        self.stop_tol = options.non_negative(stop_tol, "stop_tol")
        self.prune_tol = options.non_negative(prune_tol, "prune_tol")
        self.prune_checks = options.positive_int(prune_checks, "prune_checks")
        self.merge_distance = options.non_negative(merge_distance, "merge_distance")
        self.merge_into = options.choice(merge_into, "merge_into", MERGE_TARGETS)
        self.line_search = options.flag(line_search, "line_search")
        self.births = options.positive_int(births, "births")
        self.n_centers = options.positive_int(n_centers, "n_centers")
        self.scales = options.slopes(scales)
        self.orders = options.orders(orders)
        self._scorers: dict[Domain, CandidateScorer] = {}
        shared = domains.shared
        self.candidates = (
            self._scorer("").candidates
            if shared is not None
            else {path: self._scorer(path).candidates for path in domains.per_bank}
        )
        self._previous: float | None = None
        self._at_birth: float | None = None
        self._since_birth = 0
        self._stopped = False
        self._quiet: dict[str, dict[int, int]] = {}

    def _default_acceptance(self, domain: Domain) -> Any:
        return _removal_acceptance(domain)

    def _scorer(self, path: str) -> CandidateScorer:
        """The candidates of the bank at `path`: a grid over its domain, slopes relative to
        the domain's width unless `scales` were given."""
        lo, hi = self._domains.of(path)
        if (lo, hi) not in self._scorers:
            slopes = self.scales or tuple(s / (hi - lo) for s in (2.0, 4.0, 8.0, 16.0))
            self._scorers[lo, hi] = CandidateScorer(
                (lo, hi), self.n_centers, slopes, self.orders, self.n_points
            )
        return self._scorers[lo, hi]

    def _adapter(self, path: str, n_banks: int, opt_state: Any) -> Any:
        adapter = super()._adapter(path, n_banks, opt_state)
        if self.adapter is None and hasattr(adapter, "carry_transition"):
            return Unseeded(adapter)
        return adapter

    # -- state ----------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """Whether the policy has stopped growing (it still removes and merges)."""
        return self._stopped

    def state_dict(self) -> dict[str, Any]:
        """The events and the policy's counters, JSON-serialisable (see `load_state_dict`)."""
        return {
            **super().state_dict(),
            "previous": self._previous,
            "at_birth": self._at_birth,
            "since_birth": self._since_birth,
            "stopped": self._stopped,
            "quiet": {p: {str(k): v for k, v in q.items()} for p, q in self._quiet.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`: events, last values, the stop flag and the counters.

        Pair it with the bank saved at the same step (`save_checkpoint`), and build the hook
        with the same arguments.
        """
        super().load_state_dict(state)
        try:
            self._previous, self._at_birth = state["previous"], state["at_birth"]
            self._stopped = bool(state["stopped"])
            self._since_birth = int(state["since_birth"])
            self._quiet = {
                str(p): {int(k): int(v) for k, v in q.items()} for p, q in state["quiet"].items()
            }
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(
                "TransitionHook.load_state_dict: state must be what a growing hook's "
                f"state_dict() returned ({error!r})"
            ) from None

    # -- the step -------------------------------------------------------------------------

    def between_steps(self, step: int, predictors: Any, opt_state: Any) -> tuple[Any, Any]:
        """Each `every` steps: remove, merge, birth or stop; returns `(predictors, state)`."""
        leaves, treedef, banks = flatten_banks(predictors)
        self._check_domains(leaves, banks)
        self._check_pair_merges(leaves, banks)
        if step % self.every == 0:  # flatten_banks found at least one bank
            value = self._evaluate(leaves, treedef)
            n = len(banks)
            for i in banks:
                opt_state = self._remove(step, leaves, treedef, i, opt_state, n, value)
                opt_state, value = self._merge(step, leaves, treedef, i, opt_state, n, value)
            opt_state = self._grow(step, leaves, treedef, banks, opt_state, value)
        if self.retract:
            for i in banks:
                leaves[i] = (leaves[i][0], leaves[i][1].retract())
        return treedef.unflatten([leaf for _, leaf in leaves]), opt_state

    def _check_pair_merges(self, leaves: list[tuple[Any, Any]], banks: list[int]) -> None:
        """`merge_into="pair"` on a bank that can hold no pair would never merge: refuse it."""
        if self.merge_into != "pair":
            return
        for i in banks:
            if leaves[i][1].max_pairs == 0:
                raise ValueError(
                    "merge_into='pair' merges collided atoms into a centred pair, but the bank "
                    f"at {jax.tree_util.keystr(leaves[i][0]) or 'predictors'} was built with "
                    "max_pairs=0 and holds none; use merge_into='moments' (the default) or "
                    "build the bank with max_pairs >= 1"
                )

    def _evaluate(self, leaves: list[tuple[Any, Any]], treedef: Any) -> float:
        assert self.objective is not None
        return options.objective_value(self.objective(treedef.unflatten([x for _, x in leaves])))

    def _near_zero(self, path: str, bank: ConfluentPackBank) -> float:
        """`prune_tol · max|f|` over the bank's domain: what counts as near zero."""
        grid = jnp.linspace(*self._domains.of(path), self.n_points, dtype=bank.centers.dtype)
        return self.prune_tol * float(jnp.max(jnp.abs(bank.forward(grid))))

    def _remove(
        self, step: int, leaves: list, treedef: Any, i: int, state: Any, n: int, value: float
    ) -> Any:
        path, bank = jax.tree_util.keystr(leaves[i][0]), leaves[i][1]
        reference = self._near_zero(path, bank)
        view = HostView.read(bank)
        live = _quiet_counts(view, bank.base, reference, self._quiet.get(path, {}))
        self._quiet[path] = live
        for ident in [k for k, count in live.items() if count >= self.prune_checks]:
            with transaction(leaves[i][1]) as view:
                proposal, score = _removal(view, bank.base, ident, reference)
                state, accepted = self._commit_one(
                    step, leaves, treedef, i, proposal, state, n, score=score, before=value
                )
            if accepted:
                live.pop(ident, None)
        return state

    def _merge(
        self, step: int, leaves: list, treedef: Any, i: int, state: Any, n: int, value: float
    ) -> tuple[Any, float]:
        """Merge collided atoms while any are left; `(state, objective)`."""
        path = jax.tree_util.keystr(leaves[i][0])
        for _ in range(leaves[i][1].max_packs):
            bank = leaves[i][1]
            with transaction(bank):
                # A moment slot's remainder may change f by what a removal may.
                budget = self._near_zero(path, bank) if self.merge_into == "moments" else 0.0
                found = _merge_proposal(
                    bank, self.merge_distance, self.merge_into, budget, self._acceptance(path)
                )
                if found is None:
                    break
                proposal, gap = found
                exact = proposal.kind in EXACT_KINDS
                state, accepted = self._commit_one(
                    step, leaves, treedef, i, proposal, state, n,
                    score=gap, before=value, unchanged=exact,
                )  # fmt: skip
            if not accepted:
                break
            value = self.events[-1].loss_after
        return state, value

    def _grow(
        self, step: int, leaves: list, treedef: Any, banks: list[int], state: Any, value: float
    ) -> Any:
        previous = self._previous  # the lowest objective since the last birth
        self._previous = value if previous is None else min(previous, value)
        self._since_birth += 1
        if ramping_in(state):
            return state  # a newborn ramping in has not shown its worth: judge it once warm
        if self._stopped or previous is None or previous - value > self.plateau * abs(previous):
            return state  # stopped, no reference yet, or still improving
        if self.stop_tol > 0 and self._last_births_removed():
            # Every atom of the last births was removed as near zero: they did not pay off,
            # and births scored against this fit would follow them (at a loss near rounding,
            # a birth's line search gains a few per cent that training then undoes).
            self._stop(step, value, 0.0)
            return state
        # A newborn gets two checks to pay off before the policy judges it or births again:
        # the bump Adam makes on fresh rows is not a plateau.
        if self._at_birth is not None and self._since_birth < 2:
            return state
        if self._at_birth is not None:
            lowest = min(previous, value)
            gain = (self._at_birth - lowest) / abs(self._at_birth) if self._at_birth else 0.0
            if gain < self.stop_tol:
                self._stop(step, value, gain)
                return state
        first = None  # the first birth's score: later births of this check need half of it
        for _ in range(self.births):
            best = self._best_candidate(leaves, treedef, banks)
            if best is None or not best[0] > 0 or (first is not None and best[0] < first / 2):
                break
            state, after, born = self._birth(step, leaves, treedef, banks, state, value, best)
            if not born or not after < value:
                # No birth, or a newborn left at weight 0 (no line search, or none that
                # lowered the objective): the objective and so every score are as they were,
                # and the next birth would be a copy of this one.
                break
            first, value = (best[0] if first is None else first), after
        return state

    def _last_births_removed(self) -> bool:
        """Whether every atom born at the last check with births has since been removed as
        near zero. Read from the events, so a hook resumed from `state_dict()` decides as
        the uninterrupted one did."""
        births = [k for k, e in enumerate(self.events) if e.kind == _BIRTH and e.accepted]
        if not births:
            return False
        last = self.events[births[-1]].step
        born = {
            (e.path, e.slots[0])
            for e in self.events
            if e.kind == _BIRTH and e.accepted and e.step == last
        }
        removed = {
            (e.path, e.slots[0])
            for e in self.events[births[-1] + 1 :]
            if e.kind == REMOVE_NEAR_ZERO and e.accepted
        }
        return born <= removed

    def _stop(self, step: int, value: float, gain: float) -> None:
        self._stopped = True
        self.events.append(
            TransitionEvent(int(step), "", STOP_GROWING, (), True, 0.0, value, value, float(gain))
        )

    def _best_candidate(
        self, leaves: list, treedef: Any, banks: list[int]
    ) -> tuple[float, int, int, int, float] | None:
        """`(score, bank leaf, free slot, candidate, gradient)` of the best candidate, if any."""
        best = None
        for i in banks:
            bank = leaves[i][1]
            host = HostView.read(bank).host
            free = np.flatnonzero(~host["active"])
            limit = bank.max_packs if self.max_active is None else self.max_active
            if free.size == 0 or int(np.sum(host["active"])) >= limit:
                continue
            path = jax.tree_util.keystr(leaves[i][0])
            scores, gradients = self._scorer(path).scores(self.objective, leaves, treedef, i)
            j = int(np.argmax(scores))
            if best is None or scores[j] > best[0]:
                best = (float(scores[j]), i, int(free[0]), j, float(gradients[j]))
        return best

    def _birth(
        self, step: int, leaves: list, treedef: Any, banks: list[int], state: Any, value: float,
        best: tuple[float, int, int, int, float],
    ) -> tuple[Any, float, bool]:  # fmt: skip
        """Birth candidate `best`, then line-search its weight; `(state, objective, born)`."""
        score, i, slot, j, gradient = best
        pool = self._scorer(jax.tree_util.keystr(leaves[i][0])).candidates
        pack = RefinedPack(
            int(pool["orders"][j]), float(pool["centers"][j]), 0.0, float(pool["scales"][j])
        )
        bank = leaves[i][1]
        with transaction(bank) as view:
            ident = view.slot_id(slot)
            proposal = bank.propose_birth(slot, pack)
            state, accepted = self._commit_one(
                step, leaves, treedef, i, proposal, state, len(banks),
                score=score, before=value, unchanged=True,
            )  # fmt: skip
        if not accepted:
            return state, value, False
        self._at_birth = value
        self._since_birth = 0
        if self.line_search:
            value = self._set_newborn_weight(step, leaves, treedef, i, slot, ident, value, gradient)
        self._previous = value
        return state, value, True

    def _set_newborn_weight(
        self, step: int, leaves: list, treedef: Any, i: int, slot: int, ident: int,
        value: float, gradient: float,
    ) -> float:  # fmt: skip
        """Move the newborn's weight from 0 to `newborn_weight`'s and record it; the objective."""
        path, born = jax.tree_util.keystr(leaves[i][0]), leaves[i][1]

        def with_weight(weight: float) -> ConfluentPackBank:
            return dataclasses.replace(born, weights=born.weights.at[slot].set(weight))

        def loss_at(weight: float) -> float:
            pieces = [leaf for _, leaf in leaves]
            pieces[i] = with_weight(weight)
            try:
                return float(self.objective(treedef.unflatten(pieces)))
            except Exception:
                # A trial weight can make the model's ODE unsolvable, and a solver that gives
                # up raises rather than returning inf (diffrax's max_steps under throw=True:
                # an EquinoxRuntimeError, or a ValueError under a plain jax.jit). The
                # objective has just run at these shapes with the weight at 0, so what fails
                # here is the model at this weight: to the line search, a blow-up.
                return math.inf

        weight, after = newborn_weight(loss_at, value, gradient)
        moved = weight != 0.0
        if moved:
            leaves[i] = (leaves[i][0], with_weight(weight))
        # A search that found no lower objective is a decision too: the newborn stays at 0.
        self.events.append(
            TransitionEvent(
                int(step), path, NEWBORN_WEIGHT, (ident,), moved,
                self._change(path, born, leaves[i][1]) if moved else 0.0, value, after, weight,
            )
        )  # fmt: skip
        return after
