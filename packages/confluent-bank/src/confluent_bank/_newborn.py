"""What a newborn atom starts with: its first weight and its optimizer moments.

A birth is exact (weight 0), and the scoring pass already gave the objective's derivative
`g` with respect to the newborn weight. Left at 0, the optimiser needs some tens of steps to
move the weight to where it helps, and a check later the policy may judge an atom that has
barely started. A trial point (backtracked until the objective falls enough) and a parabola
through `L(0)`, `L'(0) = g` and `L(w₁)` put it near its best value at the price of two
objective evaluations where the trial is good and at most five otherwise; the weight moves
only when the objective falls, so a line search never makes the objective worse.

Its optimizer moments start at zero (`Unseeded`), not seeded from its siblings, and a
`row_warmup` ramps its updates in: until that ramp is done, the newborn has not yet shown
what it does (`ramping_in`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

SUFFICIENT_DECREASE = 1e-4
"""Armijo's constant: a trial weight `w` is kept when `L(w) ≤ L(0) + 1e-4 · g · w`."""
BACKTRACKS = 3
"""Trial points after the first, each a quarter of the one before (down to 1/64 of it)."""


def newborn_weight(
    loss_at: Callable[[float], float], value: float, gradient: float
) -> tuple[float, float]:
    """The newborn weight `w` and the objective `loss_at(w)`; `(0.0, value)` if none is lower.

    **Arguments:**

    - `loss_at`: the objective with the newborn's weight set to `w`, every other parameter
      as it is.
    - `value`: `loss_at(0.0)`, already known.
    - `gradient`: `d loss_at / dw` at 0, already known (the scoring pass).

    The first trial point `w₁ = −value / gradient` is where the first-order model of the
    objective reaches zero: for a loss `≥ 0` that is quadratic in `w` it is at least half
    the minimiser. Until a trial point decreases the objective sufficiently (Armijo:
    `L(w) ≤ value + 1e-4 · gradient · w`), the next is a quarter of it, `BACKTRACKS` times;
    if none does, the weight stays 0. The parabola through `(0, value)` with slope
    `gradient` and the accepted `(w, L(w))` has its minimum `w* = −gradient / curvature`
    (for a quadratic objective the exact minimiser); `w*` is evaluated once and kept if it is
    lower. A non-finite objective counts as no better.

    The backtracking is what keeps a newborn's weight meaningful where the objective is far
    from quadratic: in an ODE, a first trial that destabilises the solution gives a huge
    objective, and a parabola through it a weight of ~1e-15 that lowers the objective by
    rounding only (seen: identical newborns born one after the other, each "lowering" the
    objective, until a merge removed them). An accepted trial bounds the curvature, so
    `|w*| ≥ |w| / 2`.

    Where the objective's floor is far above 0 (noisy data) and the candidate's gain small,
    `w₁` overshoots by more than the quarters reach (170 times on a fed-batch reactor), and
    the weight stays 0 for the optimiser to move. Backtracking by interpolation found those
    weights, but `benchmarks/growing_bank.py` met its target less often with it (29 of 40
    runs against 34), so it was not taken.
    """
    if not (math.isfinite(value) and math.isfinite(gradient)) or gradient == 0 or value <= 0:
        return 0.0, value
    trial = -value / gradient
    for _ in range(BACKTRACKS + 1):
        at_trial = loss_at(trial)
        if math.isfinite(at_trial) and at_trial <= value + SUFFICIENT_DECREASE * gradient * trial:
            break
        trial /= 4.0
    else:
        return 0.0, value
    best = (trial, at_trial)
    curvature = 2.0 * (at_trial - value - gradient * trial) / trial**2
    if math.isfinite(curvature) and curvature > 0:
        weight = -gradient / curvature
        at_weight = loss_at(weight)
        if math.isfinite(at_weight) and at_weight < best[1]:
            best = (weight, at_weight)
    return best


class Unseeded:
    """An optax commit adapter whose fresh rows start from zero moments, without seeds.

    `commit_adapter` seeds a newborn's second moments from its siblings, `√ν = Σ_o √ν_o`,
    which keeps a birth quiet; in a bank that grows to 16 atoms it makes Adam's steps on the
    newborn weight 10 to 100 times smaller than its siblings' for thousands of steps
    (β₂ = 0.999), and the newborn is removed as near zero before it has learned. Without
    seeds the fresh rows move by about the learning rate per step, ramped in by
    `row_warmup`. Measured (issue 24, one birth per plateau and no line search yet): in
    4000 Adam steps the grown bank ends at 0.25–0.88× the MLP's loss on four curves;
    seeded, it ends at 39× (wave) and 162× (kink) with the sum (newborns removed before
    they learn, then born again) and 3.8–4.4× with the mean;
    the price is a short bump after each birth, 3.1× (adam) and 3.0× (adabelief) the
    control's largest loss over the 50 steps after a birth in the spike problem of
    `benchmarks/transition_spikes.py`, where the sum gives 0.97 and 1.00.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, state: Any, bank: Any, slots: tuple[int, ...]) -> Any:
        return self.inner(state, bank, slots)

    def carry_transition(self, state: Any, bank: Any, carry: Any) -> Any:
        return self.inner.carry_transition(state, bank, dataclasses.replace(carry, seeds=()))


def ramping_in(opt_state: Any) -> bool:
    """Whether a `row_warmup` in `opt_state` is still ramping in a restarted coordinate.

    `confluent_bank.optax.RowWarmupState` is found by its type's name and its `ramp` tree, so
    this module imports no optax. Warm coordinates' counters sit at the ramp's `steps` and
    restarted ones count up to it, so a coordinate is ramping while its counter is below the
    largest counter of its state.
    """

    def is_warmup(node: Any) -> bool:
        return type(node).__name__ == "RowWarmupState" and hasattr(node, "ramp")

    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_warmup):
        if is_warmup(node):
            ramps = [np.asarray(r) for r in jax.tree_util.tree_leaves(node.ramp) if np.size(r)]
            if ramps and min(int(r.min()) for r in ramps) < max(int(r.max()) for r in ramps):
                return True
    return False
