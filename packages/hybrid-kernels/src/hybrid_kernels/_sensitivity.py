"""Forward or reverse sensitivities: which one a bucket step uses, and the forward gradient.

A bucket step differentiates the loss, a scalar, with respect to the trainable scalars. Reverse
mode does that in one backward pass whatever their number, but it has to store (or recompute)
the forward solve and compiles the solver twice, once forwards and once backwards. Forward
mode carries one tangent per trainable scalar through the same solve (`diffrax.ForwardMode`):
no backward pass to compile or run, but a cost that grows with the number of scalars. So
forward wins for a mechanistic model with a handful of rates and loses for a neural network.

`SolverConfig(sensitivity="auto")` (the default) chooses when a kernel is traced: the number of
trainable scalars is a static property of the predictors' shapes and the trainable mask, so the
choice is part of the compiled program and never changes between calls of one shape.

Forward mode cannot differentiate every `simulate_fn`: one that calls `diffrax.diffeqsolve`
itself, without `adjoint=solver.adjoint`, solves through diffrax's default
`RecursiveCheckpointAdjoint`, a `custom_vjp`, and JAX refuses to push tangents through it.
`"auto"` finds out by tracing forward mode, the trace it would make anyway: if that trace fails
and reverse mode's succeeds, the kernel uses reverse mode, and so does every later shape of the
same objective (`fallback_reason`), with one `logging` record. So the common case (forward mode
works) costs nothing extra, and a fallback costs one aborted trace per objective, never a
step. An explicit `sensitivity="forward"` that cannot run raises a `ValueError` instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.flatten_util import ravel_pytree

FORWARD_MAX_SCALARS = 16
"""`"auto"` uses forward mode up to this many trainable scalars, reverse mode above.

Measured crossover (see `docs/benchmarks/kernels.md`): on a 2-core CPU forward mode's steady
step was 0.89x reverse mode's at 14 scalars, 0.97x at 20 and 1.17x at 32 (parity near 22), and
forward mode compiled faster at every size; 16 keeps a margin for measurement noise."""

_log = logging.getLogger(__name__)

_FALLBACKS: dict[Any, str] = {}
"""Objectives whose forward trace failed under `"auto"`, with the reason (bounded, see below)."""
_MAX_FALLBACKS = 1024

TANGENT_CHUNK = 64
"""Forward mode pushes at most this many tangents through one solve at a time; more trainable
scalars are processed in chunks (`jax.lax.map`), which bounds the tangent memory at the price
of one more primal solve per chunk."""


def trainable_scalars(diff: Any) -> int:
    """How many scalars a gradient over `diff` (the trainable part of the predictors) has."""
    return sum(math.prod(jnp.shape(x)) for x in jtu.tree_leaves(diff) if eqx.is_inexact_array(x))


def resolve(solver: Any, n_scalars: int) -> Literal["forward", "reverse"]:
    """The sensitivity a kernel uses for `solver` and `n_scalars` trainable scalars.

    `"auto"` keeps reverse mode when the adjoint is `BacksolveAdjoint` (a continuous adjoint is
    a deliberate reverse-mode choice) and forward mode when it is `ForwardMode`; otherwise it
    picks forward for at most `FORWARD_MAX_SCALARS` scalars.
    """
    if solver.sensitivity != "auto":
        return solver.sensitivity
    if isinstance(solver.adjoint, diffrax.BacksolveAdjoint):
        return "reverse"
    if isinstance(solver.adjoint, diffrax.ForwardMode):
        return "forward"
    return "forward" if n_scalars <= FORWARD_MAX_SCALARS else "reverse"


def resolved_solver(solver: Any, mode: Literal["forward", "reverse"]) -> Any:
    """`solver` as `simulate_fn` sees it in `mode`: the sensitivity resolved and, in forward
    mode, the adjoint replaced by `diffrax.ForwardMode()` (reverse-mode adjoints such as
    `RecursiveCheckpointAdjoint` cannot be differentiated forwards)."""
    if mode == "forward":
        return dataclasses.replace(solver, sensitivity="forward", adjoint=diffrax.ForwardMode())
    return dataclasses.replace(solver, sensitivity="reverse")


def value_and_grad(
    fn_for: Callable[[Any], Callable[[Any], tuple[jax.Array, Any]]],
    solver: Any,
    diff: Any,
    *,
    key: Any,
) -> tuple[tuple[jax.Array, Any], Any]:
    """`((value, aux), grads)` of `fn_for(s)(diff) -> (scalar, aux)`, in the mode `solver` asks.

    Called at trace time. `fn_for(s)` is the objective with `s` as the solver `simulate_fn`
    sees (`resolved_solver`). `key` names the objective (hashable, or not cached): under
    `"auto"`, once its forward trace has failed, every later trace goes straight to reverse.
    """
    mode = resolve(solver, trainable_scalars(diff))
    if mode == "forward" and solver.sensitivity == "auto" and fallback_reason(key) is not None:
        mode = "reverse"
    reverse = eqx.filter_value_and_grad(fn_for(resolved_solver(solver, "reverse")), has_aux=True)
    if mode == "reverse":
        return reverse(diff)
    try:
        return forward_value_and_grad(fn_for(resolved_solver(solver, "forward")), diff)
    except Exception as error:  # any failure: only reverse mode's trace says whose fault it is
        forward_error = error
    try:
        out = reverse(diff)
    except Exception:
        # The model fails either way: its own error, unchanged. Where forward mode failed
        # only for being forward mode (a custom_vjp), that is reverse mode's error, which
        # names the model's fault (a wrong `state_to_output`, say) rather than the mode's.
        if _is_mode_error(forward_error):
            raise
        raise forward_error from None
    if solver.sensitivity == "forward":
        raise ValueError(
            "SolverConfig(sensitivity='forward') cannot differentiate this simulate_fn: forward "
            f"mode failed with {type(forward_error).__name__}: {_first_line(forward_error)}. "
            "A simulate_fn that calls diffrax.diffeqsolve directly uses diffrax's default "
            "RecursiveCheckpointAdjoint, a custom_vjp that forward mode cannot differentiate: "
            "solve with `solver.diffeqsolve(term, ts, y0)`, or pass `adjoint=solver.adjoint` "
            "to diffrax.diffeqsolve; or use sensitivity='auto' or 'reverse'."
        ) from forward_error
    _record_fallback(key, forward_error)
    return out


def fallback_reason(key: Any) -> str | None:
    """Why `"auto"` uses reverse mode for the objective `key` although it chose forward
    (`None` if it did not fall back, or `key` cannot be hashed)."""
    try:
        return _FALLBACKS.get(key)
    except TypeError:
        return None


def _record_fallback(key: Any, error: Exception) -> None:
    reason = (
        "sensitivity='auto' uses reverse mode: forward mode cannot differentiate simulate_fn "
        f"({type(error).__name__}: {_first_line(error)}). To use forward mode, solve with "
        "`solver.diffeqsolve` or pass `adjoint=solver.adjoint` to diffrax.diffeqsolve; "
        "sensitivity='reverse' silences this notice."
    )
    try:
        known = key in _FALLBACKS
    except TypeError:  # an unhashable objective: said at each trace, which is still not per step
        known = False
    else:
        if len(_FALLBACKS) >= _MAX_FALLBACKS:
            _FALLBACKS.clear()
        _FALLBACKS[key] = reason
    if not known:
        _log.info(reason)


def _is_mode_error(error: Exception) -> bool:
    """Whether `error` is jax refusing forward mode through a `custom_vjp` (diffrax's default
    adjoint), not a fault of the model."""
    return isinstance(error, TypeError) and "custom_vjp" in str(error)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300].rstrip(".") if text else ""


def forward_value_and_grad(
    fn: Callable[[Any], tuple[jax.Array, Any]], diff: Any, *, chunk: int = TANGENT_CHUNK
) -> tuple[tuple[jax.Array, Any], Any]:
    """`((value, aux), grads)` of `fn(diff) -> (scalar, aux)` in forward mode.

    `jax.jacfwd`'s construction (one `jax.jvp` per basis tangent, vmapped), kept by hand so the
    primal value and `aux` come out of the same pass. Only `diff`'s inexact array leaves get
    tangents; `None` leaves (frozen) stay `None` in `grads`, which has `diff`'s structure.
    """
    arrays, rest = eqx.partition(diff, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(arrays)
    n = flat.shape[0]

    def f(x):
        return fn(eqx.combine(unravel(x), rest))

    def push(tangent):
        value, dvalue, aux = jax.jvp(f, (flat,), (tangent,), has_aux=True)
        return value, dvalue, aux

    if n == 0:
        value, aux = f(flat)
        return (value, aux), jtu.tree_map(lambda _: None, diff)
    pushes = jax.vmap(push, out_axes=(None, 0, None))
    n_chunks = -(-n // chunk)
    if n_chunks == 1:
        value, dflat, aux = pushes(jnp.eye(n, dtype=flat.dtype))
    else:
        # Equal chunks, the last padded with zero tangents, so the solve compiles only once.
        size = -(-n // n_chunks)
        basis = jnp.eye(n_chunks * size, n, dtype=flat.dtype).reshape(n_chunks, size, n)
        values, dflat, auxes = jax.lax.map(pushes, basis)
        value, aux = values[0], jtu.tree_map(lambda a: a[0], auxes)
        dflat = dflat.reshape(n_chunks * size)[:n]
    grads = eqx.combine(unravel(dflat.astype(flat.dtype)), _zeros_like_rest(rest))
    return (value, aux), grads


def _zeros_like_rest(rest: Any) -> Any:
    # Non-inexact leaves of the trainable part (ints, callables) have no gradient; equinox's
    # reverse-mode filters give them None, and so does this.
    return jtu.tree_map(lambda _: None, rest)
