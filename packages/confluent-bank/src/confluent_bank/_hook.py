"""The transition hook: commit bank transitions between a trainer's optimiser steps.

A trainer that calls `between_steps(step, predictors, opt_state)` after each step (the
hybrid-kernels trainer does; so can any hand-written loop) can hand that call to a
`TransitionHook`. It finds every `ConfluentPackBank` in the predictors pytree, whatever sits
beside it, asks a user policy for a proposal per bank, commits it with `commit_transition`,
carries the rows of the whole optimizer state along, and records one `TransitionEvent` per
attempt. The protocol is duck-typed: this module imports no trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._bounds import within_error_budget
from confluent_bank._commit import commit_transition
from confluent_bank._domains import BankDomains, Domain, DomainSpec
from confluent_bank._events import TransitionEvent
from confluent_bank._host import transaction
from confluent_bank._optimizer_state import NamedMomentState, OptimizerStateAdapter
from confluent_bank._records import TransitionProposal
from confluent_bank._visit import flatten_banks

Proposer = Callable[[int, str, ConfluentPackBank], TransitionProposal | None]


class TransitionHook:
    """A `between_steps(step, predictors, opt_state)` hook that commits bank transitions.

    After each optimiser step it visits every `ConfluentPackBank` in `predictors` (a bank, a
    tuple holding one, an `eqx.Module` with a bank beside an MLP and some rates, ...). For
    each bank, `propose(step, path, bank)` returns a `TransitionProposal` or `None`; a
    proposal is committed with `commit_transition` under `acceptance`, and the optimizer
    state's rows for the touched slots go through the state adapter, in every moment tree of
    the whole state. Each attempt, accepted or not, appends a `TransitionEvent` to `events`.
    Then, with `retract=True`, every bank's spreads are projected onto `ρ ≥ 0`.

    A commit changes array values only, so a trainer's compiled kernels stay valid.

    ```python
    def propose(step, path, bank):
        if step == 500:
            found = cb.detect_transitions(bank, my_score)
            return found[0] if found else None
        return None

    hook = cb.TransitionHook(propose, domain=(-3.0, 3.0))
    history, trained = hk.train_with_optax(..., hooks=hook)
    history.events  # the hook's events, as dicts
    ```

    **Arguments:**

    - `propose`: `(step, path, bank) -> TransitionProposal | None`, the policy; `path` is the
      bank's key string in `predictors` (`"[0]"`, `".bank"`, `""` for a bare bank).
    - `domain`: `(lo, hi)`, the inputs the banks must stay accurate on; or, for banks whose
      inputs differ, a mapping `{path: (lo, hi)}` with one entry per bank (the `path` its
      events carry, e.g. `{"[0]": (0.0, 20.0), "[1]": (0.0, 2.0)}`). The function change of
      each commit is measured on `n_points` points of the bank's domain, and the default
      `acceptance` is `within_error_budget` of it.
    - `acceptance`: `(bank, proposal) -> bool`, for every bank; default
      `within_error_budget(domain)` of each bank's domain.
    - `adapter`: `path -> OptimizerStateAdapter` for the bank at `path`. The default is
      `confluent_bank.optax.commit_adapter(path=...)` for optax states (with the bank's path
      only when `predictors` holds several banks, so a single bank is found wherever the
      optimiser's params put it) and `reset_slot_state` for a `NamedMomentState`.
    - `retract`: project every bank's `rho` onto `ρ ≥ 0` after each step (default `True`).
    - `objective`: optional `(predictors) -> float`, evaluated just before and just after
      each commit (recorded in the event).
    - `n_points`: grid size for `max_change` (default 401).

    **Raises:** `ValueError` for a malformed `domain` or `n_points < 2`, and (from
    `between_steps`) for a bank whose path a `domain` mapping lacks, or, in a run of several
    processes (`jax.distributed`), at the first call on every process when the processes
    gave different domains (one all-gather compares them: each process runs the hook, and
    its commits must agree); `TypeError` when `propose` is not callable or returns
    something other than a proposal or `None`.
    """

    def __init__(
        self,
        propose: Proposer,
        domain: DomainSpec,
        *,
        acceptance: Callable[[ConfluentPackBank, TransitionProposal], bool] | None = None,
        adapter: Callable[[str], OptimizerStateAdapter[Any]] | None = None,
        retract: bool = True,
        objective: Callable[[Any], float] | None = None,
        n_points: int = 401,
    ) -> None:
        if not callable(propose):
            raise TypeError(f"TransitionHook: propose must be callable, got {propose!r}")
        self._domains = BankDomains(domain, "TransitionHook")
        self._agreed = False  # whether the processes' domains were compared (first call)
        if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 2:
            raise ValueError(f"TransitionHook: n_points must be an integer >= 2, got {n_points!r}")
        self.propose = propose
        self.domain = self._domains.given
        self._acceptances: dict[Domain, Callable[[ConfluentPackBank, TransitionProposal], bool]]
        self._acceptances = {}
        self._user_acceptance = acceptance
        # The acceptance every bank gets: the user's, or the default of a shared domain (with
        # a mapping, each bank's default is built from its own domain when it is visited).
        self.acceptance = acceptance
        if acceptance is None and self._domains.shared is not None:
            self.acceptance = self._acceptance("")
        self.adapter = adapter
        self.retract = retract
        self.objective = objective
        self.n_points = n_points
        self.events: list[TransitionEvent] = []

    @classmethod
    def growing(
        cls,
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
        adapter: Callable[[str], OptimizerStateAdapter[Any]] | None = None,
        retract: bool = True,
        n_points: int = 401,
    ) -> TransitionHook:
        """A hook with the library's own policy: births, merges and removals, no schedule.

        Every `every` steps (`step % every == 0`) it evaluates `objective(predictors)` once and,
        for every bank in the predictors:

        1. **removes** each ordinary atom whose contribution `|w|·|s|ⁿ·sup|σ⁽ⁿ⁾|` stayed at
           most `prune_tol · max|f|` (`f` the bank's output on the domain) for `prune_checks`
           consecutive checks: a commit of kind `"remove_near_zero"` (weight and `active` to
           0), which changes `f` by at most that bound and is accepted only within it;
        2. **merges** colliding atoms (ordinary order-0 atoms with one common input slope `s`
           and `|s·(c₁ − c₂)| ≤ merge_distance`; atoms whose slopes are trained apart never
           collide). By default (`merge_into="moments"`) the closest two, with every atom
           joined to them through collisions, become one truncated moment slot
           (`"cluster_to_moments"`) of the lowest order whose rigorous remainder bound stays
           within a removal's budget (`prune_tol · max|f|`); a group that no order fits merges
           its closest two alone; when no order up to the bank's `max_order` fits them either,
           or with `merge_into="pair"`, they become a centred pair, exactly, as ranked by
           `detect_transitions` with minus the number of collisions as its score (none while
           a bank holds `max_pairs` pairs). A moment slot costs a training step what an
           ordinary atom does; a bank built without `max_pairs` evaluates the pair formulas
           on every slot once it holds a pair, and one built with `max_pairs=0` compiles none
           (it merges into moment slots only);
        3. **births**, on a plateau (the objective is not below `(1 − plateau)` times its lowest
           value since the last birth), the best candidate of all banks with room (fewer than
           `max_active` active slots): a zero-output birth, exact, in the first free slot.
           The candidates are ordinary atoms centred on `n_centers` points evenly spread over
           `domain`, with each slope of `scales` and each order of `orders`, all scored in
           one gradient evaluation (each a zero-weight slot of one larger bank) by
           `|∂objective/∂w| / ‖φ‖`: the first-order gain of the candidate atom `φ` scaled to
           unit RMS over the domain. With `line_search`, the newborn's weight then moves from
           0 to the minimum of a parabola through the objective at 0, its gradient there (from
           the scoring) and one trial point, backtracked until it lowers the objective by
           Armijo's rule (two evaluations, at most five; kept only if the objective falls;
           a trial at which the objective raises, such as a solve that ran out of
           `max_steps` under `throw=True`, counts as a blow-up): an event of kind
           `"newborn_weight"`, refused if the weight stayed 0. Up to
           `births` atoms are born per check, each scored afresh after the previous one's
           line search, while the best score is at least half the check's first and each
           newborn's line search lowered the objective;
        4. **stops** growing for good when, on a plateau at least two checks after the last
           birth, the objective's lowest value is less than `stop_tol` (relative) below its
           value at that birth: the last atom did not pay off; or, on a plateau, once every
           atom born at the last check with births has been removed as near zero (score 0;
           not with `stop_tol=0`). Removals and merges go on.

        Births and the stop wait while a `row_warmup` in the optimiser state still ramps a
        restarted coordinate in: until its ramp is done, a newborn has not shown its worth,
        and a plateau then would fill the slots with atoms scored against a fit that the
        last ones have not yet changed. With or without it, the check right after a birth
        births nothing and does not judge the newborn's gain: Adam's first full steps on the
        fresh rows bump the objective, and a bump is not a plateau.

        Each decision is a `TransitionEvent` whose `score` says why (see `TransitionEvent`);
        a stop is an event of kind `"stop_growing"` with no slots. The optimiser moves a
        newborn weight from 0: wrap it in `confluent_bank.optax.row_warmup` so the fresh rows
        ramp in. The default optax adapter starts a newborn's moments at zero instead of
        seeding them from its siblings as `commit_adapter()` does: the seed keeps Adam's
        steps on the newborn 10–100× small for thousands of steps, so the bank grows but
        does not learn; the price is a short loss bump after each birth (about 3× over 50
        steps in the spike benchmark). A merged pair's `directions` starts unseeded too: on
        inputs in the hundreds its first full-rate steps reshape the pair unless
        `row_warmup` ramps it in (seeded, the integration example's grown bank ended at
        2.5× the loss). `adapter=lambda path: commit_adapter()` restores quiet births and
        merges. Resume a run with `state_dict()` / `load_state_dict()` and the bank's
        checkpoint.

        **Arguments:**

        - `objective`: `(predictors) -> scalar`, differentiable with JAX: the training loss
          or a validation loss. Evaluated once per check and differentiated once per birth
          with each bank replaced by a larger one (the candidates appended), so it must work
          for any capacity (call the bank's `forward`, not its slot blocks); jit it.
        - `domain`: `(lo, hi)` with `lo < hi`, the banks' inputs; or, when several banks see
          inputs on different scales, a mapping `{path: (lo, hi)}` with one entry per bank
          (`path` as the events write it, e.g. `{"[0]": (0.0, 20.0), "[1]": (0.0, 0.5)}`).
          Each bank's candidates, default `scales`, removal threshold and `max_change` then
          use its own domain.
        - `every`: steps between checks (default 20). A check costs one objective evaluation,
          a birth one gradient and two evaluations. Adam needs some steps to use a newborn
          weight: with the defaults a bank grown from 2 atoms beat a hand-placed one in 160
          steps (the ODE example) and a 1-16-16-1 MLP in 4000 steps under
          `row_warmup(100)` (four 1-D curves); raise it toward 1/40 of the budget to let
          each atom settle before the next is judged.
        - `max_active`: most active slots per bank (default: the bank's capacity).
        - `plateau`: relative improvement over one interval below which training counts as
          plateaued (default 0.1). Larger grows sooner and more (`math.inf` births at every
          check but the one right after a birth); smaller lets each atom converge first.
          With 0.2 and `every=20`, one of the four 1-D curves filled its 16 slots by step
          180 and ended at 2.4× the MLP.
        - `stop_tol`: the relative gain a birth must bring (default 0.01); 0 never stops.
        - `n_centers`: candidate centres (default 41); finer than the features you expect.
        - `scales`: candidate slopes (default `(2, 4, 8, 16) / (hi − lo)`, atoms from half
          to 1/16 of the domain wide). The score favours the sharpest slope offered: adding
          `32 / (hi − lo)` helped a 1-D curve with a sharp step, but on the fed-batch
          reactor it left the same loss with 8× the error of the learned rate at the edge
          of the data.
        - `orders`: candidate orders (default `(0,)`; add 1 for bumps). Orders above a bank's
          `max_order` are skipped for that bank.
        - `prune_tol`: "near zero", relative to `max|f|` (default 1e-3).
        - `prune_checks`: consecutive near-zero checks before a removal (default 3).
        - `merge_distance`: collision distance in units of `1/|s|` (default 0.05).
        - `merge_into`: `"moments"` (default) or `"pair"`, what collided atoms become (above).
          On the integration example the two ended within one run's spread of each other;
          inside an ODE, a default bank holding a pair stepped at 1.3–2× an MLP's time.
        - `line_search`: set each newborn's weight by the line search above (default
          `True`); `False` leaves it at 0 for the optimiser.
        - `births`: most births per check (default 3): a bank far from its data grows
          several atoms at once; 1 grows one atom per plateau.
        - `adapter`, `retract`, `n_points`: as for `TransitionHook`.

        **Raises:** `ValueError` naming the argument for a value outside these ranges;
        `TypeError` when `objective` is not callable; and, as for `TransitionHook`, at the
        first call when the processes of a multi-process run gave different domains, or with
        `merge_into="pair"` when a bank was built with `max_pairs=0`.
        """
        from confluent_bank._growing import GrowingHook  # the policy imports this module

        return GrowingHook(
            objective,
            domain,
            every=every,
            max_active=max_active,
            plateau=plateau,
            stop_tol=stop_tol,
            n_centers=n_centers,
            scales=scales,
            orders=orders,
            prune_tol=prune_tol,
            prune_checks=prune_checks,
            merge_distance=merge_distance,
            merge_into=merge_into,
            line_search=line_search,
            births=births,
            adapter=adapter,
            retract=retract,
            n_points=n_points,
        )

    def state_dict(self) -> dict[str, Any]:
        """The hook's state as JSON-serialisable data: `{"events": [...]}` for a plain hook.

        Save it beside the bank's checkpoint; `load_state_dict` on a hook built with the same
        arguments resumes it.
        """
        return {"events": [dataclasses.asdict(event) for event in self.events]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (the events; a policy's counters as well).

        **Raises:** `ValueError` when `state` is not a mapping with an `"events"` list of
        event dicts.
        """
        try:
            events = [TransitionEvent(**event) for event in state["events"]]
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"TransitionHook.load_state_dict: state must be what state_dict() returned, "
                f"a mapping with an 'events' list of event dicts ({error})"
            ) from None
        self.events = events

    def between_steps(self, step: int, predictors: Any, opt_state: Any) -> tuple[Any, Any]:
        """Visit every bank: propose, commit, record; retract. Returns `(predictors, state)`.

        Raises `ValueError` when `predictors` hold no bank, and `TypeError` for a bank
        filtered by `eqx.filter` (its integer and bool blocks `None`), naming its path.
        """
        leaves, treedef, banks = flatten_banks(predictors)
        self._check_domains(leaves, banks)
        for i in banks:
            path, bank = jax.tree_util.keystr(leaves[i][0]), leaves[i][1]
            # One host transaction per bank: the policy's proposals, the commit and its
            # acceptance bounds share one device read and one digest.
            with transaction(bank):
                proposal = self.propose(step, path, bank)
                if proposal is None:
                    continue
                if not isinstance(proposal, TransitionProposal):
                    raise TypeError(
                        f"TransitionHook: propose returned {type(proposal).__name__} for the "
                        f"bank at {path or '<root>'} after step {step}; expected a "
                        "TransitionProposal or None"
                    )
                opt_state, _ = self._commit_one(
                    step, leaves, treedef, i, proposal, opt_state, len(banks)
                )
        if self.retract:
            for i in banks:
                leaves[i] = (leaves[i][0], leaves[i][1].retract())
        return treedef.unflatten([leaf for _, leaf in leaves]), opt_state

    def _check_domains(self, leaves: list[tuple[Any, Any]], banks: list[int]) -> None:
        """Every visited bank has a domain; at the first call, every process has the same."""
        self._domains.check([jax.tree_util.keystr(leaves[i][0]) for i in banks])
        if not self._agreed:
            self._domains.agree_across_processes()
            self._agreed = True

    def _commit_one(
        self,
        step: int,
        leaves: list[tuple[Any, Any]],
        treedef: Any,
        i: int,
        proposal: TransitionProposal,
        opt_state: Any,
        n_banks: int,
        *,
        score: float | None = None,
        before: float | None = None,
        unchanged: bool = False,
    ) -> tuple[Any, bool]:
        """Commit `proposal` to the bank at `leaves[i]` (replaced in place) and record it.

        `before` is the objective already known at these predictors; with `unchanged` (an
        exact kind) it is recorded as `loss_after` too, without a second evaluation.
        """
        path, bank = jax.tree_util.keystr(leaves[i][0]), leaves[i][1]
        with transaction(bank):
            if before is None and self.objective is not None:
                before = float(self.objective(treedef.unflatten([x for _, x in leaves])))
            new_bank, opt_state, accepted = commit_transition(
                bank,
                proposal,
                opt_state,
                between_steps=True,
                acceptance=self._acceptance(path),
                state_adapter=self._adapter(path, n_banks, opt_state),
            )
        leaves[i] = (leaves[i][0], new_bank)
        after = before
        if accepted and self.objective is not None and not unchanged:
            after = float(self.objective(treedef.unflatten([leaf for _, leaf in leaves])))
        self.events.append(
            TransitionEvent(
                step=int(step),
                path=path,
                kind=proposal.kind,
                slots=tuple(int(s) for s in proposal.slot_ids),
                accepted=bool(accepted),
                max_change=self._change(path, bank, new_bank) if accepted else 0.0,
                loss_before=before,
                loss_after=after,
                score=score,
            )
        )
        return opt_state, bool(accepted)

    def _adapter(
        self, path: str, n_banks: int, opt_state: Any
    ) -> OptimizerStateAdapter[Any] | None:
        if self.adapter is not None:
            return self.adapter(path)
        if isinstance(opt_state, NamedMomentState):
            return None  # commit_transition resets a NamedMomentState itself
        import confluent_bank.optax as cbo  # an optional extra: imported only when needed

        # One bank is found wherever the optimiser's params put it; several need their paths.
        return cbo.commit_adapter(path=path if n_banks > 1 else None)

    def _acceptance(self, path: str) -> Callable[[ConfluentPackBank, TransitionProposal], bool]:
        """The user's `acceptance`, or the default for the bank at `path` (one per domain)."""
        if self._user_acceptance is not None:
            return self._user_acceptance
        domain = self._domains.of(path)
        if domain not in self._acceptances:
            self._acceptances[domain] = self._default_acceptance(domain)
        return self._acceptances[domain]

    def _default_acceptance(
        self, domain: Domain
    ) -> Callable[[ConfluentPackBank, TransitionProposal], bool]:
        return within_error_budget(domain)

    def _change(self, path: str, before: ConfluentPackBank, after: ConfluentPackBank) -> float:
        grid = jnp.linspace(*self._domains.of(path), self.n_points, dtype=before.centers.dtype)
        return float(jnp.max(jnp.abs(after.forward(grid) - before.forward(grid))))
