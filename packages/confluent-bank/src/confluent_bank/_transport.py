"""Exact transports of a bank and of the optimizer moments that travel with it.

Two transformations change the bank's coordinates without changing the function it represents:

* a permutation of slot positions (every row of every block moves, stable ids included);
* the tanh sign relabel `(w, s) ↦ (−w, −s)` of ordinary tanh slots, exact at every order
  because `tanh^(n)` has the parity of `n + 1`.

Optimizer moments have to follow: moments are permuted with the rows, and under the sign
relabel linear statistics (first moments, momenta) of `weights`/`scales` flip sign while
quadratic and absolute statistics do not. `NamedMomentState` is the explicit, documented
moment container these functions understand; other optimizer states go through an adapter
(see `confluent_bank.optax` for optax states).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank._host import PARAMETER_NAMES, STATE_NAMES

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

StateT = TypeVar("StateT")

ODD_MOMENT_KINDS = frozenset({"first", "momentum", "gradient_average"})
EVEN_MOMENT_KINDS = frozenset({"second", "variance", "max_second", "sum_squares", "absolute"})
SIGN_BLOCKS = ("weights", "scales")

__all__ = [
    "ExactTransportAdapter",
    "NamedMomentState",
    "OptimizerStateAdapter",
    "permute_bank",
    "relabel_tanh_sign",
    "reset_slot_state",
    "transport_optimizer_state",
]


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


# ---------------------------------------------------------------------------------------------
# Row operations on whole pytrees: one compiled program per tree structure, whatever the slots.


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


def _zero_rows(tree: Any, slots: Sequence[int], size: int) -> Any:
    """Zero rows `slots` of every array in `tree` (all leading dimensions equal `size`)."""
    if not slots:
        return tree
    return _zero_rows_jit(tree, _slot_mask(slots, size))


def _gather_rows(tree: Any, permutation: Sequence[int] | None) -> Any:
    """`new[i] = old[permutation[i]]` along the leading axis of every array in `tree`."""
    if permutation is None:
        return tree
    return _gather_rows_jit(tree, np.asarray(permutation, dtype=np.int32))


def _negate_rows(tree: Any, slots: Sequence[int], size: int) -> Any:
    """Negate rows `slots` of every array in `tree` (exact: a sign change)."""
    if not slots:
        return tree
    return _negate_rows_jit(tree, _slot_mask(slots, size))


# ---------------------------------------------------------------------------------------------
# NamedMomentState


def _checked_moments(state: Any, bank: Any, adapter_name: str) -> dict[str, dict[str, Any]]:
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


def reset_slot_state(
    state: NamedMomentState, bank: ConfluentPackBank, slots: tuple[int, ...]
) -> NamedMomentState:
    """Zero the moment rows of the affected slots; keep every other row and the step.

    This is what `commit_transition` does to a `NamedMomentState` when no adapter is given.

    **Arguments:**

    - `state`: a `NamedMomentState` whose moment dicts match the bank's parameters.
    - `bank`: the (candidate) bank; only its parameter shapes are read.
    - `slots`: slot positions whose rows are reset.

    **Returns:** a new `NamedMomentState` with the same `step` object.

    **Raises:** `TypeError` for any other state type ("explicit OptimizerStateAdapter");
    `ValueError` when a moment kind lacks a parameter or a shape differs.
    """
    moments = _checked_moments(state, bank, "OptimizerStateAdapter")
    return NamedMomentState(state.step, _zero_rows(moments, tuple(slots), bank.max_packs))


def transport_optimizer_state(
    state: NamedMomentState,
    bank: ConfluentPackBank,
    permutation: tuple[int, ...] | None,
    sign_slots: tuple[int, ...],
) -> NamedMomentState:
    """Permute every moment row; sign-flip odd moments of relabelled `weights`/`scales` rows.

    The loss in relabelled coordinates is the old loss composed with `(w, s) ↦ (−w, −s)`, so
    gradients with respect to `w` and `s` flip sign: linear statistics (odd kinds) flip,
    quadratic and absolute statistics (even kinds) do not, and every other block is unchanged.

    **Arguments:**

    - `state`: a `NamedMomentState` whose moment dicts match the bank's parameters.
    - `bank`: the (candidate) bank; only its parameter shapes are read.
    - `permutation`: the gather `new[i] = old[permutation[i]]`, or `None`.
    - `sign_slots`: positions (after the permutation) whose odd moments flip sign.

    **Returns:** a new `NamedMomentState` with the same `step` object.

    **Raises:** `TypeError` for other state types ("explicit ExactTransportAdapter") or, when
    `sign_slots` is non-empty, for a moment kind whose parity is unknown ("parity");
    `ValueError` for key-set or shape mismatches.
    """
    moments = _checked_moments(state, bank, "ExactTransportAdapter")
    if sign_slots:
        unknown = sorted(set(moments) - ODD_MOMENT_KINDS - EVEN_MOMENT_KINDS)
        if unknown:
            raise TypeError(
                f"unknown moment parity requires an explicit ExactTransportAdapter: kinds "
                f"{unknown} are neither odd {sorted(ODD_MOMENT_KINDS)} nor even "
                f"{sorted(EVEN_MOMENT_KINDS)}"
            )
    moments = _gather_rows(moments, permutation)
    if sign_slots:
        odd = {
            kind: {name: moments[kind][name] for name in SIGN_BLOCKS}
            for kind in moments
            if kind in ODD_MOMENT_KINDS
        }
        flipped = _negate_rows(odd, sign_slots, bank.max_packs)
        moments = {kind: {**entries, **flipped.get(kind, {})} for kind, entries in moments.items()}
    return NamedMomentState(state.step, moments)


# ---------------------------------------------------------------------------------------------
# Exact transports of the bank


def _check_between_steps(between_steps: bool) -> None:
    if not between_steps:
        raise RuntimeError(
            "exact transports run only between optimizer steps; pass between_steps=True once "
            "the last update has been applied"
        )


def _positions(values: Sequence[int], argument: str) -> tuple[int, ...]:
    try:
        items = list(values)
    except TypeError:
        raise TypeError(
            f"{argument} must be a sequence of slot positions, got {type(values).__name__}"
        ) from None
    result = []
    for item in items:
        if isinstance(item, bool | np.bool_):
            raise TypeError(f"{argument} must contain integer slot positions, got {item!r}")
        try:
            result.append(operator.index(item))
        except TypeError:
            raise TypeError(
                f"{argument} must contain integer slot positions, got {item!r}"
            ) from None
    return tuple(result)


def _transport(
    bank: Any,
    state: Any,
    permutation: tuple[int, ...] | None,
    sign_slots: tuple[int, ...],
    state_adapter: Any,
) -> tuple[Any, Any]:
    blocks = {name: getattr(bank, name) for name in STATE_NAMES if name != "transition_version"}
    blocks = _gather_rows(blocks, permutation)
    if sign_slots:
        flipped = _negate_rows({n: blocks[n] for n in SIGN_BLOCKS}, sign_slots, bank.max_packs)
        blocks.update(flipped)
    candidate = dataclasses.replace(bank, **blocks, transition_version=bank.transition_version + 1)
    if state_adapter is None:
        next_state = transport_optimizer_state(state, candidate, permutation, sign_slots)
    else:
        next_state = state_adapter(state, candidate, permutation, sign_slots)
    return candidate, next_state


def permute_bank(
    bank: ConfluentPackBank,
    permutation: Sequence[int],
    optimizer_state: StateT,
    *,
    between_steps: bool,
    state_adapter: ExactTransportAdapter[StateT] | None = None,
) -> tuple[ConfluentPackBank, StateT]:
    """Move stable ids, every state row and its optimizer moments through one permutation.

    Every block except `transition_version` is gathered, `new[i] = old[permutation[i]]`, so
    stable ids travel with their rows; the represented function is unchanged up to the
    order of the slot sum. `transition_version` increases by one. The gather runs on the
    device (no host read), compiled once per bank structure.

    **Arguments:**

    - `bank`: the `ConfluentPackBank` of capacity `P`.
    - `permutation`: `P` integers containing every position `0..P−1` exactly once.
    - `optimizer_state`: a `NamedMomentState`, or any state `state_adapter` understands.
    - `between_steps`: must be `True` (a transport between optimizer steps only).
    - `state_adapter`: an `ExactTransportAdapter`; e.g. `confluent_bank.optax.transport_adapter()`.

    **Returns:** `(candidate_bank, next_state)`.

    **Raises:** `RuntimeError` if not between steps; `ValueError` ("every") for a
    permutation that is not one of `0..P−1`; `TypeError` for an unknown state without adapter.
    """
    _check_between_steps(between_steps)
    perm = _positions(permutation, "permutation")
    size = bank.max_packs
    if len(perm) != size or sorted(perm) != list(range(size)):
        raise ValueError(
            f"permutation must contain every slot position 0..{size - 1} exactly once, got {perm}"
        )
    return _transport(bank, optimizer_state, perm, (), state_adapter)


def relabel_tanh_sign(
    bank: ConfluentPackBank,
    slots: Sequence[int],
    optimizer_state: StateT,
    *,
    between_steps: bool,
    state_adapter: ExactTransportAdapter[StateT] | None = None,
) -> tuple[ConfluentPackBank, StateT]:
    """Apply the exact tanh symmetry `(w, s) ↦ (−w, −s)` to ordinary slots, with its moments.

    `(−w)(−s)^n tanh^(n)(−s(x − c)) = w s^n tanh^(n)(s(x − c))` at every order `n`, and in
    floating point the flip is bitwise exact. Odd optimizer moments of `weights`/`scales`
    flip sign, even ones do not (see `transport_optimizer_state`). `transition_version`
    increases by one. Only the `modes` block is read from the device.

    **Arguments:**

    - `bank`: a tanh `ConfluentPackBank`.
    - `slots`: distinct positions of ordinary (mode 0) slots; inactive ones may be flipped.
    - `optimizer_state`: a `NamedMomentState`, or any state `state_adapter` understands.
    - `between_steps`: must be `True`.
    - `state_adapter`: an `ExactTransportAdapter`; e.g. `confluent_bank.optax.transport_adapter()`.

    **Returns:** `(candidate_bank, next_state)`.

    **Raises:** `RuntimeError` if not between steps; `ValueError` for repeated or
    out-of-range slots, a non-tanh bank or a non-ordinary slot ("ordinary"); `TypeError` for
    an unknown state without adapter or an unknown moment parity ("parity").
    """
    _check_between_steps(between_steps)
    sign_slots = _positions(slots, "slots")
    size = bank.max_packs
    if len(set(sign_slots)) != len(sign_slots) or any(not 0 <= i < size for i in sign_slots):
        raise ValueError(
            f"slots must be distinct slot positions in 0..{size - 1}, got {sign_slots}"
        )
    if bank.base != "tanh":
        raise ValueError(
            "the sign relabel is an exact symmetry of ordinary tanh slots only; this bank's "
            f"base is {bank.base!r}"
        )
    modes = np.asarray(jax.device_get(bank.modes))
    wrong = [i for i in sign_slots if int(modes[i]) != 0]
    if wrong:
        raise ValueError(
            f"the tanh sign relabel needs ordinary (mode 0) slots; slots {wrong} have modes "
            f"{[int(modes[i]) for i in wrong]}"
        )
    return _transport(bank, optimizer_state, None, sign_slots, state_adapter)
