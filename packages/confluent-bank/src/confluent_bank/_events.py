"""What a transition hook records: one `TransitionEvent` per attempted transition."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransitionEvent:
    """One attempted transition, as a `TransitionHook` recorded it.

    **Fields:**

    - `step`: optimiser steps completed when it was attempted (the next step sees its result).
    - `path`: where the bank sits in the predictors, as `jax.tree_util.keystr` writes it.
    - `kind`: the proposal's kind (`"centered_pair"`, `"zero_output_birth"`, ...).
    - `slots`: the stable slot ids it touched.
    - `accepted`: whether it was committed.
    - `max_change`: `max |f_after(x) − f_before(x)|` over the hook's domain grid (0 when
      rejected).
    - `loss_before`, `loss_after`: the hook's `objective` at the predictors just before and
      just after the commit, or `None` without an objective.
    - `score`: why the policy made this decision, or `None` for a user policy. The growing
      policy (`TransitionHook.growing`) records, for a `"zero_output_birth"`, the normalised
      gradient `|∂objective/∂w| / ‖φ‖` of the chosen candidate; for a merge, the collision's
      distance `|s·(c₁ − c₂)|`; for a `"remove_near_zero"`, the atom's largest contribution
      `|w|·|s|ⁿ·sup|σ⁽ⁿ⁾|`; for a `"newborn_weight"` (a newborn's weight moved from 0 by a
      line search, not a commit), the weight it was given (0, refused, when no weight
      lowered the objective); for a `"stop_growing"` decision
      (no slots, nothing committed), the relative improvement of the objective since the
      last birth.

    `dataclasses.asdict(event)` is JSON-serialisable, and `TransitionEvent(**that_dict)` gives
    the event back.
    """

    step: int
    path: str
    kind: str
    slots: tuple[int, ...]
    accepted: bool
    max_change: float
    loss_before: float | None = None
    loss_after: float | None = None
    score: float | None = None

    def __post_init__(self) -> None:
        # A dict read back from JSON holds a list; the event keeps the tuple it was made with.
        object.__setattr__(self, "slots", tuple(int(i) for i in self.slots))
