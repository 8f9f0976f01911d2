"""One compiled entry point per kernel, dispatched without walking its static parts.

`eqx.filter_jit` partitions every argument into arrays and static parts on every call: for a
bucket kernel that includes the objective (solver config, callables) and the trainable mask,
which never change between calls. Timed with a trivial body and the bank model's arguments
(`docs/benchmarks/kernels.md`): 46 µs per call through `filter_jit` with the objective and
mask as arguments, 34 µs with only the predictors and the bucket, 18 µs for this module's
flatten and `jax.jit` dispatch. Here the static parts are bound once, when the kernel is
built, into a plain `jax.jit` whose one static argument is the predictors' structure (treedef
and non-array leaves), so a call flattens only the predictors and the bucket.

Equal static parts share one entry (and so one compile cache), as they shared `filter_jit`'s:
rebuilding a kernel for a new run or an ensemble member never recompiles.

Runtime errors: `throw=True` kernels contain equinox's checks (host callbacks). Their failure
reaches `jax.jit` as a `JaxRuntimeError` that carries equinox's message; `call` waits for such
a kernel's result, as `filter_jit` does, and re-raises it as `eqx.EquinoxRuntimeError` with
that message, so callers see the error at the call that caused it. `throw=False` kernels
contain no callbacks and are dispatched asynchronously.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from hybrid_kernels._errors import equinox_message

_ENTRIES: dict[tuple, Callable] = {}
_MAX_ENTRIES = 1024


class _Static(eqx.Module):
    """Non-array outputs (`None` gradients of frozen leaves are not leaves) ride in the
    output's treedef, so `jax.jit` can return them."""

    value: Any = eqx.field(static=True)


def is_weak(x: Any) -> bool:
    """Whether `x` is a weak-typed jax array (`jnp.asarray(0.5)`): its dtype may change."""
    return isinstance(x, jax.Array) and x.weak_type


def strong(x: Any) -> Any:
    """`x` with the same dtype, strongly typed, so an update never changes a cache key."""
    return jax.numpy.asarray(x, dtype=x.dtype)


def flatten(tree: Any) -> tuple[tuple, list]:
    """`(static, dynamic)` of a pytree: `static = (treedef, leaves with None for arrays)`.

    `static` is what the compiled program depends on besides shapes; `dynamic` are the array
    leaves, in order. Weak-typed arrays are given a strong type here, so an optimiser update
    (which returns strong arrays) never changes the cache key.
    """
    leaves, treedef = jtu.tree_flatten(tree)
    static, dynamic = [], []
    for x in leaves:
        if eqx.is_array(x):
            dynamic.append(strong(x) if is_weak(x) else x)
            static.append(None)  # None is never a leaf, so it can mark an array's place
        else:
            static.append(x)
    return (treedef, tuple(static)), dynamic


def unflatten(static: tuple, dynamic: list) -> Any:
    """Inverse of `flatten`."""
    treedef, leaves = static
    it = iter(dynamic)
    return jtu.tree_unflatten(treedef, [next(it) if x is None else x for x in leaves])


def entry(body: Callable, *bound: Any) -> Callable:
    """`run(static, dynamic, *args) = body(*bound, unflatten(static, dynamic), *args)`, jitted.

    `bound` (the objective, the mask, ...) are pytrees of non-array leaves; equal hashable
    `bound` give the same `run`. `run.lower(...)` is `jax.jit`'s AOT lowering.
    """
    flat = [flatten(b) for b in bound]
    # A bound part with array leaves (refused later, at the first call's checks, with the
    # user's names) or an unhashable one (a callable object without `__hash__`) cannot be a
    # cache key: it gets an entry of its own, and since it is closed over rather than passed
    # as a static argument, jax never needs to hash it.
    key = None if any(d for _, d in flat) else (body, *(s for s, _ in flat))
    try:
        run = None if key is None else _ENTRIES.get(key)
    except TypeError:
        key = run = None
    if run is None:

        def call(static, dynamic, *args):
            out = body(*bound, unflatten(static, dynamic), *args)
            arrays, rest = eqx.partition(out, eqx.is_array)
            return arrays, _Static(rest if jtu.tree_leaves(rest) else None)

        call.__name__ = call.__qualname__ = getattr(body, "__name__", "kernel")
        run = jax.jit(call, static_argnums=0)
        if key is not None:
            if len(_ENTRIES) >= _MAX_ENTRIES:
                _ENTRIES.clear()
            _ENTRIES[key] = run
    return run


_CLOSED: dict[tuple, tuple[Any, Callable]] = {}
_MAX_CLOSED = 16


def closed_entry(body: Callable, data: Any, *bound: Any) -> Callable:
    """`run(static, dynamic, *args) = body(*bound, unflatten(static, dynamic), data, *args)`.

    Like `entry`, but `data` (a pytree of arrays that stays fixed for a whole run: a small
    bucket) is closed over, so its values are constants of the compiled program. XLA then
    folds what depends on them alone, as it does for a hand-written loop that closes over its
    data: for a one-trajectory solve, diffrax's checks on `t0`, `t1` and the save times, and
    their host callbacks. One entry per `data` object (held here, so its `id` stays its own).
    """
    key = (body, id(data), *(flatten(b)[0] for b in bound))
    held = _CLOSED.get(key)
    if held is not None and held[0] is data:
        return held[1]

    def call(static, dynamic, *args):
        out = body(*bound, unflatten(static, dynamic), data, *args)
        arrays, rest = eqx.partition(out, eqx.is_array)
        return arrays, _Static(rest if jtu.tree_leaves(rest) else None)

    call.__name__ = call.__qualname__ = getattr(body, "__name__", "kernel")
    run = jax.jit(call, static_argnums=0)
    if len(_CLOSED) >= _MAX_CLOSED:
        _CLOSED.clear()
    _CLOSED[key] = (data, run)
    return run


class _QuietCallbackFailure(logging.Filter):
    # jax logs a failed callback with its traceback before raising; the error we raise says it.
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "jax._src.callback" and "callback failed" in record.getMessage())


_CALLBACK_LOGGER = logging.getLogger("jax._src.callback")
_QUIET = _QuietCallbackFailure()


@contextlib.contextmanager
def quiet_callbacks() -> Iterator[None]:
    """Inside: jax's log of a failed host callback is dropped (the error raised says it)."""
    _CALLBACK_LOGGER.addFilter(_QUIET)
    try:
        yield
    finally:
        _CALLBACK_LOGGER.removeFilter(_QUIET)


def call(run: Callable, static: tuple, dynamic: list, *args: Any, wait: bool) -> Any:
    """Dispatch `run`; with `wait`, block on the result and raise a failed equinox check as
    `eqx.EquinoxRuntimeError` (the solver's reason as its message)."""
    if not wait:
        arrays, rest = run(static, dynamic, *args)
        return arrays if rest.value is None else eqx.combine(arrays, rest.value)
    with quiet_callbacks():
        try:
            arrays, rest = run(static, dynamic, *args)
            jax.block_until_ready(arrays)
        # A failed check can also surface as ValueError("INTERNAL: CpuCallback error ...").
        except (jax.errors.JaxRuntimeError, ValueError) as e:
            message = equinox_message(e)
            if message is None:
                raise
            raise eqx.EquinoxRuntimeError(message) from None
    return arrays if rest.value is None else eqx.combine(arrays, rest.value)
