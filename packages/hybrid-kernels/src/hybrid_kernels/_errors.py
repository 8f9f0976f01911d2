"""Tracing kernels without host callbacks, for `SolverConfig(throw=False)`; solver errors.

Equinox implements runtime checks (`eqx.error_if`, used throughout diffrax) with a host
callback unless `EQX_ON_ERROR=nan`, and JAX's persistent compilation cache refuses programs
that contain host callbacks. Diffrax's own `throw=False` removes the final solver-result
check, but its argument checks (saveat times increasing, inside [t0, t1]) remain. While a
`throw=False` kernel traces, we route those checks to equinox's documented `"nan"` behaviour:
a failed check poisons the value with NaN, which the kernel then sees as a failed row. The
switch is scoped to that trace only; other code in the process keeps raising errors. jax
caches traces per function and static arguments, not per switch state, so the switch must be
decided by a static argument of the jitted function it wraps: the kernels key it on
`solver.throw`, which diffrax also receives as its static `throw`.

Why a patch and not a public route: equinox reads `EQX_ON_ERROR` once, when it is imported
(`equinox._config`), and its public `error_if` no longer documents an `on_error` argument;
diffrax's checks call it with the default. So there is no public way to choose "nan" for one
trace and "raise" for the rest of the process. This module is the only place that touches
equinox internals (`equinox._errors.branched_error_if_impl_jit`, in every equinox 0.13
release, which is what installs with jax 0.7.2 and with jax 0.10.2); `tests/test_errors.py`
pins the behaviour and runs on both ends of the jax range, and `host_callbacks_patchable()`
reports whether it engaged. If a future equinox moves the internal, kernels keep their
callbacks (correct, but uncacheable) and setting `EQX_ON_ERROR=nan` before importing equinox
is the process-wide fallback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import equinox as eqx

try:  # equinox internals; guarded so a refactor degrades to "callbacks remain", never breaks
    from equinox import _errors as _eqx_errors

    _ORIGINAL = _eqx_errors.branched_error_if_impl_jit
except (ImportError, AttributeError):  # pragma: no cover - depends on the equinox version
    _eqx_errors = None
    _ORIGINAL = None


def _nan_on_error(x, pred, index, msgs, *, on_error):
    # "default" defers to EQX_ON_ERROR; an explicit choice by the caller is respected.
    return _ORIGINAL(x, pred, index, msgs, on_error="nan" if on_error == "default" else on_error)


@contextlib.contextmanager
def no_host_callbacks(enabled: bool = True) -> Iterator[None]:
    """Within this block (at trace time), equinox runtime errors become NaNs, not callbacks."""
    if not enabled or _eqx_errors is None:
        yield
        return
    previous = _eqx_errors.branched_error_if_impl_jit
    _eqx_errors.branched_error_if_impl_jit = _nan_on_error
    try:
        yield
    finally:
        _eqx_errors.branched_error_if_impl_jit = previous


def host_callbacks_patchable() -> bool:
    """Whether this equinox version lets kernels drop their host callbacks per trace."""
    return _eqx_errors is not None


class RowSolveError(eqx.EquinoxRuntimeError):
    """A `throw=True` kernel call failed; `rows` are the bucket rows whose solve failed.

    It stays an `EquinoxRuntimeError`, so code that catches solver failures still does.
    `bucket` is the payload the kernel was called on: a caller holding the dataset maps
    `rows` to experiment ids through `dataset.exp_ids[b]` of that bucket.
    """

    def __init__(
        self, message: str, *, bucket: Any, rows: tuple[int, ...], exp_ids: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.rows = rows
        self.exp_ids = exp_ids


_EQX_PREFIX = "EquinoxRuntimeError: "


def _after_equinox_prefix(error: BaseException) -> str | None:
    """The text of `error` after equinox's error prefix, or None if it has none."""
    text = str(error)
    return text.split(_EQX_PREFIX, 1)[1] if _EQX_PREFIX in text else None


def equinox_message(error: BaseException) -> str | None:
    """The message of the equinox check that failed inside `error` (e.g. a `JaxRuntimeError`
    from a plain `jax.jit`), or None if it is not one."""
    rest = _after_equinox_prefix(error)
    if rest is None:
        return None
    # jax appends equinox's advice to use filter_jit after a dashed rule; that is not ours.
    return rest.split("\n---", 1)[0].strip()


def solver_reason(error: BaseException) -> str:
    """The one-line reason equinox gives (e.g. "The maximum number of solver steps ...")."""
    rest = _after_equinox_prefix(error)
    if rest is not None:
        return (rest.splitlines() or [""])[0].strip()
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
