"""Exact transports of a bank and of the optimizer moments that travel with it.

Two transformations change the bank's coordinates without changing the function it represents:

* a permutation of slot positions (every row of every block moves, stable ids included);
* the tanh sign relabel `(w, s) ↦ (−w, −s)` of ordinary tanh slots, exact at every order
  because `tanh^(n)` has the parity of `n + 1`.

Optimizer moments have to follow: moments are permuted with the rows, and under the sign
relabel linear statistics (first moments, momenta) of `weights`/`scales` flip sign while
quadratic and absolute statistics do not. A `NamedMomentState` follows through
`transport_optimizer_state`; other optimizer states go through an `ExactTransportAdapter` (see
`confluent_bank.optax` for optax states). Bank blocks and moments move with the same
`transport_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import jax
import numpy as np

from confluent_bank._host import STATE_NAMES
from confluent_bank._named_moments import transport_optimizer_state
from confluent_bank._optimizer_state import ExactTransportAdapter, transport_rows
from confluent_bank._records import SlotMode, as_index

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

StateT = TypeVar("StateT")


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
        try:
            result.append(as_index(item, argument))
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
    blocks = transport_rows(blocks, permutation, sign_slots, bank.max_packs)
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
    wrong = [i for i in sign_slots if int(modes[i]) != SlotMode.ORDINARY]
    if wrong:
        raise ValueError(
            f"the tanh sign relabel needs ordinary (mode 0) slots; slots {wrong} have modes "
            f"{[int(modes[i]) for i in wrong]}"
        )
    return _transport(bank, optimizer_state, None, sign_slots, state_adapter)
