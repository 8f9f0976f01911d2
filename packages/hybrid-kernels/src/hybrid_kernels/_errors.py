"""Tracing kernels without host callbacks, for `SolverConfig(throw=False)`.

Equinox implements runtime checks (`eqx.error_if`, used throughout diffrax) with a host
callback unless `EQX_ON_ERROR=nan`, and JAX's persistent compilation cache refuses programs
that contain host callbacks. Diffrax's own `throw=False` removes the final solver-result
check, but its argument checks (saveat times increasing, inside [t0, t1]) remain. While a
`throw=False` kernel traces, we route those checks to equinox's documented `"nan"` behaviour:
a failed check poisons the value with NaN, which the kernel then sees as a failed row. The
switch is scoped to that trace only; other code in the process keeps raising errors.

Setting the environment variable `EQX_ON_ERROR=nan` before importing equinox achieves the same
process-wide, and is the fallback if a future equinox moves these internals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
