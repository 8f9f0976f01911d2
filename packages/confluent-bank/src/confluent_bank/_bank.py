"""`ConfluentPackBank`: a preallocated pytree of atoms whose slots are an array axis.

The pytree, its constructor (`init_confluent_bank`, which validates every pack against the
dtype), parameter access and the host-side helpers. The forward pass lives in `_forward`,
the transition rules in `_proposals`; the methods here delegate to both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank import _proposals as proposals
from confluent_bank._atoms import retract_spread
from confluent_bank._forward import bank_forward, bank_slot_terms
from confluent_bank._host import (
    PARAMETER_NAMES,
    SCHEMA_VERSION,
    STATE_NAMES,
    read_host_state,
    snapshot_from_host,
)
from confluent_bank._limits import cast_age, cast_pack, check_tower_order, pair_capacity
from confluent_bank._records import RefinedPack, SlotMode, as_index
from confluent_bank._sizes import check_confluent_bank_size

# A transition hook retracts every bank after every training step: one compiled call (about
# 6 µs) instead of three eager operations (about 80 µs, a noticeable part of a small step).
_retracted = jax.jit(retract_spread)

if TYPE_CHECKING:
    from confluent_bank._records import TransitionProposal

_BASES = ("sigmoid", "tanh")


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class ConfluentPackBank:
    """A functional bank of `P = max_packs` slots, each an ordinary atom, a centred pair or a
    truncated moment expansion (spec section 1).

    Pytree children are the fourteen state blocks in `STATE_NAMES` order (every array, including
    integer/bool metadata, is a traced leaf, so transitions never recompile); `max_order`,
    `base` and `max_pairs` are static aux data. Build one with `init_confluent_bank` /
    `ConfluentPackBank.create`.

    **Fields:** `centers`, `weights`, `scales`, `rho`, `odd_moments`, `directions`,
    `direction_bias` (all `(P,)`, float), `moment_coefficients` (`(P, max_order + 1)`, float),
    `orders`, `ages`, `modes`, `slot_ids` (`(P,)`, int), `active` (`(P,)`, bool),
    `transition_version` (`()`, int), `max_order` (int), `base` (`"sigmoid"` or `"tanh"`),
    `max_pairs` (int `0..P`, the most centred pairs active at once, or `None`: any number).
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
    max_pairs: int | None = None

    def tree_flatten(self) -> tuple[tuple[Array, ...], tuple[int, str, int | None]]:
        children = tuple(getattr(self, name) for name in STATE_NAMES)
        return children, (self.max_order, self.base, self.max_pairs)

    def tree_flatten_with_keys(
        self,
    ) -> tuple[tuple[tuple[Any, Array], ...], tuple[int, str, int | None]]:
        # Named keys, so key paths read `bank.scales` (masks, freezers and error messages).
        children = tuple(
            (jax.tree_util.GetAttrKey(name), getattr(self, name)) for name in STATE_NAMES
        )
        return children, (self.max_order, self.base, self.max_pairs)

    @classmethod
    def tree_unflatten(
        cls, aux: tuple[int, str, int | None], children: Sequence[Any]
    ) -> ConfluentPackBank:
        values = dict(zip(STATE_NAMES, children, strict=True))
        return cls(**values, max_order=aux[0], base=aux[1], max_pairs=aux[2])

    @classmethod
    def create(
        cls,
        packs: Sequence[RefinedPack],
        *,
        max_packs: int = 16,
        max_order: int = 8,
        base: str = "sigmoid",
        dtype: Any = None,
        max_pairs: int | None = None,
    ) -> ConfluentPackBank:
        """Same as `init_confluent_bank`."""
        return init_confluent_bank(
            packs,
            max_packs=max_packs,
            max_order=max_order,
            base=base,
            dtype=dtype,
            max_pairs=max_pairs,
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

        Concrete values (outside `jax.jit`, `jax.grad` and `jax.vmap`) must be finite: a NaN
        or an infinity is refused, naming the block and the slots. Traced values are abstract
        and pass unchecked, which keeps the method usable inside a compiled step, as do arrays
        spread over several JAX processes, which no single process can read.

        Raises `ValueError` for a wrong key set, shape or dtype, or a non-finite concrete
        value.
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
        _refuse_non_finite(parameters)
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
        moment_rows = (active & (modes == SlotMode.MOMENTS))[:, None] & (
            orders_axis[None, :] <= self.orders[:, None]
        )
        return dataclasses.replace(
            self,
            centers=draw(k_center, self.centers, active),
            weights=draw(k_weight, self.weights, active & (modes != SlotMode.MOMENTS)),
            odd_moments=draw(k_odd, self.odd_moments, active & (modes == SlotMode.PAIR)),
            moment_coefficients=draw(k_moment, self.moment_coefficients, moment_rows),
        )

    def retract(self) -> ConfluentPackBank:
        """A new bank with `rho` projected onto `ρ ≥ 0` (run between optimizer steps)."""
        return dataclasses.replace(self, rho=_retracted(self.rho))

    def portable_snapshot(self) -> dict[str, Any]:
        """Every state block as `{"shape", "dtype", "values"}` plus `"__configuration__"`.

        Reads the device once. See `snapshot_digest`.
        """
        return snapshot_from_host(
            read_host_state(self),
            base=self.base,
            max_order=self.max_order,
            max_pairs=self.max_pairs,
        )

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


def init_confluent_bank(
    packs: Sequence[RefinedPack],
    *,
    max_packs: int = 16,
    max_order: int = 8,
    base: str = "sigmoid",
    dtype: Any = None,
    max_pairs: int | None = None,
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
    - `max_pairs`: the most centred pairs the bank holds at once, `0 ≤ max_pairs ≤ max_packs`;
      `None` (default): any number. The pair formulas are evaluated on this many slots only
      (the active pairs, gathered), so a bank that holds one pair at a time is best built with
      `max_pairs=1`: with `None` every slot pays for the pair formulas while any pair is
      active (inside an ODE, one pair in 8 slots made the step 1.30–1.99× a small MLP's, and
      0.86–1.28× with `max_pairs=1`; `benchmarks/bank_in_ode.py`, values bit for bit the
      same). With `0` the bank holds no pair and its forward has no pair code, which every
      other bank compiles though it runs it only while a pair is active: the integration
      example's first training step took 0.94–1.01× a small MLP's, against 1.18–1.22× with
      `max_pairs=1` (for a bank that grows by births and moment merges, as
      `TransitionHook.growing` does by default). A commit that would make more pairs active is
      refused (`ValueError`) and `detect_transitions` proposes no merge while the bank is
      full. Static, like `max_order`: kernels compile once per value. A bound is written into
      the bank's portable snapshot, so only a bank built without one has the spec's snapshot
      and digest; that is why `None` stays the default.

    Raises `ValueError` for a bad base, capacity or order, a `max_pairs` outside
    `0..max_packs`, a `max_order` above the dtype's limit,
    a bank that would not fit in this machine's physical memory (the message states the bytes
    it would need; checked before anything is allocated) or whose slot ids would not fit the
    metadata integer, too many packs, a pack order above `max_order`, and a pack value that
    the cast to `dtype` makes non-finite (a centre of 1e300 in float32), a scale it rounds to
    0, or an age that does not fit the metadata integer; the message names the slot and the
    field.
    """
    max_packs = as_index(max_packs, "max_packs")
    max_order = as_index(max_order, "max_order")
    if base not in _BASES or max_packs < 1 or max_order < 0:
        raise ValueError(
            "positive capacity, nonnegative order, and sigmoid/tanh are required; got "
            f"max_packs={max_packs}, max_order={max_order}, base={base!r}"
        )
    max_pairs = pair_capacity(max_pairs, max_packs)
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
    check_tower_order(max_order, base, float_dtype)
    check_confluent_bank_size(max_packs, max_order, float_dtype, int_dtype)
    centers = np.zeros(max_packs, dtype=float_dtype)
    weights = np.zeros(max_packs, dtype=float_dtype)
    scales = np.ones(max_packs, dtype=float_dtype)
    orders = np.zeros(max_packs, dtype=int_dtype)
    ages = np.zeros(max_packs, dtype=int_dtype)
    active = np.zeros(max_packs, dtype=bool)
    for i, pack in enumerate(live):
        centers[i], weights[i], scales[i] = cast_pack(pack, i, float_dtype)
        orders[i], ages[i], active[i] = pack.order, cast_age(pack, i, int_dtype), True
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
        "modes": np.full(max_packs, SlotMode.ORDINARY, dtype=int_dtype),
        "slot_ids": np.arange(max_packs, dtype=int_dtype),
        "transition_version": np.asarray(0, dtype=int_dtype),
    }
    blocks = jax.device_put(tuple(host[name] for name in STATE_NAMES))
    return ConfluentPackBank(*blocks, max_order=max_order, base=base, max_pairs=max_pairs)


def _refuse_non_finite(parameters: Mapping[str, Any]) -> None:
    """`ValueError` naming the block and slots of any NaN or infinite concrete parameter."""
    concrete = {
        name: value
        for name, value in parameters.items()
        if not isinstance(value, jax.core.Tracer) and _readable_here(value)
    }
    for name, value in jax.device_get(concrete).items():  # one transfer for all blocks
        bad = ~np.isfinite(np.asarray(value))
        if bad.any():
            # Rows are slots; a moment row is bad if any of its coefficients is.
            slots = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1)).tolist()
            first = np.asarray(value)[np.unravel_index(np.flatnonzero(bad)[0], bad.shape)]
            raise ValueError(
                f"parameter {name} is not finite at slots {slots} (e.g. {first}); "
                "with_parameters expects finite values"
            )


def _readable_here(value: Any) -> bool:
    # An array spread over several processes cannot be read by one; it is left unchecked.
    return not isinstance(value, jax.Array) or value.is_fully_addressable
