"""`ConfluentPackBank`: a preallocated pytree of atoms whose slots are an array axis.

The forward pass evaluates ONE derivative tower of height `K = max(max_order, 11)` for all slots
at once, shape `(K + 1, P, *z.shape)`, and selects each slot's order and mode by masked sums and
`where` over constant coefficient arrays. The traced program therefore does not grow with the
capacity `P`: compile time is independent of `max_packs`. A bank whose active slots are all
ordinary of low order takes a cheaper branch at run time (a shorter tower, no pair, no moments),
chosen from the traced metadata, so commits never recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank import _proposals as proposals
from confluent_bank._activations import _finite_tower_order, get_activation, sigma_tower_rows
from confluent_bank._atoms import _moment_sum, _pair_limit, _pair_terms, retract_spread
from confluent_bank._host import (
    PARAMETER_NAMES,
    SCHEMA_VERSION,
    STATE_NAMES,
    read_host_state,
    snapshot_from_host,
)
from confluent_bank._records import RefinedPack

if TYPE_CHECKING:
    from confluent_bank._records import TransitionProposal

__all__ = [
    "PARAMETER_NAMES",
    "STATE_NAMES",
    "ConfluentPackBank",
    "bank_forward",
    "bank_slot_terms",
    "init_confluent_bank",
]

_BASES = ("sigmoid", "tanh")
_PAIR_TOWER_HEIGHT = 11  # the centred-pair series needs rows 0..2T−1 with T = 6
_LOW_ORDER = 3  # the short tower of the cheap ordinary branch
_DERIVATIVE_HEADROOM = 4  # nested derivatives of the forward that stay within the tower limit


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class ConfluentPackBank:
    """A functional bank of `P = max_packs` slots, each an ordinary atom, a centred pair or a
    truncated moment expansion (spec section 1).

    Pytree children are the fourteen state blocks in `STATE_NAMES` order (every array, including
    integer/bool metadata, is a traced leaf, so transitions never recompile); `max_order` and
    `base` are static aux data. Build one with `init_confluent_bank` / `ConfluentPackBank.create`.

    **Fields:** `centers`, `weights`, `scales`, `rho`, `odd_moments`, `directions`,
    `direction_bias` (all `(P,)`, float), `moment_coefficients` (`(P, max_order + 1)`, float),
    `orders`, `ages`, `modes`, `slot_ids` (`(P,)`, int), `active` (`(P,)`, bool),
    `transition_version` (`()`, int), `max_order` (int), `base` (`"sigmoid"` or `"tanh"`).
    """

    centers: Array
    weights: Array
    scales: Array
    rho: Array
    odd_moments: Array
    directions: Array
    direction_bias: Array
    moment_coefficients: Array
    orders: Array
    ages: Array
    active: Array
    modes: Array
    slot_ids: Array
    transition_version: Array
    max_order: int
    base: str

    def tree_flatten(self) -> tuple[tuple[Array, ...], tuple[int, str]]:
        return tuple(getattr(self, name) for name in STATE_NAMES), (self.max_order, self.base)

    def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Array], ...], tuple[int, str]]:
        # Named keys, so key paths read `bank.scales` (masks, freezers and error messages).
        children = tuple(
            (jax.tree_util.GetAttrKey(name), getattr(self, name)) for name in STATE_NAMES
        )
        return children, (self.max_order, self.base)

    @classmethod
    def tree_unflatten(cls, aux: tuple[int, str], children: Sequence[Any]) -> ConfluentPackBank:
        values = dict(zip(STATE_NAMES, children, strict=True))
        return cls(**values, max_order=aux[0], base=aux[1])

    @classmethod
    def create(
        cls,
        packs: Sequence[RefinedPack],
        *,
        max_packs: int = 16,
        max_order: int = 8,
        base: str = "sigmoid",
        dtype: Any = None,
    ) -> ConfluentPackBank:
        """Same as `init_confluent_bank`."""
        return init_confluent_bank(
            packs, max_packs=max_packs, max_order=max_order, base=base, dtype=dtype
        )

    @property
    def max_packs(self) -> int:
        """The capacity `P` (leading size of every per-slot block)."""
        return int(self.centers.shape[0])

    @property
    def parameters(self) -> dict[str, Array]:
        """The eight trainable blocks `{name: array}` in `PARAMETER_NAMES` order."""
        return {name: getattr(self, name) for name in PARAMETER_NAMES}

    def with_parameters(self, parameters: Mapping[str, Array]) -> ConfluentPackBank:
        """A new bank with the trainable blocks replaced (usable inside `jax.grad`).

        **Arguments:**

        - `parameters`: a mapping with exactly the keys `PARAMETER_NAMES`, each array with the
          block's shape and dtype.

        Raises `ValueError` for a wrong key set, shape or dtype.
        """
        if not isinstance(parameters, Mapping) or set(parameters) != set(PARAMETER_NAMES):
            raise ValueError(
                f"parameters must contain exactly the trainable bank blocks {PARAMETER_NAMES}"
            )
        for name in PARAMETER_NAMES:
            value, current = parameters[name], getattr(self, name)
            if not hasattr(value, "shape") or not hasattr(value, "dtype"):
                raise ValueError(f"parameter {name} must be an array, got {type(value).__name__}")
            if tuple(value.shape) != tuple(current.shape):
                raise ValueError(
                    f"parameter shape changed for {name}: expected {tuple(current.shape)}, "
                    f"got {tuple(value.shape)}"
                )
            if value.dtype != current.dtype:
                raise ValueError(
                    f"parameter dtype changed for {name}: expected {current.dtype}, "
                    f"got {value.dtype}"
                )
        return dataclasses.replace(self, **{name: parameters[name] for name in PARAMETER_NAMES})

    def forward(self, z: Array) -> Array:
        """`bank_forward(self, z)`."""
        return bank_forward(self, z)

    def slot_terms(self, z: Array) -> Array:
        """`bank_slot_terms(self, z)`."""
        return bank_slot_terms(self, z)

    def pack_term_norms(self, z: Array) -> list[float]:
        """L2 norms `sqrt(Σ term_i(z)²)` of the active slots' terms, in slot order (host floats).

        Computed on the device and read back in one transfer.
        """
        terms = self.slot_terms(z)
        norms = jnp.sqrt(jnp.sum(terms**2, axis=tuple(range(1, terms.ndim))))
        norms_host, active = jax.device_get((norms, self.active))
        return [float(n) for n, on in zip(norms_host, active, strict=True) if on]

    def reinitialise(self, key: Array) -> ConfluentPackBank:
        """A fresh starting point with the same structure, for restarts and tournaments.

        The slot layout is the model: `active`, `modes`, `orders`, `slot_ids`, `ages`,
        `transition_version` and the geometric blocks `scales`, `rho`, `directions` and
        `direction_bias` are kept, so every invariant of the bank (`ρ ≥ 0`, exact zeros from
        inactive slots, shapes, dtypes, static configuration) still holds. For the active
        slots only, `centers` and the linear coefficients of each slot's mode are drawn from a
        standard normal: `weights` (modes 0 and 1), `odd_moments` (mode 1) and the moment row
        up to the slot's order (mode 2). Inactive slots are untouched.

        hybrid-kernels' `reinitialise` finds this method by name, so a bank inside the
        predictors of a tournament or a seed ensemble restarts this way.

        **Arguments:**

        - `key`: a JAX random key.
        """
        k_center, k_weight, k_odd, k_moment = jax.random.split(key, 4)
        dtype = self.centers.dtype
        active, modes = self.active, self.modes

        def draw(k: Array, old: Array, where: Array) -> Array:
            return jnp.where(where, jax.random.normal(k, old.shape, dtype), old)

        orders_axis = jnp.arange(self.moment_coefficients.shape[1])
        moment_rows = (active & (modes == 2))[:, None] & (
            orders_axis[None, :] <= self.orders[:, None]
        )
        return dataclasses.replace(
            self,
            centers=draw(k_center, self.centers, active),
            weights=draw(k_weight, self.weights, active & (modes != 2)),
            odd_moments=draw(k_odd, self.odd_moments, active & (modes == 1)),
            moment_coefficients=draw(k_moment, self.moment_coefficients, moment_rows),
        )

    def retract(self) -> ConfluentPackBank:
        """A new bank with `rho` projected onto `ρ ≥ 0` (run between optimizer steps)."""
        return dataclasses.replace(self, rho=retract_spread(self.rho))

    def portable_snapshot(self) -> dict[str, Any]:
        """Every state block as `{"shape", "dtype", "values"}` plus `"__configuration__"`.

        Reads the device once. See `snapshot_digest`.
        """
        return snapshot_from_host(read_host_state(self), base=self.base, max_order=self.max_order)

    def checkpoint(self) -> dict[str, Any]:
        """`{"schema_version": 1, "base", "max_order", "state": portable_snapshot()}`."""
        return {
            "schema_version": SCHEMA_VERSION,
            "base": self.base,
            "max_order": self.max_order,
            "state": self.portable_snapshot(),
        }

    def propose_pair(
        self, first: int, second: int, *, error_budget: float = 0.0
    ) -> TransitionProposal:
        """Two common-scale ordinary order-0 slots → one centred pair (exact). See spec 3.1."""
        return proposals.propose_pair(self, first, second, error_budget=error_budget)

    def propose_cluster(
        self, slots: tuple[int, ...], *, order: int, error_budget: float
    ) -> TransitionProposal:
        """Common-scale ordinary order-0 cluster → one truncated moment slot. See spec 3.2."""
        return proposals.propose_cluster(self, slots, order=order, error_budget=error_budget)

    def propose_derivative(self, slot: int, *, error_budget: float) -> TransitionProposal:
        """Centred pair → its `ρ = 0` limit (a derivative atom). See spec 3.3."""
        return proposals.propose_derivative(self, slot, error_budget=error_budget)

    def propose_remove_zero(self, slot: int) -> TransitionProposal:
        """Switch off an ordinary slot whose weight is exactly 0. See spec 3.4."""
        return proposals.propose_remove_zero(self, slot)

    def propose_birth(self, slot: int, pack: RefinedPack) -> TransitionProposal:
        """Reuse an inactive slot for a zero-output atom. See spec 3.5."""
        return proposals.propose_birth(self, slot, pack)


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None


def init_confluent_bank(
    packs: Sequence[RefinedPack],
    *,
    max_packs: int = 16,
    max_order: int = 8,
    base: str = "sigmoid",
    dtype: Any = None,
) -> ConfluentPackBank:
    """A bank with `packs` in slots `0..len(packs) − 1` and empty slots after them.

    **Arguments:**

    - `packs`: a sequence of `RefinedPack` (ordinary atoms), at most `max_packs`.
    - `max_packs`: capacity `P ≥ 1` (default 16).
    - `max_order`: highest ordinary order `N ≥ 0`; moment rows have `N + 1` entries (default 8).
      At most 155 (sigmoid) / 158 (tanh) in float64 and 26 / 27 in float32: above, the tower's
      Riccati coefficients overflow the dtype within four nested derivatives of the forward.
    - `base`: `"sigmoid"` or `"tanh"`.
    - `dtype`: real floating dtype of the trainable blocks; `None` gives JAX's default float
      (float64 with x64 enabled). Metadata uses JAX's default integer.

    Raises `ValueError` for a bad base, capacity or order, a `max_order` above the dtype's limit,
    too many packs, a pack order above `max_order`, and a pack value that the cast to `dtype`
    makes non-finite (a centre of 1e300 in float32), a scale it rounds to 0, or an age that does
    not fit the metadata integer; the message names the slot and the field.
    """
    max_packs = _index(max_packs, "max_packs")
    max_order = _index(max_order, "max_order")
    if base not in _BASES or max_packs < 1 or max_order < 0:
        raise ValueError(
            "positive capacity, nonnegative order, and sigmoid/tanh are required; got "
            f"max_packs={max_packs}, max_order={max_order}, base={base!r}"
        )
    live = tuple(packs)
    for pack in live:
        if not isinstance(pack, RefinedPack):
            raise TypeError(f"packs must be RefinedPack records, got {type(pack).__name__}")
    if len(live) > max_packs or any(pack.order > max_order for pack in live):
        raise ValueError(
            "initial packs exceed capacity or supported order: "
            f"{len(live)} packs with orders {[p.order for p in live]} for max_packs={max_packs},"
            f" max_order={max_order}"
        )
    float_dtype = jnp.asarray(0.0, dtype=dtype).dtype
    if not jnp.issubdtype(float_dtype, jnp.floating):
        raise ValueError(f"dtype must be a real floating dtype, got {float_dtype}")
    int_dtype = jnp.asarray(0).dtype
    _check_tower_order(max_order, base, float_dtype)
    centers = np.zeros(max_packs, dtype=float_dtype)
    weights = np.zeros(max_packs, dtype=float_dtype)
    scales = np.ones(max_packs, dtype=float_dtype)
    orders = np.zeros(max_packs, dtype=int_dtype)
    ages = np.zeros(max_packs, dtype=int_dtype)
    active = np.zeros(max_packs, dtype=bool)
    for i, pack in enumerate(live):
        centers[i], weights[i], scales[i] = _cast_pack(pack, i, float_dtype)
        orders[i], ages[i], active[i] = pack.order, _cast_age(pack, i, int_dtype), True
    host = {
        "centers": centers,
        "weights": weights,
        "scales": scales,
        "rho": np.zeros(max_packs),
        "odd_moments": np.zeros(max_packs),
        "directions": np.zeros(max_packs),
        "direction_bias": np.ones(max_packs),
        "moment_coefficients": np.zeros((max_packs, max_order + 1)),
    }
    host = {name: value.astype(float_dtype) for name, value in host.items()}
    host |= {
        "orders": orders,
        "ages": ages,
        "active": active,
        "modes": np.zeros(max_packs, dtype=int_dtype),
        "slot_ids": np.arange(max_packs, dtype=int_dtype),
        "transition_version": np.asarray(0, dtype=int_dtype),
    }
    blocks = jax.device_put(tuple(host[name] for name in STATE_NAMES))
    return ConfluentPackBank(*blocks, max_order=max_order, base=base)


def _check_tower_order(max_order: int, base: str, dtype: Any) -> None:
    # The forward evaluates rows up to max(N, 11); each nested derivative asks for one more.
    needed = max(max_order, _PAIR_TOWER_HEIGHT) + _DERIVATIVE_HEADROOM
    limit = _finite_tower_order(base, dtype)
    if needed > limit:
        reason = (
            f"the forward and {_DERIVATIVE_HEADROOM} nested derivatives need tower rows up to "
            f"order {needed}, but the Riccati coefficients are finite in {dtype} only up to "
            f"order {limit}"
        )
        if limit - _DERIVATIVE_HEADROOM < _PAIR_TOWER_HEIGHT:
            raise ValueError(f"a {base} bank cannot use dtype {dtype}: {reason}")
        raise ValueError(
            f"max_order={max_order} is too high for a {base} bank in {dtype}: {reason} "
            f"(max_order <= {limit - _DERIVATIVE_HEADROOM})"
        )


def _cast_pack(pack: RefinedPack, slot: int, dtype: Any) -> tuple[Any, Any, Any]:
    """The pack's centre, weight and scale in `dtype`; refuses values the cast makes non-finite
    (or a zero scale), naming the slot and the field."""
    values = []
    for field in ("center", "weight", "scale"):
        given = getattr(pack, field)
        with np.errstate(over="ignore", under="ignore"):
            value = np.asarray(given).astype(dtype)
        if not np.isfinite(value):
            raise ValueError(
                f"slot {slot}: packs[{slot}].{field} = {given!r} overflows to {value} in {dtype}"
            )
        if field == "scale" and value == 0:
            raise ValueError(
                f"slot {slot}: packs[{slot}].scale = {given!r} rounds to 0 in {dtype}; scales "
                "must be non-zero"
            )
        values.append(value)
    return values[0], values[1], values[2]


def _cast_age(pack: RefinedPack, slot: int, dtype: Any) -> int:
    if pack.age > np.iinfo(dtype).max:
        raise ValueError(
            f"slot {slot}: packs[{slot}].age = {pack.age} does not fit in {np.dtype(dtype)} "
            f"(at most {np.iinfo(dtype).max})"
        )
    return pack.age


def bank_slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot's term, shape `(P, *z.shape)`; inactive slots give exact zeros.

    One tower `sigma_tower_rows(base, u, max(max_order, 11))` is evaluated for all slots at
    once on `u = scales·(z − centers)` (rows of shape `(P, *z.shape)`) and feeds the ordinary,
    centred-pair and moment branches; the ordinary order is selected by masks, the mode by
    `where`. When every active slot is ordinary, a cheaper branch runs instead, with a tower of
    height 0, `min(max_order, 3)` or `max_order`, whichever is the lowest to hold the highest
    active order; it gives the same values bitwise. The branch is a `lax.switch` on the traced
    metadata (each branch rematerialised in reverse mode), so a commit never recompiles.
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
    # The tower heights of the cheap branches: order-0 slots need the activation only, low orders
    # a short tower; every bank also keeps the full branch (height max(N, 11), pairs, moments).
    return tuple(sorted({0, min(max_order, _LOW_ORDER), max_order}))


def _branch(bank: ConfluentPackBank, heights: tuple[int, ...]) -> Array:
    """Index of the cheapest branch that computes every active slot exactly (a traced int)."""
    simple = jnp.all(~bank.active | (bank.modes == 0))
    top = jnp.max(jnp.where(bank.active, bank.orders, jnp.zeros_like(bank.orders)))
    ordinary = jnp.sum(jnp.asarray(heights) < top)  # the first height >= top; len(heights) if none
    return jnp.where(simple, ordinary, len(heights))


def _argument(bank: ConfluentPackBank, z: Array) -> Array:
    per_slot = (slice(None),) + (None,) * z.ndim  # (P,) -> (P, 1, ..., 1)
    return bank.scales[per_slot] * (z - bank.centers[per_slot])


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


def _all_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """The full branch: ordinary, centred-pair and moment terms, selected by mode."""
    spec = get_activation(bank.base)
    order = bank.max_order
    per_slot = (slice(None),) + (None,) * z.ndim
    argument = _argument(bank, z)
    # One tower for all slots, as K + 1 rows of shape (P, *z.shape). Every combination below is
    # elementwise over (P, *z.shape) with loops only over orders and series terms, so the traced
    # program is independent of P and XLA fuses the slot computation and its gradient.
    tower = sigma_tower_rows(spec, argument, max(order, _PAIR_TOWER_HEIGHT))
    ordinary = _ordinary(bank, z, tower, order)

    eta = bank.directions[per_slot] * z + bank.direction_bias[per_slot]
    first, second = _pair_terms(bank.base, argument, bank.rho[per_slot], eta, tower)
    pair = bank.weights[per_slot] * first + bank.odd_moments[per_slot] * second

    rows = [bank.moment_coefficients[:, k][per_slot] for k in range(order + 1)]
    moments = _moment_sum(rows, tower)

    modes = bank.modes[per_slot]
    return jnp.where(modes == 0, ordinary, jnp.where(modes == 1, pair, moments))


def _limits(bank: ConfluentPackBank, direction: float) -> tuple[Array, Array]:
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
    value = jnp.where(bank.modes == 0, ordinary, jnp.where(bank.modes == 1, pair, moments))
    replaced = (s != 0) | ((bank.modes == 1) & (v != 0))
    return value, replaced


@jax.jit
def _slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    per_slot = (slice(None),) + (None,) * z.ndim
    # Every branch sees finite inputs: at z = ±∞ the formulas meet 0·∞ (in η = v·z + d and in
    # ∂u/∂s = z − c), which would poison values and gradients. The limits replace them below.
    infinite = jnp.isinf(z)
    finite = jnp.where(infinite, jnp.zeros_like(z), z)
    # The branch is chosen at run time from the traced metadata, so commits never recompile; a
    # simple bank skips the high tower rows, the pair and the moments.
    heights = _ordinary_heights(bank.max_order)
    branches = [functools.partial(_ordinary_terms, height=h) for h in heights]
    # Rematerialised: in reverse mode a cond otherwise makes every branch output the residuals of
    # all branches (zero-filled on CPU), so the order-0 branch would write the ~70 (P, *z.shape)
    # residuals of the full one. Recomputing a branch in the backward pass costs less than
    # storing them, for the full branch too (benchmarks/bank_forward.py --simple).
    branches = [jax.checkpoint(branch) for branch in (*branches, _all_terms)]
    value = jax.lax.switch(_branch(bank, heights), branches, bank, finite)
    for direction in (1.0, -1.0):
        limit, replaced = _limits(bank, direction)
        at_limit = (z == direction * np.inf) & replaced[per_slot]
        value = jnp.where(at_limit, limit[per_slot], value)
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
