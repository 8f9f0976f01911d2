"""Time-varying inputs: (time, value) tables on the host, diffrax interpolations in the kernels.

A lab logs a feed or a set-point as a table of switch times and values.
[`hybrid_kernels.InputTable`][] holds one such table per experiment.
[`hybrid_kernels.make_dataset`][] turns each into the knots of a `diffrax.LinearInterpolation`
(a piecewise-constant table becomes a linear interpolation with a repeated knot at each switch,
which diffrax reads as a jump), pads the knots of a bucket to one length, and stores each row's
switch times as its jump times. Inside `simulate_fn`, `covariates[name]` is an
[`hybrid_kernels.InputSignal`][]: call it at `t`. The row's switch times reach the step-size
controller through `SolverConfig.diffeqsolve` (see [`hybrid_kernels.SolverConfig`][]).
"""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

INPUT_KINDS = ("constant", "linear")


class InputTable(eqx.Module):
    """One experiment's time-varying input, as the lab logs it (host-side).

    Build it with [`hybrid_kernels.piecewise_constant`][] or
    [`hybrid_kernels.piecewise_linear`][].

    - `ts` `[K]`: strictly increasing knot (switch) times.
    - `values` `[K]` or `[K, C]`: the value at each knot.
    - `kind`: `"constant"` (value `values[k]` holds on `[ts[k], ts[k+1])`, and before `ts[0]`)
        or `"linear"` (linear between knots, held constant outside them).
    """

    ts: np.ndarray
    values: np.ndarray
    kind: str = eqx.field(static=True)

    def __check_init__(self):
        if self.kind not in INPUT_KINDS:
            raise ValueError(f"InputTable: `kind` must be one of {INPUT_KINDS}, got {self.kind!r}.")

    def jump_times(self) -> np.ndarray:
        """Where the signal or its slope jumps: the solver should step to just these times."""
        return self.ts[1:] if self.kind == "constant" else self.ts

    def knots(self) -> tuple[np.ndarray, np.ndarray]:
        """`(ts, ys)` of the `diffrax.LinearInterpolation` that reproduces this table.

        The first and last segments are flat, so diffrax's linear extrapolation holds the end
        values outside the table.
        """
        ts, vs = self.ts, self.values
        if self.kind == "constant":
            # (s0, v0) (s1, v0) (s1, v1) ... (s_last, v_last) (s_last + 1, v_last)
            knot_ts = np.concatenate([np.repeat(ts, 2)[1:], ts[-1:] + 1.0])
            knot_vs = np.repeat(vs, 2, axis=0)
        else:
            knot_ts = np.concatenate([ts[:1] - 1.0, ts, ts[-1:] + 1.0])
            knot_vs = np.concatenate([vs[:1], vs, vs[-1:]], axis=0)
        return knot_ts, knot_vs


def _table(ts: Any, values: Any, kind: str, where: str) -> InputTable:
    ts = np.asarray(ts, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"{where}: `ts` must be a non-empty rank-1 array, got shape {ts.shape}.")
    if values.ndim not in (1, 2) or values.shape[0] != ts.shape[0]:
        raise ValueError(
            f"{where}: `values` must have shape [K] or [K, C] with K = len(ts) = {ts.size}, "
            f"got {values.shape}."
        )
    if not (np.all(np.isfinite(ts)) and np.all(np.isfinite(values))):
        raise ValueError(f"{where}: `ts` and `values` must be finite.")
    if np.any(np.diff(ts) <= 0):
        raise ValueError(f"{where}: `ts` must be strictly increasing, got {ts.tolist()}.")
    return InputTable(ts=ts, values=values, kind=kind)


def piecewise_constant(ts: Any, values: Any) -> InputTable:
    """A step input (a feed rate, a set-point): `values[k]` from `ts[k]` until `ts[k+1]`.

    **Arguments:**

    - `ts`: switch times `[K]`, strictly increasing.
    - `values`: `[K]` or `[K, C]`; `values[0]` also holds before `ts[0]`.

    The signal is right-continuous: at a switch time it already has the new value.
    """
    return _table(ts, values, "constant", "piecewise_constant")


def piecewise_linear(ts: Any, values: Any) -> InputTable:
    """A ramp input: linear between knots `(ts[k], values[k])`, constant outside them.

    **Arguments:**

    - `ts`: knot times `[K]`, strictly increasing.
    - `values`: `[K]` or `[K, C]`.
    """
    return _table(ts, values, "linear", "piecewise_linear")


class InputSignal(eqx.Module):
    """One experiment's input inside `simulate_fn`: `covariates[name](t)` is its value at `t`.

    - `interpolation`: the `diffrax.LinearInterpolation` through the table's knots.

    Evaluated right-continuously (`left=False`), so a step has its new value at the switch.
    """

    interpolation: diffrax.LinearInterpolation

    def __call__(self, t: Any) -> Float[Array, ...]:
        return self.interpolation.evaluate(t, left=False)


def stack_inputs(
    tables: list[dict[str, InputTable]], dtype: np.dtype
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]] | None, np.ndarray | None]:
    """Knots of every row padded to one bucket-wide length, and each row's jump times.

    Knots are padded by extending the last value at later, increasing times (a flat segment:
    the signal is unchanged). Jump times are padded with `+inf`, which a
    `diffrax.ClipStepSizeController` never reaches.

    **Returns:** `({name: (ts [N, L], ys [N, L, ...])}, jump_ts [N, J])`, or `(None, None)`
    when the experiments have no inputs.
    """
    names = sorted(tables[0])
    if not names:
        return None, None
    inputs = {}
    for name in names:
        knots = [t[name].knots() for t in tables]
        L = max(k[0].size for k in knots)
        ts = np.empty((len(tables), L), dtype)
        ys = np.empty((len(tables), L, *knots[0][1].shape[1:]), dtype)
        for n, (kt, kv) in enumerate(knots):
            ts[n, : kt.size] = kt
            ts[n, kt.size :] = kt[-1] + np.arange(1, L - kt.size + 1)
            ys[n, : kt.size] = kv
            ys[n, kt.size :] = kv[-1]
        inputs[name] = (ts, ys)
    jumps = [np.unique(np.concatenate([t[n].jump_times() for n in names])) for t in tables]
    J = max(max(j.size for j in jumps), 1)
    jump_ts = np.full((len(tables), J), np.inf, dtype)
    for n, j in enumerate(jumps):
        jump_ts[n, : j.size] = j
    return inputs, jump_ts


def row_signals(inputs: dict[str, tuple[Array, Array]]) -> dict[str, InputSignal]:
    """One row's `InputSignal`s from its (unbatched) knot arrays."""
    return {
        name: InputSignal(diffrax.LinearInterpolation(ts=ts, ys=ys))
        for name, (ts, ys) in inputs.items()
    }
