"""Optimizer state beside a bank: the explicit moment container, the adapter protocols, and
the row operations every adapter shares.

Every optimizer-state adapter (`NamedMomentState`'s in `_named_moments`, the optax ones in
`confluent_bank.optax`) and the bank transports themselves move rows with the functions here:
`zero_rows`, `gather_rows`, `negate_rows`, `transport_rows` and `apply_carry` (a committed
transition's change of coordinates, planned by `_carry`). Each is one compiled program per tree
structure, whatever the slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank._carry import Coordinate, TransitionCarry
from confluent_bank._host import PARAMETER_NAMES

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

StateT = TypeVar("StateT")

ODD_MOMENT_KINDS = frozenset({"first", "momentum", "gradient_average"})
EVEN_MOMENT_KINDS = frozenset({"second", "variance", "max_second", "sum_squares", "absolute"})
SIGN_BLOCKS = ("weights", "scales")
"""The blocks a tanh sign relabel negates (and whose odd moments flip with them)."""


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class NamedMomentState:
    """Explicit elementwise optimizer moments and a preserved shared step count.

    A pytree with children `(step, moments)`. Every operation of this package keeps `step`
    (the same object) and transforms the rows of `moments`.

    **Arguments:**

    - `step`: the shared optimizer clock (any scalar; never modified).
    - `moments`: maps a moment kind to a dict holding one array per bank parameter name
      (exactly `PARAMETER_NAMES`), each with that parameter's shape, e.g. `(P,)` or
      `(P, N + 1)` for `moment_coefficients`. Kinds in `{"first", "momentum",
      "gradient_average"}` are odd (sign-flipped by a tanh relabel); kinds in `{"second",
      "variance", "max_second", "sum_squares", "absolute"}` are even.
    """

    step: Any
    moments: dict[str, dict[str, Any]]

    def tree_flatten(self) -> tuple[tuple[Any, dict[str, dict[str, Any]]], None]:
        return (self.step, self.moments), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any, Any]) -> NamedMomentState:
        del aux
        return cls(*children)


class OptimizerStateAdapter(Protocol[StateT]):
    """Carries an optimizer state through a committed transition.

    Called by `commit_transition` as `adapter(state, candidate_bank, slots)`, where `slots`
    are the affected slot positions; returns the state to use with `candidate_bank`.
    """

    def __call__(
        self, state: StateT, bank: ConfluentPackBank, slots: tuple[int, ...]
    ) -> StateT: ...


class ExactTransportAdapter(Protocol[StateT]):
    """Carries an optimizer state through an exact transport.

    Called by `permute_bank`/`relabel_tanh_sign` as `adapter(state, candidate_bank,
    permutation, sign_slots)`: `permutation` is the gather `new[i] = old[permutation[i]]`
    (or `None` for a relabel), `sign_slots` the relabelled positions (empty for a
    permutation).
    """

    def __call__(
        self,
        state: StateT,
        bank: ConfluentPackBank,
        permutation: tuple[int, ...] | None,
        sign_slots: tuple[int, ...],
    ) -> StateT: ...


class TransitionStateAdapter(Protocol[StateT]):
    """An `OptimizerStateAdapter` that can also follow a transition's change of coordinates.

    `commit_transition` calls `adapter.carry_transition(state, candidate_bank, carry)` with
    the `TransitionCarry` of the committed proposal when the adapter has that method, and
    the plain `adapter(state, candidate_bank, slots)` otherwise.
    """

    def __call__(
        self, state: StateT, bank: ConfluentPackBank, slots: tuple[int, ...]
    ) -> StateT: ...

    def carry_transition(
        self, state: StateT, bank: ConfluentPackBank, carry: TransitionCarry
    ) -> StateT: ...


# ---------------------------------------------------------------------------------------------
# Row operations on whole pytrees


def _row_mask(mask: jax.Array, value: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (value.ndim - 1))


@jax.jit
def _zero_rows_jit(tree: Any, mask: jax.Array) -> Any:
    return jax.tree.map(lambda v: jnp.where(_row_mask(mask, v), jnp.zeros((), v.dtype), v), tree)


@jax.jit
def _gather_rows_jit(tree: Any, permutation: jax.Array) -> Any:
    return jax.tree.map(lambda v: v[permutation], tree)


@jax.jit
def _negate_rows_jit(tree: Any, mask: jax.Array) -> Any:
    return jax.tree.map(lambda v: jnp.where(_row_mask(mask, v), -v, v), tree)


def _slot_mask(slots: Sequence[int], size: int) -> np.ndarray:
    if any(not 0 <= i < size for i in slots):
        raise ValueError(f"slots must be positions in 0..{size - 1}, got {tuple(slots)}")
    mask = np.zeros(size, dtype=bool)
    mask[list(slots)] = True
    return mask


def zero_rows(tree: Any, slots: Sequence[int], size: int) -> Any:
    """Zero rows `slots` of every array in `tree` (all leading dimensions equal `size`)."""
    if not slots:
        return tree
    return _zero_rows_jit(tree, _slot_mask(slots, size))


def gather_rows(tree: Any, permutation: Sequence[int] | None) -> Any:
    """`new[i] = old[permutation[i]]` along the leading axis of every array in `tree`."""
    if permutation is None:
        return tree
    return _gather_rows_jit(tree, np.asarray(permutation, dtype=np.int32))


def negate_rows(tree: Any, slots: Sequence[int], size: int) -> Any:
    """Negate rows `slots` of every array in `tree` (exact: a sign change)."""
    if not slots:
        return tree
    return _negate_rows_jit(tree, _slot_mask(slots, size))


def transport_rows(
    arrays: Mapping[str, Any],
    permutation: Sequence[int] | None,
    sign_slots: Sequence[int],
    size: int,
    *,
    flip: bool = True,
) -> dict[str, Any]:
    """Move `{block name: array}` through an exact transport: gather the rows by `permutation`
    (`new[i] = old[permutation[i]]`, or none), then, when `flip`, negate rows `sign_slots` of
    the `SIGN_BLOCKS` present (the bank's own blocks and odd moments flip; even moments do not).
    """
    moved = gather_rows(dict(arrays), permutation)
    signed = {name: moved[name] for name in SIGN_BLOCKS if name in moved}
    if flip and sign_slots and signed:
        moved = {**moved, **negate_rows(signed, sign_slots, size)}
    return moved


def checked_moments(state: Any, bank: Any, adapter_name: str) -> dict[str, dict[str, Any]]:
    if not isinstance(state, NamedMomentState):
        raise TypeError(
            f"unknown optimizer state requires an explicit {adapter_name}: got "
            f"{type(state).__module__}.{type(state).__qualname__}; pass state_adapter=... "
            "(confluent_bank.optax has adapters for optax states)"
        )
    if not isinstance(state.moments, Mapping):
        raise TypeError(
            f"NamedMomentState.moments must be a dict of moment kinds, got {type(state.moments)}"
        )
    for kind, entries in state.moments.items():
        if not isinstance(entries, Mapping) or set(entries) != set(PARAMETER_NAMES):
            keys = sorted(entries) if isinstance(entries, Mapping) else type(entries).__name__
            raise ValueError(
                "each named moment must match the complete bank parameter dictionary: "
                f"moment kind {kind!r} has {keys}, expected {sorted(PARAMETER_NAMES)}"
            )
        for name in PARAMETER_NAMES:
            shape = tuple(getattr(bank, name).shape)
            got = tuple(np.shape(entries[name]))
            if got != shape:
                raise ValueError(
                    f"moment shape does not match parameter: moments[{kind!r}][{name!r}] has "
                    f"shape {got}, the bank's {name} has shape {shape}"
                )
    return {
        kind: {name: entries[name] for name in PARAMETER_NAMES}
        for kind, entries in state.moments.items()
    }


# ---------------------------------------------------------------------------------------------
# Applying a transition's carry plan to one bank-shaped set of arrays (one compiled program per
# structure and padded plan length, whatever the slots).


@jax.jit
def _carry_jit(tree: Any, keep: Any, dst: Any, src: Any, coef: Any, even: Any) -> Any:
    leaves, treedef = jax.tree.flatten(tree)
    flat = jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])
    old = flat[src]
    odd_sum = jax.ops.segment_sum(coef * old, dst, num_segments=flat.size)
    root = jnp.sqrt(jnp.maximum(old, 0))
    even_sum = jax.ops.segment_sum(jnp.abs(coef) * root, dst, num_segments=flat.size) ** 2
    new = jnp.where(keep, flat, 0) + jnp.where(even, even_sum, odd_sum)
    pieces, start = [], 0
    for leaf in leaves:
        pieces.append(new[start : start + leaf.size].reshape(leaf.shape).astype(leaf.dtype))
        start += leaf.size
    return jax.tree.unflatten(treedef, pieces)


@jax.jit
def _fresh_jit(tree: Any, fresh: Any) -> Any:
    leaves, treedef = jax.tree.flatten(tree)
    pieces, start = [], 0
    for leaf in leaves:
        mask = fresh[start : start + leaf.size].reshape(leaf.shape)
        pieces.append(jnp.where(mask, jnp.zeros((), leaf.dtype), leaf))
        start += leaf.size
    return jax.tree.unflatten(treedef, pieces)


def _offsets(arrays: Mapping[str, Any]) -> tuple[dict[str, tuple[int, int]], int]:
    offsets, total = {}, 0
    for name in sorted(arrays):
        shape = np.shape(arrays[name])
        width = int(np.prod(shape[1:], dtype=int))
        offsets[name] = (total, width)
        total += int(np.prod(shape, dtype=int))
    return offsets, total


def _flat_index(offsets: Mapping[str, tuple[int, int]], coordinate: Coordinate) -> int | None:
    name, row, column = coordinate
    if name not in offsets:
        return None  # a block the optimizer does not see (filtered params)
    start, width = offsets[name]
    return start + row * width + column


def apply_carry(arrays: Mapping[str, Any], carry: TransitionCarry, parity: str) -> dict[str, Any]:
    """Move one statistic of the bank's parameters through a transition.

    **Arguments:**

    - `arrays`: `{block name: array}` for some or all of `PARAMETER_NAMES`, each shaped like
      the bank's block (blocks the optimizer does not see may be left out).
    - `carry`: the transition's `TransitionCarry`.
    - `parity`: `"odd"` (linear in the gradient: `μ' = G μ`), `"even"` (quadratic:
      `ν' = (|G| √ν)²`, fresh coordinates seeded from `carry.seeds`) or `"warmup"`
      (warm-up counters: `fresh` coordinates restart at 0).

    **Returns:** a new dict with the same keys; rows outside `carry.reset` are unchanged.
    """
    if parity not in ("odd", "even", "warmup"):
        raise ValueError(f"parity must be 'odd', 'even' or 'warmup', got {parity!r}")
    arrays = dict(arrays)
    if not arrays:
        return arrays
    offsets, total = _offsets(arrays)
    ordered = {name: arrays[name] for name in sorted(arrays)}
    if parity == "warmup":
        fresh = np.zeros(total, dtype=bool)
        for coordinate in carry.fresh:
            index = _flat_index(offsets, coordinate)
            if index is not None:
                fresh[index] = True
        return dict(_fresh_jit(ordered, fresh)) if fresh.any() else arrays
    if not carry.reset:
        return arrays
    keep = np.ones(total, dtype=bool)
    for start, width in offsets.values():
        for row in carry.reset:
            keep[start + row * width : start + (row + 1) * width] = False
    triples = []
    for new, old, coefficient in carry.entries + (carry.seeds if parity == "even" else ()):
        dst, src = _flat_index(offsets, new), _flat_index(offsets, old)
        if dst is not None and src is not None:
            triples.append((dst, src, coefficient))
    # pad to a power of two, so a handful of compiled programs serve every transition
    length = 1 << max(len(triples), 1).bit_length()
    dst = np.zeros(length, dtype=np.int32)
    src = np.zeros(length, dtype=np.int32)
    coef = np.zeros(length)
    for i, (d, s, k) in enumerate(triples):
        dst[i], src[i], coef[i] = d, s, k
    dtype = jnp.result_type(*ordered.values())
    result = _carry_jit(ordered, keep, dst, src, coef.astype(dtype), np.bool_(parity == "even"))
    return dict(result)
