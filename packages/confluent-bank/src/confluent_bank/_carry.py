"""Carrying optimizer moments through a committed transition's change of coordinates.

A transition replaces the parameters `θ` of its slots by new ones `φ`. Where the function is
kept (pair, cluster up to its remainder), the gradients are related by the chain rule, so the
optimizer's statistics of the gradient can follow instead of restarting at zero:

* **Exact reparametrisations** (the centred pair). The old atoms are a smooth function
  `θ = S(φ)` of the new coordinates with `f_new(φ) = f_old(S(φ))`, so with `K = ∂S/∂φ`
  the new gradient is exactly `g_φ = Kᵀ g_θ`. First moments (and momenta, accumulated
  gradients) are linear in the gradient and move exactly: `μ_φ = Kᵀ μ_θ`.
* **Truncations** (the cluster). The new coordinates are `φ = T(θ)` with
  `f_old ≈ f_new ∘ T`, so `g_θ ≈ Jᵀ g_φ` with `J = ∂T/∂θ`; the least-squares solution is
  `g_φ = (Jᵀ)⁺ g_θ` (the pseudo-inverse), which is `Kᵀ g_θ` whenever `T` is invertible.
* **Second moments.** `E[g_φ g_φᵀ] = G E[g_θ g_θᵀ] Gᵀ` for the linear map `G` above, but the
  optimizer keeps only the diagonal `ν_θ`. The carry uses the Cauchy–Schwarz bound
  `ν_φ,k = (Σ_o |G_ko| √ν_θ,o)²`, the diagonal of the transformed outer product when the
  old gradients are fully correlated. It is never smaller than the true value (for any
  correlation), so the first steps after a commit are never larger than the old ones;
  and since `|μ_θ,o| ≤ √ν_θ,o` for Adam-like moments, `|μ_φ,k| ≤ √ν_φ,k` stays true.
* **Fresh coordinates** no old coordinate determines (a birth's whole slot, a pair's
  `directions`, an unknown proposal kind's slots) start with zero first moments and are
  listed in `TransitionCarry.fresh` so a warm-up (`confluent_bank.optax.row_warmup`) can
  ramp their updates in. Their second moments are seeded from their siblings (the same
  block and column of the other active slots), `ν_new = (Σ_o √ν_o)²`: a newborn weight's
  gradient has the scale of the other weights' gradients, and an adaptive optimizer with
  `ν = 0` would otherwise take a full learning-rate step whatever the gradient's size. The
  sum, not the mean, is the transport's own bound with unit coefficients: a conservative
  seed, since adabelief's `ν` (the variance of a converged gradient) is tiny and a mean
  seed let its newborn slot drift into a growing oscillation (2.6× the control's loss within
  50 steps in the spike problem; 1.0× with the sum).
  Rows of switched-off slots are zeroed (they no longer affect the loss).
* **A pair's own seeds.** Siblings seed a pair's `directions` `v` with nothing (an
  ordinary atom's `∂f/∂v` is 0). In `η = v·z + d`, `∂f/∂v = z·∂f/∂d` pointwise, so `v`'s
  curvature is `z²` times `d`'s; its step `∝ μ/√ν` moves `η` at the pair's reach
  `|z| ≈ |c| + (h + 1)/|s|` no more than `d`'s step moves it everywhere only if
  `√ν_v ≥ z_reach²·√ν_d`, and that is its seed (units-consistent: inputs ×100 shrink its
  step ×100). With `ν_v = 0` a converged fit on inputs in the hundreds jumped 390× within
  50 Adam steps. Two atoms at one centre (`h = 0`) carry `m1` exactly
  (`∂f/∂m1 = −∂f/∂c/(s·m0)` there), seed `ρ` by `max|σ''/σ'|/(2|s|)` times the centres'
  root moments, and seed `d` and `v` as a pair opened to `h = 1` would be; without these the
  next 50 Adam losses rose 35×.
* A **derivative** (`ρ → 0`) keeps its coordinates: its moments are left as they are.

`TransitionCarry` records this plan as sparse entries over the bank's parameter
coordinates `(block, row, column)`, on host numbers; `apply_carry` (in `_optimizer_state`)
applies it to one set of moment arrays. Both the optax adapters and `NamedMomentState` go
through `apply_carry`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from confluent_bank._host import PARAMETER_NAMES, HostView
from confluent_bank._records import TransitionKind

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank
    from confluent_bank._records import TransitionProposal

# A parameter coordinate: (block name, slot row, column; 0 for the (P,) blocks).
Coordinate = tuple[str, int, int]

_PAIR_KINDS = (TransitionKind.CENTERED_PAIR, TransitionKind.DUPLICATE_MERGE)


@dataclasses.dataclass(frozen=True)
class TransitionCarry:
    """How one committed transition moves the optimizer's per-coordinate statistics.

    **Fields:**

    - `kind`: the proposal's kind (e.g. `"centered_pair"`).
    - `slots`: the proposal's slot positions.
    - `reset`: slot rows whose moments are rebuilt (every block); all other rows are kept.
    - `entries`: `(new, old, coefficient)` triples: the new statistic at coordinate `new`
      receives `coefficient ×` the old one at `old` (the matrix `G` of the module docs).
    - `fresh`: coordinates that start from zero first moments and should be warmed in.
    - `seeds`: `(new, old, coefficient)` triples applied to second moments only: each fresh
      coordinate's second moment from its siblings (`coefficient = 1`).
    """

    kind: str
    slots: tuple[int, ...]
    reset: tuple[int, ...]
    entries: tuple[tuple[Coordinate, Coordinate, float], ...]
    fresh: tuple[Coordinate, ...]
    seeds: tuple[tuple[Coordinate, Coordinate, float], ...] = ()


# ---------------------------------------------------------------------------------------------
# The plan, on host numbers


def _value(host: Mapping[str, np.ndarray], name: str, slot: int) -> float:
    return float(np.asarray(host[name][slot], dtype=np.float64))


def _row(slot: int) -> tuple[Coordinate, ...]:
    names = ("centers", "weights", "scales")
    return tuple((name, slot, 0) for name in names)


# Entries `(new, old, coefficient)`: the matrix `G` of the module docs, sparse.
_Entries = list[tuple[Coordinate, Coordinate, float]]

# The largest |σ''/σ'| of the bank's activations (sigmoid 1, tanh 2; softplus and exp 1).
_CURVATURE_RATIO = 2.0

# The typical reach of a pair's η-derivative: its atoms at u = s·(z − c) = ±h and this many
# units of u beyond, where σ' still has 42 % (tanh) to 79 % (sigmoid) of its peak. 3 units
# (σ' under 1 %, 18 %) kept inputs in the hundreds as stable, but slowed the integration
# example's v enough to end 1.25× above its control, against 1.12× with 1.
_PAIR_REACH = 1.0


def _pair_entries(
    host: Mapping[str, np.ndarray], first: int, second: int
) -> tuple[_Entries, list[Coordinate], _Entries]:
    """`Kᵀ` of the exact inverse map `S`: the pair's coordinates → its two old atoms.

    Returns `(entries, fresh, seeds)`: the carried coordinates, those with no old
    counterpart, and second-moment seeds for some of these from the pair's own old centres.
    """
    s = _value(host, "scales", first)
    c = [_value(host, "centers", i) for i in (first, second)]
    a = [_value(host, "weights", i) for i in (first, second)]
    b = [-s * ci for ci in c]
    # the "+" atom sits at σ(u + h), i.e. has the larger b = −s·c
    plus, minus = (0, 1) if b[0] >= b[1] else (1, 0)
    slot = (first, second)
    h = abs(b[0] - b[1]) / 2
    if h == 0:
        return _duplicate_entries(slot, s, c[0], a[0] + a[1])
    new = {name: (name, first, 0) for name in PARAMETER_NAMES}
    entries: _Entries = []
    m1 = h * (a[plus] - a[minus])
    e = 1.0  # the committed direction bias; directions = 0
    for j, sign in ((plus, 1.0), (minus, -1.0)):
        old_c, old_a, old_s = _row(slot[j])
        # c± = c ∓ h·e/s,  a± = (m0 ± m1/h)/2,  s± = s,  with h = √ρ
        entries += [
            (new["centers"], old_c, 1.0),
            (new["rho"], old_c, -sign * e / (2 * h * s)),
            (new["scales"], old_c, sign * h * e / s**2),
            (new["direction_bias"], old_c, -sign * h / s),
            (new["weights"], old_a, 0.5),
            (new["odd_moments"], old_a, sign / (2 * h)),
            (new["rho"], old_a, -sign * m1 / (4 * h**3)),
            (new["scales"], old_s, 1.0),
        ]
    # `directions` v is fresh: √ν_v = z_reach²·√ν_d, with √ν_d carried from the old centres
    # by the coefficient h/s above (why z_reach², see the module docs). With ν_v = 0 Adam's
    # first step in v was a full rate, and on inputs in the hundreds it moved the pair's far
    # side by order one (a PK model's loss rose 2.3× for several steps).
    z_reach = abs(sum(c) / 2) + (h + _PAIR_REACH) / abs(s)
    seeds = [(new["directions"], _row(i)[0], z_reach**2 * h / abs(s)) for i in slot]
    return entries, [new["directions"]], seeds


def _duplicate_entries(
    slot: tuple[int, int], s: float, c: float, m0: float
) -> tuple[_Entries, list[Coordinate], _Entries]:
    """`_pair_entries` for two atoms at one centre (h = 0): c± = c, a± = m0/2, s± = s.

    At ρ = m1 = 0 the pair is `m0·σ(u) + m1·η·σ'(u) + ρ·m0·η²·σ''(u)/2 + …` with η = 1, so
    `∂f/∂m1 = −∂f/∂c / (s·m0)` exactly, and `|∂f/∂ρ| ≤ |∂f/∂c|·max|σ''/σ'| / (2|s|)`
    pointwise: m1 is carried and ρ seeded from the old centres. Without them a converged
    fit's next 50 Adam losses rose 35× (`tests/test_transition_spikes.py`).
    """
    new = {name: (name, slot[0], 0) for name in PARAMETER_NAMES}
    entries: _Entries = []
    seeds: _Entries = []
    fresh = [new[name] for name in ("rho", "directions", "direction_bias")]
    z_reach = abs(c) + (1 + _PAIR_REACH) / abs(s)
    for j in (0, 1):
        old_c, old_a, old_s = _row(slot[j])
        entries += [(new["centers"], old_c, 1.0), (new["weights"], old_a, 0.5)]
        entries.append((new["scales"], old_s, 1.0))
        if m0 != 0:
            entries.append((new["odd_moments"], old_c, -1.0 / (s * m0)))
        seeds.append((new["rho"], old_c, _CURVATURE_RATIO / (2 * abs(s))))
        # d and v have no gradient until the pair opens (∂f/∂η = m1·σ'(u) + O(ρ)): seeded
        # as `_pair_entries` seeds them for a pair opened to h = 1 (m1 ~ m0).
        seeds.append((new["direction_bias"], old_c, 1 / abs(s)))
        seeds.append((new["directions"], old_c, z_reach**2 / abs(s)))
    if m0 == 0:
        fresh.append(new["odd_moments"])
    return entries, fresh, seeds


def _cluster_entries(
    host: Mapping[str, np.ndarray], slots: Sequence[int], order: int
) -> list[tuple[Coordinate, Coordinate, float]]:
    """`(Jᵀ)⁺` of the truncation `T`: the cluster's atoms → centre, moments and scale."""
    n = len(slots)
    c = np.array([_value(host, "centers", i) for i in slots])
    a = np.array([_value(host, "weights", i) for i in slots])
    s_mean = float(np.mean([_value(host, "scales", i) for i in slots]))
    c_mean = float(np.mean(c))
    delta = s_mean * (c_mean - c)
    old = [coordinate for i in slots for coordinate in _row(i)]
    first = slots[0]
    new = [("centers", first, 0), ("scales", first, 0)]
    new += [("moment_coefficients", first, k) for k in range(order + 1)]
    jacobian = np.zeros((len(new), len(old)))  # J = ∂T/∂θ
    for j in range(n):
        jacobian[0, 3 * j] = 1 / n  # c̄ = mean c_j
        jacobian[1, 3 * j + 2] = 1 / n  # s̄ = mean s_j
    for k in range(order + 1):
        row = 2 + k
        for j in range(n):
            jacobian[row, 3 * j + 1] = delta[j] ** k / math.factorial(k)  # ∂M_k/∂a_j
        if k == 0:
            continue
        lower = a * delta ** (k - 1) / math.factorial(k - 1)  # a_j δ_j^(k−1)/(k−1)!
        for i in range(n):
            # δ_j = s̄(c̄ − c_j): ∂δ_j/∂c_i = s̄(1/n − [i = j]), ∂δ_j/∂s_i = (c̄ − c_j)/n
            jacobian[row, 3 * i] = s_mean * (np.sum(lower) / n - lower[i])
            jacobian[row, 3 * i + 2] = float(np.sum(lower * (c_mean - c))) / n
    carry = np.linalg.pinv(jacobian.T, rcond=1e-10)  # G = (Jᵀ)⁺, shape (new, old)
    return [
        (new[k], old[o], float(carry[k, o]))
        for k in range(len(new))
        for o in range(len(old))
        if carry[k, o] != 0
    ]


def _every_coordinate(slot: int, columns: int) -> list[Coordinate]:
    coordinates: list[Coordinate] = [(name, slot, 0) for name in PARAMETER_NAMES[:-1]]
    coordinates += [("moment_coefficients", slot, k) for k in range(columns)]
    return coordinates


def carry_from_host(
    host: Mapping[str, np.ndarray], proposal: TransitionProposal, slots: tuple[int, ...]
) -> TransitionCarry:
    """The plan for `proposal` (committed at positions `slots`) from the old host state."""
    kind = proposal.kind
    columns = int(np.shape(host["moment_coefficients"])[1])
    entries: _Entries = []
    fresh: list[Coordinate] = []
    own: _Entries = []
    reset = slots
    if kind in _PAIR_KINDS and len(slots) == 2:
        entries, fresh, own = _pair_entries(host, *slots)
    elif kind == TransitionKind.CLUSTER_TO_MOMENTS:
        order = next(int(u.value) for u in proposal.updates if u.name == "orders")
        entries = _cluster_entries(host, slots, order)
    elif kind == TransitionKind.PAIR_TO_DERIVATIVE:
        reset = ()  # same coordinates; only the spread's value moves
    elif kind == TransitionKind.REMOVE_ZERO:
        pass  # the slot is switched off: its statistics no longer matter
    else:  # a birth, or a kind whose coordinate change is unknown: restart and warm in
        fresh = [c for i in slots for c in _every_coordinate(i, columns)]
    siblings = [
        int(i) for i in np.flatnonzero(np.asarray(host["active"], dtype=bool)) if i not in slots
    ]
    seeds = [
        ((name, row, column), (name, other, column), 1.0)
        for name, row, column in fresh
        for other in siblings
    ] + own
    return TransitionCarry(
        kind, tuple(slots), tuple(reset), tuple(entries), tuple(fresh), tuple(seeds)
    )


def transition_carry(bank: ConfluentPackBank, proposal: TransitionProposal) -> TransitionCarry:
    """The `TransitionCarry` that committing `proposal` to `bank` would use.

    `commit_transition` builds it from its transaction's host view; this is for custom adapters
    and inspection. Reads the bank from the device once (outside a transaction).

    **Arguments:**

    - `bank`: the bank the proposal was made from.
    - `proposal`: a `TransitionProposal`.

    **Raises:** `ValueError` for a stable id the bank does not hold.
    """
    view = HostView.read(bank)
    return carry_from_host(view.host, proposal, view.positions(proposal.slot_ids))
