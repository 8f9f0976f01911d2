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


def solver_reason(error: BaseException) -> str:
    """The one-line reason equinox gives (e.g. "The maximum number of solver steps ...")."""
    prefix = "EquinoxRuntimeError: "
    for line in str(error).splitlines():
        if prefix in line:
            return line.split(prefix, 1)[1].strip()
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
