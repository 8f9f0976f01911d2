"""`ConfluentPackBank`: a preallocated pytree of atoms whose slots are an array axis.

The forward pass evaluates ONE derivative tower of height `K = max(max_order, 11)` for all slots
at once, shape `(K + 1, P, *z.shape)`, and selects each slot's order and mode by masked sums and
`where` over constant coefficient arrays. The traced program therefore does not grow with the
capacity `P`: compile time is independent of `max_packs`.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank import proposals
from confluent_bank._host import (
    PARAMETER_NAMES,
    SCHEMA_VERSION,
    STATE_NAMES,
    read_host_state,
    snapshot_from_host,
)
from confluent_bank.activations import get_activation, sigma_tower_rows
from confluent_bank.atoms import _moment_sum, _pair_terms, retract_spread
from confluent_bank.records import RefinedPack

if TYPE_CHECKING:
    from confluent_bank.records import TransitionProposal

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
    - `base`: `"sigmoid"` or `"tanh"`.
    - `dtype`: real floating dtype of the trainable blocks; `None` gives JAX's default float
      (float64 with x64 enabled). Metadata uses JAX's default integer.

    Raises `ValueError` for a bad base, capacity or order, too many packs, or a pack order above
    `max_order`.
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
    centers = np.zeros(max_packs)
    weights = np.zeros(max_packs)
    scales = np.ones(max_packs)
    orders = np.zeros(max_packs, dtype=np.int64)
    ages = np.zeros(max_packs, dtype=np.int64)
    active = np.zeros(max_packs, dtype=bool)
    for i, pack in enumerate(live):
        centers[i], weights[i], scales[i] = pack.center, pack.weight, pack.scale
        orders[i], ages[i], active[i] = pack.order, pack.age, True
    float_dtype = jnp.asarray(0.0, dtype=dtype).dtype
    if not jnp.issubdtype(float_dtype, jnp.floating):
        raise ValueError(f"dtype must be a real floating dtype, got {float_dtype}")
    int_dtype = jnp.asarray(0).dtype
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
        "orders": orders.astype(int_dtype),
        "ages": ages.astype(int_dtype),
        "active": active,
        "modes": np.zeros(max_packs, dtype=int_dtype),
        "slot_ids": np.arange(max_packs, dtype=int_dtype),
        "transition_version": np.asarray(0, dtype=int_dtype),
    }
    blocks = jax.device_put(tuple(host[name] for name in STATE_NAMES))
    return ConfluentPackBank(*blocks, max_order=max_order, base=base)


def bank_slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    """Every slot's term, shape `(P, *z.shape)`; inactive slots give exact zeros.

    One tower `sigma_tower_rows(base, u, max(max_order, 11))` is evaluated for all slots at
    once on `u = scales·(z − centers)` (rows of shape `(P, *z.shape)`) and feeds the ordinary,
    centred-pair and moment branches; the ordinary order is selected by masks, the mode by
    `where`. Jitted (one compilation per input shape and bank configuration), so eager calls are
    fast as well.

    **Arguments:**

    - `bank`: the bank.
    - `z`: input array of any shape.
    """
    return _slot_terms(bank, jnp.asarray(z))


@jax.jit
def _slot_terms(bank: ConfluentPackBank, z: Array) -> Array:
    spec = get_activation(bank.base)
    order = bank.max_order
    height = max(order, _PAIR_TOWER_HEIGHT)
    per_slot = (slice(None),) + (None,) * z.ndim  # (P,) -> (P, 1, ..., 1)

    scales = bank.scales[per_slot]
    argument = scales * (z - bank.centers[per_slot])
    # One tower for all slots, as K + 1 rows of shape (P, *z.shape). Every combination below is
    # elementwise over (P, *z.shape) with loops only over orders and series terms, so the traced
    # program is independent of P and XLA fuses the slot computation and its gradient.
    tower = sigma_tower_rows(spec, argument, height)

    # Ordinary atoms: w · s^n · σ^(n)(u), n selected per slot by masks over 0..N (an order
    # outside 0..N gives 0, as in the reference).
    ordinary = jnp.zeros_like(tower[0])
    for k in range(order + 1):
        value = (bank.weights * bank.scales**k)[per_slot] * tower[k]
        selected = (bank.orders == k)[per_slot]
        ordinary = ordinary + jnp.where(selected, value, jnp.zeros_like(value))

    eta = bank.directions[per_slot] * z + bank.direction_bias[per_slot]
    first, second = _pair_terms(bank.base, argument, bank.rho[per_slot], eta, tower)
    pair = bank.weights[per_slot] * first + bank.odd_moments[per_slot] * second

    rows = [bank.moment_coefficients[:, k][per_slot] for k in range(order + 1)]
    moments = _moment_sum(rows, tower)

    modes = bank.modes[per_slot]
    value = jnp.where(modes == 0, ordinary, jnp.where(modes == 1, pair, moments))
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
