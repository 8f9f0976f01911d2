"""The built-in optimizer-state adapter: `NamedMomentState` through transitions and transports.

`commit_transition` resets a `NamedMomentState`'s affected rows by default
(`reset_slot_state`), or carries them through the change of coordinates with
`moment_carry_adapter()` (`carry_slot_state`); `permute_bank` and `relabel_tanh_sign` move them
with `transport_optimizer_state`. The optax counterpart is `confluent_bank.optax`; both use the
row operations of `_optimizer_state`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from confluent_bank._carry import TransitionCarry
from confluent_bank._optimizer_state import (
    EVEN_MOMENT_KINDS,
    ODD_MOMENT_KINDS,
    NamedMomentState,
    TransitionStateAdapter,
    apply_carry,
    checked_moments,
    transport_rows,
    zero_rows,
)

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank


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
    moments = checked_moments(state, bank, "OptimizerStateAdapter")
    return NamedMomentState(state.step, zero_rows(moments, tuple(slots), bank.max_packs))


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
    moments = checked_moments(state, bank, "ExactTransportAdapter")
    if sign_slots:
        unknown = sorted(set(moments) - ODD_MOMENT_KINDS - EVEN_MOMENT_KINDS)
        if unknown:
            raise TypeError(
                f"unknown moment parity requires an explicit ExactTransportAdapter: kinds "
                f"{unknown} are neither odd {sorted(ODD_MOMENT_KINDS)} nor even "
                f"{sorted(EVEN_MOMENT_KINDS)}"
            )
    moved = {
        kind: transport_rows(
            entries, permutation, sign_slots, bank.max_packs, flip=kind in ODD_MOMENT_KINDS
        )
        for kind, entries in moments.items()
    }
    return NamedMomentState(state.step, moved)


def carry_slot_state(state: Any, bank: ConfluentPackBank, carry: TransitionCarry) -> Any:
    """Carry a `NamedMomentState` through a transition (see the module docs for the maths).

    Odd kinds (`"first"`, `"momentum"`, `"gradient_average"`) move linearly, even kinds
    (`"second"`, `"variance"`, ...) by the Cauchy–Schwarz bound; `step` is kept.

    **Arguments:**

    - `state`: a `NamedMomentState` matching the bank's parameters.
    - `bank`: the candidate bank; only its parameter shapes are read.
    - `carry`: the transition's `TransitionCarry`.

    **Returns:** a new `NamedMomentState` with the same `step` object.

    **Raises:** `TypeError` for another state type or a moment kind whose parity is unknown;
    `ValueError` for key-set or shape mismatches.
    """
    moments = checked_moments(state, bank, "OptimizerStateAdapter")
    unknown = sorted(set(moments) - ODD_MOMENT_KINDS - EVEN_MOMENT_KINDS)
    if unknown and carry.reset:
        raise TypeError(
            f"unknown moment parity: kinds {unknown} are neither odd {sorted(ODD_MOMENT_KINDS)} "
            f"nor even {sorted(EVEN_MOMENT_KINDS)}; pass an explicit OptimizerStateAdapter"
        )
    carried = {
        kind: apply_carry(entries, carry, "odd" if kind in ODD_MOMENT_KINDS else "even")
        for kind, entries in moments.items()
    }
    return NamedMomentState(state.step, carried)


@dataclasses.dataclass(frozen=True)
class _MomentCarryAdapter:
    def __call__(self, state: Any, bank: Any, slots: tuple[int, ...]) -> Any:
        return reset_slot_state(state, bank, slots)

    def carry_transition(self, state: Any, bank: Any, carry: TransitionCarry) -> Any:
        return carry_slot_state(state, bank, carry)


def moment_carry_adapter() -> TransitionStateAdapter[Any]:
    """A `TransitionStateAdapter` for `NamedMomentState`: `commit_transition(...,
    state_adapter=moment_carry_adapter())` carries the moments (`carry_slot_state`) instead
    of zeroing the affected rows (`reset_slot_state`, the default without an adapter).
    """
    return _MomentCarryAdapter()
