"""Committing proposals: the functional host transaction and the pair search built on it.

A commit opens one host transaction (`_host.transaction`): it reads the bank's state from the
device once and digests it once, and the staleness check, the rule check, the caller's
acceptance callback (e.g. `within_error_budget`) and the optimizer-state carry all share that
view. It checks that the proposal was made from exactly this state (version and digest), asks
the caller's acceptance callback, applies the updates to host copies of the touched blocks,
and puts them back on the device in one transfer. Rejection, by the acceptance callback or
the postcondition, returns the very same bank and optimizer-state objects.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import jax
import numpy as np

from confluent_bank._carry import carry_from_host
from confluent_bank._host import STATE_NAMES, HostView, representation_problems, transaction
from confluent_bank._named_moments import reset_slot_state
from confluent_bank._optimizer_state import NamedMomentState, OptimizerStateAdapter
from confluent_bank._proposals import _pair_proposal
from confluent_bank._records import SlotUpdate, TransitionProposal, active_pairs
from confluent_bank._verify import check_implied_updates

if TYPE_CHECKING:
    from confluent_bank._bank import ConfluentPackBank

StateT = TypeVar("StateT")

_FIXED_BLOCKS = ("slot_ids", "transition_version")


def _apply_updates(
    host: Mapping[str, np.ndarray],
    updates: Sequence[SlotUpdate],
    slots: Sequence[int],
    max_order: int,
) -> dict[str, np.ndarray]:
    """Apply `updates` in order to copies of the touched host blocks; return those blocks."""
    changed: dict[str, np.ndarray] = {}
    for update in updates:
        name = update.name
        if name not in STATE_NAMES or name in _FIXED_BLOCKS:
            raise ValueError(
                "proposal may only update representation tensors; got block "
                f"{name!r} (slot_ids and transition_version are fixed)"
            )
        block = changed.get(name)
        if block is None:
            block = host[name]
        if block.ndim == 0 or update.index not in slots:
            raise ValueError(
                f"update must refer to an affected slot; {name}[{update.index}] is not one of "
                f"the proposal's slot positions {tuple(slots)}"
            )
        value = _cast(update, block.dtype)
        if value.shape != block.shape[1:]:
            raise ValueError(
                f"slot update shape does not match the preallocated row: {name} rows have "
                f"shape {block.shape[1:]}, the update has shape {value.shape}"
            )
        problems = representation_problems({name: value}, max_order=max_order)
        if problems:
            raise ValueError(
                f"update value {update.value!r} for {name}[{update.index}] is out of range: "
                + ", ".join(problems)
            )
        if name not in changed:
            block = block.copy()
            changed[name] = block
        block[update.index] = value
    return changed


def _cast(update: SlotUpdate, dtype: np.dtype) -> np.ndarray:
    """`update.value` in the block's dtype, refusing any cast that changes or overflows it."""
    name = update.name
    try:
        raw = np.asarray(update.value)
        with np.errstate(over="ignore", invalid="ignore"):
            value = raw.astype(dtype)
    except (OverflowError, ValueError, TypeError):
        # e.g. 2**70 for an int64 block or 10**400 for a float block.
        raise ValueError(
            f"update value {update.value!r} for {name}[{update.index}] does not fit its "
            f"dtype {dtype}"
        ) from None
    if dtype.kind in "biu" and not np.array_equal(value, raw):
        # A cast must never change an integer or flag: 1.5 is not a mode, 2 is not a flag.
        raise ValueError(
            f"update value {update.value!r} for {name} is not representable as {dtype}"
        )
    if dtype.kind == "f" and not np.all(np.isfinite(value)):
        raise ValueError(
            f"update value {update.value!r} for {name}[{update.index}] overflows {dtype}"
        )
    return value


def _candidate(bank: Any, host: Mapping[str, np.ndarray], changed: dict[str, np.ndarray]) -> Any:
    """The bank with `changed` blocks and the next version, put on the device in one call."""
    version = host["transition_version"]
    changed = {**changed, "transition_version": np.asarray(version + 1, dtype=version.dtype)}
    names = tuple(changed)
    originals = [getattr(bank, name) for name in names]
    values = [changed[name] for name in names]
    # Keep each block's placement *and* committedness: jit compiles separately for committed
    # and uncommitted inputs of the same shape, so changing either would recompile kernels.
    committed = [bool(getattr(leaf, "committed", False)) for leaf in originals]
    if all(committed):
        arrays = jax.device_put(values, [leaf.sharding for leaf in originals])
    elif not any(committed):
        arrays = jax.device_put(values)
    else:
        arrays = [
            jax.device_put(value, leaf.sharding) if is_committed else jax.device_put(value)
            for value, leaf, is_committed in zip(values, originals, committed, strict=True)
        ]
    return dataclasses.replace(bank, **dict(zip(names, arrays, strict=True)))


def commit_transition(
    bank: ConfluentPackBank,
    proposal: TransitionProposal,
    optimizer_state: StateT,
    *,
    between_steps: bool,
    acceptance: Callable[[ConfluentPackBank, TransitionProposal], bool],
    postcondition: Callable[[ConfluentPackBank], bool] | None = None,
    state_adapter: OptimizerStateAdapter[StateT] | None = None,
) -> tuple[ConfluentPackBank, StateT, bool]:
    """Apply a proposal as one functional host transaction; rejection returns the originals.

    Steps, in order: the between-steps guard; the staleness check (version, then digest of
    the current state); mapping stable ids to positions; for a built-in kind, recomputing its
    rule on this bank, whose updates the proposal must carry exactly (so an edited value or a
    relabelled kind is refused, not judged); `acceptance(bank, proposal)`
    (falsy → `(bank, optimizer_state, False)`, the same objects, before anything is
    built); applying the updates in order; the candidate with `transition_version + 1`; the
    optimizer state (`state_adapter.carry_transition(state, candidate, carry)` with the
    proposal's `TransitionCarry` when the adapter has that method, else
    `state_adapter(state, candidate, slots)`, or `reset_slot_state` for a
    `NamedMomentState`); `postcondition(candidate)` (falsy → the originals and `False`).

    The bank is read from the device and digested once, in one host transaction that the
    acceptance callback shares (a `within_error_budget` callback reads no more); the touched
    blocks go back in one transfer.
    The acceptance callback is where an `error_budget` is judged (see `within_error_budget`).
    Built-in kinds (`"centered_pair"`, `"duplicate_merge"`, `"cluster_to_moments"`,
    `"pair_to_derivative"`, `"remove_zero"`, `"zero_output_birth"`) must carry exactly their
    rule's updates; a proposal of any other kind is checked for structure and ranges only,
    and judging it is the acceptance callback's job.

    **Arguments:**

    - `bank`: the `ConfluentPackBank` the proposal was made from.
    - `proposal`: a `TransitionProposal`.
    - `optimizer_state`: a `NamedMomentState`, or any state `state_adapter` understands.
    - `between_steps`: must be `True`.
    - `acceptance`: `(bank, proposal) -> bool`.
    - `postcondition`: optional `(candidate) -> bool`, checked last.
    - `state_adapter`: an `OptimizerStateAdapter`, e.g. `confluent_bank.optax.commit_adapter()`
      (which carries the moments through the transition, see `TransitionCarry`).

    **Returns:** `(bank', state', accepted)`.

    **Raises:** `RuntimeError` ("between") outside an inter-step window; `ValueError` for a
    stale proposal ("stale"), unknown stable ids, a built-in-kind proposal whose updates are
    not its rule's ("tampered or inconsistent"), or an update that names a fixed or unknown
    block, a slot outside the proposal, a wrong row shape, a value the block's dtype cannot
    hold (overflow included) or a value outside the representation's ranges (modes 0..2,
    orders 0..max_order, `rho ≥ 0`, `ages ≥ 0`), or an accepted transition that would leave
    more centred pairs active than the bank's `max_pairs`; `TypeError` ("explicit") for a
    non-`NamedMomentState` state without adapter.
    """
    if not between_steps:
        raise RuntimeError(
            "commit only between optimizer steps; pass between_steps=True once the last "
            "update has been applied"
        )
    if not isinstance(proposal, TransitionProposal):
        raise TypeError(f"proposal must be a TransitionProposal, got {type(proposal).__name__}")
    with transaction(bank) as view:
        return _commit(
            bank,
            view,
            proposal,
            optimizer_state,
            acceptance=acceptance,
            postcondition=postcondition,
            state_adapter=state_adapter,
        )


def _commit(
    bank: Any,
    view: HostView,
    proposal: TransitionProposal,
    optimizer_state: Any,
    *,
    acceptance: Callable[[Any, TransitionProposal], bool],
    postcondition: Callable[[Any], bool] | None,
    state_adapter: Any,
) -> tuple[Any, Any, bool]:
    """`commit_transition`'s steps after the guards, on the transaction's host view."""
    if proposal.source_version != view.version or proposal.source_digest != view.digest:
        raise ValueError(
            "stale transition proposal: it was made from version "
            f"{proposal.source_version} (digest {proposal.source_digest[:12]}…), the bank is at "
            f"version {view.version} (digest {view.digest[:12]}…); propose again"
        )
    slots = view.positions(proposal.slot_ids)
    check_implied_updates(view, proposal, slots)
    if not acceptance(bank, proposal):
        return bank, optimizer_state, False
    changed = _apply_updates(view.host, proposal.updates, slots, view.max_order)
    _check_pair_capacity(view, changed)
    candidate = _candidate(bank, view.host, changed)
    if state_adapter is None:
        if not isinstance(optimizer_state, NamedMomentState):
            raise TypeError(
                "unknown optimizer state requires an explicit OptimizerStateAdapter: got "
                f"{type(optimizer_state).__module__}.{type(optimizer_state).__qualname__}; pass "
                "state_adapter=... (confluent_bank.optax.commit_adapter() for optax states)"
            )
        next_state: Any = reset_slot_state(optimizer_state, candidate, slots)
    elif hasattr(state_adapter, "carry_transition"):
        carry = carry_from_host(view.host, proposal, slots)
        next_state = state_adapter.carry_transition(optimizer_state, candidate, carry)
    else:
        next_state = state_adapter(optimizer_state, candidate, slots)
    if postcondition is not None and not postcondition(candidate):
        return bank, optimizer_state, False
    return candidate, next_state, True


def _check_pair_capacity(view: HostView, changed: Mapping[str, np.ndarray]) -> None:
    """Refuse a transition that leaves more centred pairs active than `max_pairs`: the forward
    evaluates the pair formulas on that many slots only."""
    if view.max_pairs is None:
        return
    pairs = active_pairs({**view.host, **changed})
    if pairs > view.max_pairs:
        raise ValueError(
            f"the transition would leave {pairs} centred pairs active, above the bank's "
            f"max_pairs={view.max_pairs}; build the bank with a larger max_pairs "
            "(init_confluent_bank(..., max_pairs=...)), or turn a pair into its derivative atom "
            "first (propose_derivative)"
        )


def _score(conditioning_score: Callable[[Any], Any], bank: Any) -> float:
    value = conditioning_score(bank)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"conditioning_score must return a real number, got {type(value).__name__}"
        ) from None


def detect_transitions(
    bank: ConfluentPackBank,
    conditioning_score: Callable[[ConfluentPackBank], float],
    *,
    error_budget: float = 0.0,
) -> tuple[TransitionProposal, ...]:
    """Rank every valid ordinary pair merge by how much it improves a score.

    For each position pair `first < second` (lexicographic) whose `propose_pair` rule holds,
    the committed candidate (exactly what `commit_transition` would build, version
    included) is scored; proposals with `gain = score(candidate) − score(bank) > 0` are
    returned, largest gain first, ties by ascending stable-id tuple. The result is the same
    as proposing and committing pair by pair, but the bank is read from the device once, one
    digest is computed, and each candidate is built directly from host arrays with one
    device transfer.

    All returned proposals share one source digest: after committing one, the others are
    stale and the search must be rerun.

    A bank built with `max_pairs` that already holds that many active pairs gets no proposal
    (each would be refused at commit).

    **Arguments:**

    - `bank`: a `ConfluentPackBank`.
    - `conditioning_score`: `(bank) -> float`, larger is better.
    - `error_budget`: recorded on every proposal (pair merges are exact; default 0).

    **Returns:** a tuple of `TransitionProposal`s.

    **Raises:** `ValueError` for a negative or non-finite `error_budget`; `TypeError` if the
    score is not a real number.
    """
    if isinstance(error_budget, bool) or not isinstance(error_budget, numbers.Real):
        raise TypeError(f"error_budget must be a real number, got {error_budget!r}")
    if not math.isfinite(float(error_budget)) or error_budget < 0:
        raise ValueError(f"error_budget must be a finite non-negative number, got {error_budget!r}")
    baseline = _score(conditioning_score, bank)
    view = HostView.read(bank)
    ranked: list[tuple[float, tuple[int, ...], TransitionProposal]] = []
    if view.max_pairs is not None and active_pairs(view.host) >= view.max_pairs:
        return ()  # every merge would be refused at commit
    for first in range(view.max_packs):
        for second in range(first + 1, view.max_packs):
            try:
                proposal = _pair_proposal(view, first, second, error_budget)
            except ValueError:
                continue
            changed = _apply_updates(view.host, proposal.updates, (first, second), view.max_order)
            gain = _score(conditioning_score, _candidate(bank, view.host, changed)) - baseline
            if gain > 0:
                ranked.append((-gain, proposal.slot_ids, proposal))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return tuple(item[2] for item in ranked)
