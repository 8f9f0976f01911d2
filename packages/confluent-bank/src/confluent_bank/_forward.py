"""The forward pass of a bank: every slot's term and their sum.

Every ordinary and moment slot is a combination of derivative rows, `Σ_k a_k σ^(k)(u)` with
`a = w·s^n` on row `n` (ordinary) or the moments, and all of them are evaluated at once as one
series per slot (`_activations._SERIES`: a polynomial in `σ(u)` whose coefficients are the
combination of the Riccati polynomials), elementwise over `(P, *z.shape)`. The program therefore
depends neither on the capacity `P` nor on the orders the slots hold, and its `z`-derivative is
the same series shifted by one row. The centred pairs' formulas run in a `lax.cond`, only while
a pair is active; the branch is chosen at run time from the traced metadata, so commits never
recompile. A bank built with `max_pairs` runs them on that many rows only, into which the active
pairs are gathered; one built with `max_pairs=0` holds no pair and has no pair code at all.

The bank is duck-typed (its blocks, `base`, `max_order` and `max_pairs`), so this module does not
import `_bank`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank._activations import _SERIES, get_activation, sigma_tower_rows
from confluent_bank._atoms import _moment_sum, _pair_limit, _pair_terms, retract_spread
from confluent_bank._host import PARAMETER_NAMES
from confluent_bank._records import SlotMode

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank


def bank_slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot's term, shape `(P, *z.shape)`; inactive slots give exact zeros.

    With `u = scales·(z − centers)` (shape `(P, *z.shape)`), an ordinary slot of order `n` is
    `w·s^n·σ^(n)(u)` and a moment slot `Σ_k M_k σ^(k)(u)`: both are evaluated for all slots at
    once as one series in the derivative rows per slot, a polynomial in `σ(u)` whose
    coefficients combine the rows' Riccati polynomials (spec 7.3). So every slot costs one
    activation and one polynomial in it of degree `max_order + 1`, whatever its order or kind
    (`_activations._riccati_series`), and the values agree with the rows of `sigma_tower`
    combined one by one to rounding (the rows carry coefficients up to ~1e6 at order 8, so both
    round by ~eps·Σ|coefficients| there).
    Rows of order `n ≥ 1` share the factor `σ'(u)`, taken out exactly, so where the activation
    has saturated they are exactly 0, as the rows are. The centred pairs' formulas run only
    while a pair is active (a `lax.cond` on the traced metadata, rematerialised in reverse
    mode), so a commit never recompiles; with `bank.max_pairs` set, on that many gathered rows
    instead of every slot (the same values bit for bit), and with `max_pairs=0` nowhere: such a
    bank has no pair code. A bank edited by hand to hold more active pairs than `max_pairs`
    gives NaN for the pairs beyond it. Jitted (one compilation per input shape and bank
    configuration), so eager calls are fast as well.

    At `z = ±∞` every slot gives its limit (`w·σ(±∞)` for order 0, 0 for higher orders, the
    limits of both activations of a pair, `M_0·σ(±∞)` for moments), with finite gradients. A
    slot whose scale is 0 is constant in `z`; only a collided pair with scale 0 and a non-zero
    direction has no finite limit (`±∞`).

    **Arguments:**

    - `bank`: the bank.
    - `z`: input array of any shape.
    """
    return _slot_terms(bank, jnp.asarray(z))


def _finite_argument(bank: ConfluentPackBank, z: Array) -> Array:
    """`u = s·(z − c)`, shape `(P, *z.shape)`, for finite `z`."""
    per_slot = (slice(None),) + (None,) * z.ndim  # (P,) -> (P, 1, ..., 1)
    # z[None]: an explicit slot axis, so the bank runs under jax_numpy_rank_promotion="raise".
    return bank.scales[per_slot] * (z[None] - bank.centers[per_slot])


def _argument(bank: ConfluentPackBank, z: Array) -> Array:
    """`u = s·(z − c)`, shape `(P, *z.shape)`, with `u = ±∞` at `z = ±∞` for `s ≠ 0`.

    There every tower row takes its limit (`σ^(k)(±∞) = 0` for `k ≥ 1`), and `u` does not depend
    on `s`, `c` or `z`: the limit is constant in them, and `∂u/∂s = z − c` would meet `0·∞`.
    """
    per_slot = (slice(None),) + (None,) * z.ndim
    infinite = jnp.isinf(z)[None]
    scales = bank.scales[per_slot]
    u = _finite_argument(bank, jnp.where(infinite[0], jnp.zeros_like(z), z))
    limit = jnp.where((scales > 0) == (z[None] > 0), np.inf, -np.inf).astype(u.dtype)
    return jnp.where(infinite & (scales != 0), limit, u)


def _series_coefficients(bank: ConfluentPackBank) -> Array:
    """Each slot's term as a combination of tower rows, shape `(max_order + 1, P)`: an ordinary
    slot of order n is `w·s^n` on row n, a moment slot its moments; pairs get zeros."""
    rows = []
    for k in range(bank.max_order + 1):
        ordinary = jnp.where(bank.orders == k, bank.weights * bank.scales**k, 0.0)
        moment = jnp.where(bank.modes == SlotMode.MOMENTS, bank.moment_coefficients[:, k], 0.0)
        rows.append(jnp.where(bank.modes == SlotMode.ORDINARY, ordinary, moment))
    return jnp.stack(rows)


def _combined_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Ordinary and moment slots (pairs give zeros): one series in the tower rows per slot."""
    per_slot = (slice(None), slice(None)) + (None,) * z.ndim
    coefficients = _series_coefficients(bank)[per_slot]
    return _SERIES[bank.base](coefficients, _argument(bank, z))


def _pair_slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot as a centred pair, shape `(P, *z.shape)` (only the pair slots' are used)."""
    per_slot = (slice(None),) + (None,) * z.ndim
    # The formulas see finite inputs: at z = ±∞ they meet 0·∞ (in η = v·z + d and in
    # ∂u/∂s = z − c), which would poison values and gradients. The limits replace them below.
    finite = jnp.where(jnp.isinf(z), jnp.zeros_like(z), z)
    argument = _finite_argument(bank, finite)
    tower = sigma_tower_rows(get_activation(bank.base), argument, 1)
    eta = bank.directions[per_slot] * finite[None] + bank.direction_bias[per_slot]
    first, second = _pair_terms(bank.base, argument, bank.rho[per_slot], eta, tower)
    return bank.weights[per_slot] * first + bank.odd_moments[per_slot] * second


def _pair_limits(bank: ConfluentPackBank, direction: float | Array) -> tuple[Array, Array]:
    """Every slot's pair term as `z → direction·∞`, shape `(P,)`, and where it replaces the
    value computed at the stand-in `z = 0` (everywhere but `s = 0` with `v = 0`, which does not
    depend on `z`)."""
    spec = get_activation(bank.base)
    s, v, m1 = bank.scales, bank.directions, bank.odd_moments
    first, second = _pair_limit(spec, direction, s, bank.centers, bank.rho, v, bank.direction_bias)
    pair = bank.weights * first + m1 * second
    # s = 0, ρ = 0, v ≠ 0: B = η σ'(0) grows without bound; comparisons only, so no gradient
    # meets the infinity.
    divergent = (s == 0) & (retract_spread(bank.rho) == 0) & (v != 0) & (m1 != 0)
    unbounded = jnp.where(m1 * v * direction > 0, np.inf, -np.inf).astype(pair.dtype)
    return jnp.where(divergent, unbounded, pair), (s != 0) | (v != 0)


# What a pair reads: every trainable block but the moment rows.
_LANE_BLOCKS = tuple(name for name in PARAMETER_NAMES if name != "moment_coefficients")


@jax.jit
def _slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    per_slot = (slice(None),) + (None,) * z.ndim
    value = _combined_terms(bank, z)
    lanes = bank.max_pairs
    if lanes == 0:
        # No pair code at all: a bank that never holds a pair compiles none (the pair branch,
        # limits included, was about 1.7 s of a 4.7 s compile of the integration example's
        # gradient, though it never ran). A hand-edited bank holding a pair anyway gets NaN
        # there, not a missing term.
        pair = jnp.full_like(value, np.nan)
    elif lanes is None or lanes >= bank.scales.shape[0]:
        pair = _every_slot_pairs(bank, z)
    else:
        pair = _gathered_pairs(bank, z, lanes)
    value = jnp.where((bank.modes == SlotMode.PAIR)[per_slot], pair, value)
    return jnp.where(bank.active[per_slot], value, jnp.zeros_like(value))


def _pair_branch(bank: ConfluentPackBank, z: Array, lanes: int) -> Array:
    """The pair formulas on `bank`'s `lanes` rows, only while a pair is active: a run-time
    branch on the traced metadata, so a commit never recompiles, rematerialised in reverse
    mode (a cond otherwise makes the other branch output the pair's residuals too, zero-filled
    on CPU). The cond already keeps the recomputation apart from the forward, so no
    optimisation barrier (`prevent_cse`) is needed, and one would stop XLA fusing the
    recomputation (it made the mixed bank's gradient 1.6x slower in
    `benchmarks/bank_forward.py --simple`)."""
    pairs = jnp.any(bank.active & (bank.modes == SlotMode.PAIR))

    def no_pairs(bank: ConfluentPackBank, z: Array) -> Array:
        return jnp.zeros((lanes, *z.shape), dtype=jnp.result_type(bank.scales, z))

    rematerialised = jax.checkpoint(_pair_slot_terms, prevent_cse=False)
    return jax.lax.cond(pairs, rematerialised, no_pairs, bank, z)


def _with_limits(bank: ConfluentPackBank, z: Array, pair: Array) -> Array:
    """`pair` (shape `(P, *z.shape)`, one row per slot of `bank`) with each slot's limit at
    `z = ±∞`; both limits in one vectorised trace (one copy of the limit formulas)."""
    per_slot = (slice(None),) + (None,) * z.ndim
    directions = jnp.asarray([1.0, -1.0], dtype=bank.scales.dtype)
    limits, replaced = jax.vmap(_pair_limits, in_axes=(None, 0))(bank, directions)
    for index, direction in enumerate((1.0, -1.0)):
        at_limit = (z == direction * np.inf)[None] & replaced[index][per_slot]
        pair = jnp.where(at_limit, limits[index][per_slot], pair)
    return pair


def _every_slot_pairs(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot's pair term, shape `(P, *z.shape)` (a bank without `max_pairs`)."""
    return _with_limits(bank, z, _pair_branch(bank, z, bank.scales.shape[0]))


def _gathered_pairs(bank: ConfluentPackBank, z: Array, lanes: int) -> Array:
    """The pair terms of the first `lanes` active pairs, shape `(P, *z.shape)` (zeros elsewhere).

    Inside an ODE the pair formulas cost in proportion to the slots they run on (about
    `lanes/P` of the every-slot branch plus a fixed part, `benchmarks/bank_in_ode.py`), so the
    active pairs' parameters are gathered into `lanes` rows, evaluated there and put back.
    Gathering and putting back are masked sums with one-hot weights (elementwise, so XLA fuses
    them; their gradients reach the gathered slots only). Empty rows hold all-zero parameters,
    which the formulas evaluate to finite values that nothing reads. A pair beyond the first
    `lanes` (only a bank edited by hand gets one: commits refuse it) gives NaN, not a silently
    missing term.
    """
    per_slot = (slice(None),) + (None,) * z.ndim
    is_pair = bank.active & (bank.modes == SlotMode.PAIR)
    rank = jnp.cumsum(is_pair) - 1
    one_hot = is_pair[None, :] & (rank[None, :] == jnp.arange(lanes)[:, None])  # (lanes, P)

    def gather(block: Array) -> Array:
        return jnp.sum(jnp.where(one_hot, block[None, :], jnp.zeros_like(block)[None, :]), axis=1)

    rows = dataclasses.replace(bank, **{name: gather(getattr(bank, name)) for name in _LANE_BLOCKS})
    lane = _with_limits(rows, z, _pair_branch(rows, z, lanes))
    per_lane = (slice(None), slice(None)) + (None,) * z.ndim
    picked = jnp.where(one_hot[per_lane], lane[:, None], jnp.zeros_like(lane)[:, None])
    pair = jnp.sum(picked, axis=0)
    beyond = is_pair & (rank >= lanes)
    return jnp.where(beyond[per_slot], jnp.full_like(pair, np.nan), pair)


def _all_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot through one tower of height `max(max_order, 1)` and all three kinds' formulas,
    row by row, selected by mode (no limits at `±∞`, no activity mask): the reference the
    forward agrees with to rounding (tests, benchmarks)."""
    order = bank.max_order
    per_slot = (slice(None),) + (None,) * z.ndim
    argument = _finite_argument(bank, z)
    tower = sigma_tower_rows(get_activation(bank.base), argument, max(order, 1))
    ordinary = jnp.zeros_like(tower[0])
    for k in range(order + 1):
        value = (bank.weights * bank.scales**k)[per_slot] * tower[k]
        ordinary = ordinary + jnp.where((bank.orders == k)[per_slot], value, 0.0)
    eta = bank.directions[per_slot] * z[None] + bank.direction_bias[per_slot]
    first, second = _pair_terms(bank.base, argument, bank.rho[per_slot], eta, tower)
    pair = bank.weights[per_slot] * first + bank.odd_moments[per_slot] * second
    rows: Sequence[Array] = [bank.moment_coefficients[:, k][per_slot] for k in range(order + 1)]
    moments = _moment_sum(rows, tower)
    modes = bank.modes[per_slot]
    return jnp.where(
        modes == SlotMode.ORDINARY, ordinary, jnp.where(modes == SlotMode.PAIR, pair, moments)
    )


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


# Banks up to this many slots sum them in straight-line adds; wider ones in a loop over blocks.
_UNROLLED_SLOTS = 128
_BLOCK = 16


@jax.custom_jvp
def _slot_order_sum(terms: Array) -> Array:
    # Accumulate in slot order (0 + term_0 + term_1 + ...): a fused XLA reduction may associate
    # differently, and the spec's regression values pin this order. A scan keeps the traced
    # program independent of P; unrolled, it compiles to P adds instead of a while loop, which
    # inside a solver's loop costs more to compile and to run. Beyond 128 slots the adds run
    # in a loop over blocks of 16, still in slot order: the growing hook scores its candidates
    # on a bank of P + 164 slots, whose gradient through the integration example's ODE took
    # 21.7-22.5 s of XLA compile with every add unrolled and 11.8-13.6 s in blocks. XLA fuses
    # the terms differently, so such a bank's value may differ from the sum of its
    # `slot_terms` by an ulp; banks up to 128 slots agree with it bit for bit.
    unroll = True if terms.shape[0] <= _UNROLLED_SLOTS else _BLOCK
    total, _ = jax.lax.scan(
        lambda acc, term: (acc + term, None), jnp.zeros_like(terms[0]), terms, unroll=unroll
    )
    return total


@_slot_order_sum.defjvp
def _slot_order_sum_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    # The sum is linear, so its tangent (and hence its transpose, a broadcast) needs no loop.
    (terms,), (dterms,) = primals, tangents
    return _slot_order_sum(terms), jnp.sum(dterms, axis=0)
