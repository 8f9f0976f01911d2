"""The forward pass of a bank: every slot's term and their sum.

The forward pass evaluates ONE derivative tower for all slots at once, as rows of shape
`(P, *z.shape)`, and selects each slot's order and mode by masked sums and `where` over constant
coefficient arrays. The traced program therefore does not grow with the capacity `P`: compile
time is independent of `max_packs`. The tower's height is what the active slots need, chosen at
run time from the traced metadata (so commits never recompile): 0 or 3 for low-order ordinary
slots, and `max_order` for ordinary and moment slots (moments use rows `0..max_order` only). The
centred pair reads rows 0 and 1 only (`_atoms._pair_terms`), so the full branch, taken while a
pair is active, has height `max(max_order, 1)` and adds the pair formulas.

The bank is duck-typed (its blocks, `base` and `max_order`), so this module does not import
`_bank`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank._activations import get_activation, sigma_tower_rows
from confluent_bank._atoms import _moment_sum, _pair_limit, _pair_terms, retract_spread
from confluent_bank._records import SlotMode

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

_LOW_ORDER = 3  # the short tower of the cheap ordinary branch


def bank_slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot's term, shape `(P, *z.shape)`; inactive slots give exact zeros.

    One tower `sigma_tower_rows(base, u, K)` is evaluated for all slots at once on
    `u = scales·(z − centers)` (rows of shape `(P, *z.shape)`) and feeds the ordinary,
    centred-pair and moment terms; the ordinary order is selected by masks, the mode by `where`.
    `K` is the lowest height that holds what the active slots need, and only those terms are
    computed: 0 or `min(max_order, 3)` when every active slot is ordinary of that order or
    less; `max_order` when no centred pair is active (ordinary and moment slots); `max(max_order,
    1)` with the pair formulas when one is. The branches evaluate the same formulas, so they
    agree to rounding: XLA contracts products and sums into fused multiply-adds differently in
    differently shaped programs, so a value may move by an ulp or two when a commit changes the
    branch. The branch is a `lax.switch` on the traced metadata (each branch rematerialised in
    reverse mode), so a commit never recompiles.
    Jitted (one compilation per input shape and bank configuration), so eager calls are fast as
    well.

    At `z = ±∞` every slot gives its limit (`w·σ(±∞)` for order 0, 0 for higher orders, the
    limits of both activations of a pair, `M_0·σ(±∞)` for moments), with finite gradients. A
    slot whose scale is 0 is constant in `z`; only a collided pair with scale 0 and a non-zero
    direction has no finite limit (`±∞`).

    **Arguments:**

    - `bank`: the bank.
    - `z`: input array of any shape.
    """
    return _slot_terms(bank, jnp.asarray(z))


def _ordinary_heights(max_order: int) -> tuple[int, ...]:
    # The tower heights of the cheap ordinary branches: order-0 slots need the activation only,
    # low orders a short tower. Height max_order is the mixed branch's (ordinary and moment
    # slots), which computes an ordinary slot by the same formula, so it has no branch of its own.
    return tuple(sorted({0, min(max_order, _LOW_ORDER)} - {max_order}))


def _branch(bank: ConfluentPackBank, heights: tuple[int, ...]) -> Array:
    """Index of the cheapest branch that computes every active slot exactly (a traced int).

    `0 .. len(heights) − 1`: ordinary slots only, by their highest order; `len(heights)`: no
    pair (ordinary and moment slots, any order); `len(heights) + 1`: the full branch.
    """
    live = bank.active
    simple = jnp.all(~live | (bank.modes == SlotMode.ORDINARY))
    top = jnp.max(jnp.where(live, bank.orders, jnp.zeros_like(bank.orders)))
    ordinary = jnp.sum(jnp.asarray(heights, dtype=top.dtype) < top)  # the first height >= top
    pairs = jnp.sum(live & (bank.modes == SlotMode.PAIR))
    mixed = len(heights) + jnp.where(pairs == 0, 0, 1)
    return jnp.where(simple, ordinary, mixed)  # ordinary == len(heights): no pair, so mixed


def _argument(bank: ConfluentPackBank, z: Array) -> Array:
    per_slot = (slice(None),) + (None,) * z.ndim  # (P,) -> (P, 1, ..., 1)
    # z[None]: an explicit slot axis, so the bank runs under jax_numpy_rank_promotion="raise".
    return bank.scales[per_slot] * (z[None] - bank.centers[per_slot])


def _ordinary(bank: ConfluentPackBank, z: Array, tower: Sequence[Array], height: int) -> Array:
    # w · s^n · σ^(n)(u), n selected per slot by masks over 0..height (an order outside gives 0,
    # as in the reference).
    per_slot = (slice(None),) + (None,) * z.ndim
    ordinary = jnp.zeros_like(tower[0])
    for k in range(height + 1):
        value = (bank.weights * bank.scales**k)[per_slot] * tower[k]
        selected = (bank.orders == k)[per_slot]
        ordinary = ordinary + jnp.where(selected, value, jnp.zeros_like(value))
    return ordinary


def _ordinary_terms(bank: ConfluentPackBank, z: Array, *, height: int) -> Array:
    """The cheap branch: every active slot is ordinary with an order `<= height`."""
    tower = sigma_tower_rows(get_activation(bank.base), _argument(bank, z), height)
    return _ordinary(bank, z, tower, height)


def _mixed_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """No pair slot: ordinary and moment terms from one tower of height `max_order`."""
    order = bank.max_order
    per_slot = (slice(None),) + (None,) * z.ndim
    tower = sigma_tower_rows(get_activation(bank.base), _argument(bank, z), order)
    ordinary = _ordinary(bank, z, tower, order)
    moments = _moment_sum(
        [bank.moment_coefficients[:, k][per_slot] for k in range(order + 1)], tower
    )
    return jnp.where((bank.modes == SlotMode.ORDINARY)[per_slot], ordinary, moments)


def _all_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot through one tower of height `max(max_order, 1)` and all three kinds' formulas,
    selected by mode: the reference the branches agree with to rounding (tests, benchmarks)."""
    spec = get_activation(bank.base)
    order = bank.max_order
    per_slot = (slice(None),) + (None,) * z.ndim
    argument = _argument(bank, z)
    # One tower for all slots, as K + 1 rows of shape (P, *z.shape); the pair reads rows 0 and 1
    # only (its values at ρ = 0). Every combination below is elementwise over (P, *z.shape) with
    # loops only over orders and series terms, so the traced program is independent of P and XLA
    # fuses the slot computation and its gradient.
    tower = sigma_tower_rows(spec, argument, max(order, 1))
    ordinary = _ordinary(bank, z, tower, order)

    eta = bank.directions[per_slot] * z[None] + bank.direction_bias[per_slot]
    first, second = _pair_terms(bank.base, argument, bank.rho[per_slot], eta, tower)
    pair = bank.weights[per_slot] * first + bank.odd_moments[per_slot] * second

    rows = [bank.moment_coefficients[:, k][per_slot] for k in range(order + 1)]
    moments = _moment_sum(rows, tower)

    modes = bank.modes[per_slot]
    return jnp.where(
        modes == SlotMode.ORDINARY, ordinary, jnp.where(modes == SlotMode.PAIR, pair, moments)
    )


def _limits(bank: ConfluentPackBank, direction: float | Array) -> tuple[Array, Array]:
    """Every slot's term as `z → direction·∞`, shape `(P,)`, and where it replaces the value
    computed at the stand-in `z = 0` (slots with `s = 0` do not depend on `z`, unless they are a
    pair whose `η` grows)."""
    spec = get_activation(bank.base)
    s, v = bank.scales, bank.directions
    infinity = jnp.asarray(direction * np.inf, dtype=s.dtype)
    # For s ≠ 0 every row σ^(k)(±∞) with k ≥ 1 is 0: only order-0 and moment row 0 survive.
    edge = spec.forward(jnp.where(s > 0, infinity, -infinity))
    ordinary = jnp.where(bank.orders == 0, bank.weights * edge, jnp.zeros_like(edge))
    moments = bank.moment_coefficients[:, 0] * edge
    first, second = _pair_limit(spec, direction, s, bank.centers, bank.rho, v, bank.direction_bias)
    pair = bank.weights * first + bank.odd_moments * second
    # s = 0, ρ = 0, v ≠ 0: B = η σ'(0) grows without bound; comparisons only, so no gradient
    # meets the infinity.
    m1 = bank.odd_moments
    divergent = (s == 0) & (retract_spread(bank.rho) == 0) & (v != 0) & (m1 != 0)
    unbounded = jnp.where(m1 * v * direction > 0, np.inf, -np.inf).astype(pair.dtype)
    pair = jnp.where(divergent, unbounded, pair)
    modes = bank.modes
    value = jnp.where(
        modes == SlotMode.ORDINARY, ordinary, jnp.where(modes == SlotMode.PAIR, pair, moments)
    )
    replaced = (s != 0) | ((modes == SlotMode.PAIR) & (v != 0))
    return value, replaced


@jax.jit
def _slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    per_slot = (slice(None),) + (None,) * z.ndim
    # Every branch sees finite inputs: at z = ±∞ the formulas meet 0·∞ (in η = v·z + d and in
    # ∂u/∂s = z − c), which would poison values and gradients. The limits replace them below.
    infinite = jnp.isinf(z)
    finite = jnp.where(infinite, jnp.zeros_like(z), z)
    # The branch is chosen at run time from the traced metadata, so commits never recompile; a
    # bank without pairs skips the high tower rows and the pair formulas.
    heights = _ordinary_heights(bank.max_order)
    branches = [functools.partial(_ordinary_terms, height=h) for h in heights]
    # Rematerialised: in reverse mode a cond otherwise makes every branch output the residuals of
    # all branches (zero-filled on CPU), so the order-0 branch would write the ~70 (P, *z.shape)
    # residuals of the full one. Recomputing a branch in the backward pass costs less than
    # storing them, for the full branch too (benchmarks/bank_forward.py --simple).
    branches = [jax.checkpoint(branch) for branch in (*branches, _mixed_terms, _all_terms)]
    value = jax.lax.switch(_branch(bank, heights), branches, bank, finite)
    # Both limits in one vectorised trace (one copy of the limit formulas in the program).
    directions = jnp.asarray([1.0, -1.0], dtype=bank.scales.dtype)
    limits, replaced = jax.vmap(_limits, in_axes=(None, 0))(bank, directions)
    for index, direction in enumerate((1.0, -1.0)):
        at_limit = (z == direction * np.inf)[None] & replaced[index][per_slot]
        value = jnp.where(at_limit, limits[index][per_slot], value)
    return jnp.where(bank.active[per_slot], value, jnp.zeros_like(value))


def bank_forward(bank: ConfluentPackBank, z: Array) -> Array:
    """The represented function `f(z) = Σ_i term_i(z)`, shape `z.shape`.

    **Arguments:**

    - `bank`: the bank.
    - `z`: input array of any shape.
    """
    return _forward(bank, jnp.asarray(z))


@jax.jit
def _forward(bank: ConfluentPackBank, z: Array) -> Array:
    return _slot_order_sum(_slot_terms(bank, z))


@jax.custom_jvp
def _slot_order_sum(terms: Array) -> Array:
    # Accumulate in slot order (0 + term_0 + term_1 + ...) inside a scan: a fused XLA reduction
    # may associate differently, and the spec's regression values pin this order. The scan keeps
    # the program size independent of P.
    total, _ = jax.lax.scan(lambda acc, term: (acc + term, None), jnp.zeros_like(terms[0]), terms)
    return total


@_slot_order_sum.defjvp
def _slot_order_sum_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    # The sum is linear, so its tangent (and hence its transpose, a broadcast) needs no loop.
    (terms,), (dterms,) = primals, tangents
    return _slot_order_sum(terms), jnp.sum(dterms, axis=0)
