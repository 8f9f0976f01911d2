"""The between-steps hook: host-side edits of the model between two optimiser steps.

A hook sees the predictors and the optimiser state that the next step will use, and may return
edited copies, for example a confluent bank transition that moves slots around together with
their Adam moments. Edits must keep every compiled kernel valid: the pytree structure and every
array's shape and dtype stay the same, and values that are not arrays (compiled in as
constants) do not change. Then no kernel recompiles.

A hook may also report what it did through an `events` list: the trainer records the entries
appended during a run in `LossHistory.events`, where `plot_history` marks them and a saved
`TrainingState` keeps them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp


@runtime_checkable
class BetweenStepsHook(Protocol):
    """Anything with a `between_steps` method; a plain function of the same form also works.

    `between_steps(step, predictors, opt_state)` is called after `step` optimiser steps (over
    all phases) and before the next one, never after the last. It returns `None` (no change) or
    `(predictors, opt_state)` with the same structure, shapes and dtypes.

    A hook object may also have an `events` list (for example
    `confluent_bank.TransitionHook`). Each entry it appends during a run, a dict or a
    dataclass instance with JSON-serialisable values, is recorded in `LossHistory.events` as
    a dict, with `"step"` set to the steps done when the hook ran unless the entry has one.

    A hook object with both `state_dict()` (returning a JSON-serialisable dict) and
    `load_state_dict(state)` keeps its own state across a checkpoint: the trainer saves
    `state_dict()` in the `TrainingState` it checkpoints (`TrainingState.hook_state`) and,
    on `resume`, calls `load_state_dict` with it before the first resumed step.
    """

    def between_steps(self, step: int, predictors: Any, opt_state: Any) -> tuple[Any, Any] | None:
        """Edit the model between steps, or return `None` to leave it alone."""
        ...


def resolve_hook(hooks: Any) -> Callable[[int, Any, Any], tuple[Any, Any] | None] | None:
    """Turn the `hooks` argument into one callable (or `None`), or raise `TypeError`.

    A list or tuple of hooks runs them in order after each step, each one given what the one
    before returned (its result checked as a single hook's is)."""
    if hooks is None:
        return None
    if isinstance(hooks, list | tuple):
        calls = [_one_hook(h, f"hooks[{i}]") for i, h in enumerate(hooks)]
        return functools.partial(_run_in_order, calls) if calls else None
    return _one_hook(hooks, "hooks")


def _one_hook(hook: Any, name: str) -> Callable[[int, Any, Any], tuple[Any, Any] | None]:
    method = getattr(hook, "between_steps", None)
    if callable(method):
        return method
    if callable(hook):
        return hook
    raise TypeError(
        f"{name}={hook!r} has no between_steps(step, predictors, opt_state) method and is not "
        "callable"
    )


def _run_in_order(calls: list[Callable[..., Any]], step: int, predictors: Any, opt_state: Any):
    changed = False
    for call in calls:
        predictors, opt_state, edited = apply_hook(call, step, predictors, opt_state)
        changed = changed or edited
    return (predictors, opt_state) if changed else None


def _describe_path(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _placed_like(leaf: jax.Array, ref: Any) -> jax.Array:
    """`leaf` with the placement of `ref`: same sharding, and committed exactly when it is.

    jit keeps one compiled executable per input sharding *and* committedness, so a hook that
    hands back, say, arrays `device_put` on a device where the run had uncommitted ones would
    recompile every kernel at the next step although nothing was retraced.
    """
    if not isinstance(ref, jax.Array):
        return leaf
    if ref.committed:
        if leaf.committed and leaf.sharding == ref.sharding:
            return leaf
        return jax.device_put(leaf, ref.sharding)
    if leaf.committed:
        return jnp.asarray(jax.device_get(leaf))  # uncommitted again, like `ref`
    return leaf


def _conform(name: str, step: int, old: Any, new: Any) -> Any:
    """Check `new` against `old` leaf by leaf; return `new` with arrays cast like `old`.

    A hook runs after every step and usually hands most leaves back untouched (often the whole
    optimizer state), so what it returns unchanged is not checked again: these checks cost
    about 0.1 ms per step on a bank's optimizer state, a noticeable part of a small step."""
    if new is old:
        return old
    old_paths, old_def = jax.tree_util.tree_flatten_with_path(old)
    new_leaves, new_def = jax.tree_util.tree_flatten(new)
    if old_def != new_def:
        raise ValueError(
            f"between_steps hook changed the pytree structure of {name} after step {step}; "
            "a hook may change values only (same structure, shapes and dtypes), otherwise "
            f"every kernel would recompile.\n  before: {old_def}\n  after:  {new_def}"
        )
    out = []
    for (path, ref), leaf in zip(old_paths, new_leaves, strict=True):
        if leaf is ref:
            out.append(leaf)
            continue
        where = f"{name}{_describe_path(path)}"
        if eqx.is_array(ref):
            if not eqx.is_array(leaf):
                raise ValueError(
                    f"between_steps hook replaced the array at {where} by {type(leaf).__name__} "
                    f"after step {step}; return an array of shape {ref.shape}"
                )
            if leaf.shape != ref.shape or leaf.dtype != ref.dtype:
                raise ValueError(
                    f"between_steps hook changed {where} from shape {ref.shape} dtype "
                    f"{ref.dtype} to shape {leaf.shape} dtype {leaf.dtype} after step {step}; "
                    "shapes and dtypes must stay the same"
                )
            # A weak-typed or NumPy leaf would be a new cache key for the jitted kernels.
            if not isinstance(leaf, jax.Array) or leaf.weak_type != ref.weak_type:
                leaf = jnp.asarray(leaf, dtype=ref.dtype)
            leaf = _placed_like(leaf, ref)
        elif leaf is not ref:
            same = False
            try:
                same = bool(leaf == ref)
            except Exception:  # any failed comparison means "changed"
                same = False
            if not same:
                raise ValueError(
                    f"between_steps hook changed the non-array value at {where} from {ref!r} "
                    f"to {leaf!r} after step {step}; non-array values are compiled into the "
                    "kernels as constants, so store values that change as jnp arrays"
                )
        out.append(leaf)
    return jax.tree_util.tree_unflatten(old_def, out)


def apply_hook(
    hook: Callable[[int, Any, Any], tuple[Any, Any] | None],
    step: int,
    predictors: Any,
    opt_state: Any,
) -> tuple[Any, Any, bool]:
    """Run `hook` and validate its result; returns `(predictors, opt_state, changed)`."""
    result = hook(step, predictors, opt_state)
    if result is None:
        return predictors, opt_state, False
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(
            f"between_steps hook returned {type(result).__name__} after step {step}; expected "
            "None or a (predictors, opt_state) tuple"
        )
    new_predictors = _conform("predictors", step, predictors, result[0])
    new_opt_state = _conform("opt_state", step, opt_state, result[1])
    return new_predictors, new_opt_state, True


_LIST_KEY = "hook_list"  # the saved state of a list of hooks: {_LIST_KEY: [each hook's]}


class HookEvents:
    """Reads the entries hooks append to their `events` lists, as JSON-ready dicts, and their
    checkpointed state.

    With a list of hooks the events come hook by hook in the list's order, and the saved
    state is `{"hook_list": [state of each hook, or None]}`."""

    def __init__(self, hooks: Any) -> None:
        self.chained = isinstance(hooks, list | tuple)
        self.hooks = list(hooks) if self.chained else [hooks]
        self.seen = [len(_events_of(h)) for h in self.hooks]

    def state_dict(self) -> dict[str, Any] | None:
        """The hooks' `state_dict()` as JSON-ready data, or `None` when none has state."""
        states = [_state_of(h) for h in self.hooks]
        if all(state is None for state in states):
            return None
        return {_LIST_KEY: states} if self.chained else states[0]

    def load_state_dict(self, state: Mapping[str, Any] | None, where: str) -> None:
        """Hand a checkpoint's hook state back to the hooks; events they restore are not
        recorded again (the checkpoint's history already holds them)."""
        if state is None:
            return
        listed = set(state) == {_LIST_KEY}
        states = state.get(_LIST_KEY) if self.chained else [None if listed else state]
        if listed != self.chained or not isinstance(states, list) or len(states) != len(self.hooks):
            raise ValueError(
                f"{where}: the checkpoint holds the state of different hooks than "
                f"hooks={self._named()!r}; resume with the hooks the run was saved with"
            )
        for hook, saved in zip(self.hooks, states, strict=True):
            if saved is None:
                continue
            if not _stateful(hook):
                raise ValueError(
                    f"{where}: the checkpoint holds the state of a hook with state_dict() and "
                    f"load_state_dict(), but hooks={self._named()!r} has no load_state_dict "
                    f"for it ({hook!r}); resume with the hooks the run was saved with"
                )
            hook.load_state_dict(saved)
        self.seen = [len(_events_of(h)) for h in self.hooks]

    def take(self, step: int) -> list[dict[str, Any]]:
        """The entries appended since the last call, each as a dict with a `"step"`."""
        out = []
        for i, hook in enumerate(self.hooks):
            events = _events_of(hook)
            new, self.seen[i] = list(events[self.seen[i] :]), len(events)
            out += [_event_dict(event, step) for event in new]
        return out

    def _named(self) -> Any:
        return self.hooks if self.chained else self.hooks[0]


def _events_of(hook: Any) -> Sequence[Any]:
    events = getattr(hook, "events", None)
    if events is None:
        return ()
    if not isinstance(events, Sequence) or isinstance(events, str | bytes):
        raise TypeError(
            f"the hook's events attribute is a {type(events).__name__}; expected a list of "
            "dicts or dataclass instances"
        )
    return events


def _stateful(hook: Any) -> bool:
    return callable(getattr(hook, "state_dict", None)) and callable(
        getattr(hook, "load_state_dict", None)
    )


def _state_of(hook: Any) -> dict[str, Any] | None:
    """A hook's `state_dict()` as JSON-ready data, or `None` for a stateless hook."""
    if not _stateful(hook):
        return None
    state = hook.state_dict()
    if not isinstance(state, Mapping):
        raise TypeError(
            f"the hook's state_dict() returned a {type(state).__name__}; expected a dict "
            "with JSON-serialisable values"
        )
    try:  # through JSON once, so a checkpoint never holds what it cannot load back
        return json.loads(json.dumps(dict(state), default=_json_scalar))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the hook's state_dict() is not JSON-serialisable ({exc}); the trainer saves "
            "it in the checkpoint"
        ) from None


def _event_dict(event: Any, step: int) -> dict[str, Any]:
    if isinstance(event, Mapping):
        record = dict(event)
    elif dataclasses.is_dataclass(event) and not isinstance(event, type):
        record = dataclasses.asdict(event)
    else:
        raise TypeError(
            f"between_steps hook reported an event of type {type(event).__name__} after step "
            f"{step}; events must be dicts or dataclass instances"
        )
    record = {"step": step, **record}
    try:  # through JSON once: tuples become lists, and anything unsaveable fails here
        return json.loads(json.dumps(record, default=_json_scalar))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"between_steps hook reported an event after step {step} that is not "
            f"JSON-serialisable: {record!r} ({exc})"
        ) from None


def _json_scalar(value: Any) -> Any:
    # NumPy and JAX scalars (a float32 loss, an int64 slot id) are saved as Python numbers.
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
