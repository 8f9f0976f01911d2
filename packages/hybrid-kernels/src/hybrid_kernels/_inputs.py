"""Time-varying inputs: (time, value) tables on the host, diffrax interpolations in the kernels.

A lab logs a feed or a set-point as a table of switch times and values.
[`hybrid_kernels.InputTable`][] holds one such table per experiment.
[`hybrid_kernels.make_dataset`][] turns each into the knots of a `diffrax.LinearInterpolation`
(a piecewise-constant table becomes a linear interpolation with a repeated knot at each switch,
which diffrax reads as a jump), pads the knots of a bucket to one length, and stores each row's
switch times as its jump times. Inside `simulate_fn`, `covariates[name]` is an
[`hybrid_kernels.InputSignal`][]: call it at `t`. The row's switch times reach the step-size
controller through `SolverConfig.diffeqsolve` (see [`hybrid_kernels.SolverConfig`][]), or
through `InputSignal.jump_ts` to a `diffrax.diffeqsolve` called directly; a row whose solve
got neither is refused (`hybrid_kernels._row`).

A table's own times are strictly increasing: a repeated time would give one instant two
values, and a step is what a `"constant"` table already means. (The repeated knots above are
made by `knots()`, never given.) [`hybrid_kernels.piecewise_constant`][] accepts adjacent
records that share a time (one segment ends as the next begins) and keeps the last record at
each time, so the table it returns is strictly increasing.

Every time must also leave room for a step of 1 on either side in the dtype of the solve
(`t + 1 != t`): `knots()` holds the end values one time unit beyond the table, and the
step-size controller must step just before and after each switch.
Times beyond that (about 4.5e15 in float64, 8.4e6 in float32) are refused, naming the input,
by `make_experiment` and `make_dataset`; shift or rescale them (hours instead of seconds).
"""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float

from hybrid_kernels._row import current_row

INPUT_KINDS = ("constant", "linear")


def _check(ts: np.ndarray, values: np.ndarray, where: str) -> None:
    """The rule every table obeys; `where` starts each message."""
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"{where}: `ts` must be a non-empty rank-1 array, got shape {ts.shape}.")
    if values.ndim not in (1, 2) or values.shape[0] != ts.shape[0]:
        raise ValueError(
            f"{where}: `values` must have shape [K] or [K, C] with K = len(ts) = {ts.size}, "
            f"got {values.shape}."
        )
    if not np.all(np.isfinite(ts)):
        raise ValueError(f"{where}: `ts` must be finite, got {ts.tolist()}.")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{where}: `values` must be finite, got {values.tolist()}.")
    if np.any(np.diff(ts) <= 0):
        raise ValueError(
            f"{where}: `ts` must be strictly increasing (a step is a 'constant' table's switch, "
            f"not a repeated time), got {ts.tolist()}."
        )


def unusable_times(ts: Any, dtype: Any) -> list[float]:
    """The times of `ts` with no room for a step of 1 on either side in `dtype` (see module)."""
    t = np.asarray(ts, dtype=dtype)
    one = np.asarray(1, dtype=dtype)
    bad = ~np.isfinite(t) | (t + one == t) | (t - one == t)
    return [float(x) for x in np.asarray(ts, dtype=np.float64)[bad]]


def check_times_fit(table: InputTable, dtype: Any, where: str) -> None:
    """Raise `ValueError` starting with `where` when a time of `table` is unusable in `dtype`."""
    bad = unusable_times(table.ts, dtype)
    if bad:
        raise ValueError(
            f"{where}: time(s) {bad} are too large for {np.dtype(dtype).name} times (t + 1 == t): "
            "the solver cannot step to just before and after them. Shift or rescale the "
            "times (for example hours instead of seconds)."
        )


def _as_host(x: Any) -> Any:
    # Traced inside jit/vmap: kept as it is, and the checks are skipped.
    return x if isinstance(x, jax.core.Tracer) else np.asarray(x, dtype=np.float64)


class InputTable(eqx.Module):
    """One experiment's time-varying input, as the lab logs it (host-side).

    Build it with [`hybrid_kernels.piecewise_constant`][] or
    [`hybrid_kernels.piecewise_linear`][].

    - `ts` `[K]`: strictly increasing, finite knot (switch) times (see the module on
        repeated times and on times too large for the dtype).
    - `values` `[K]` or `[K, C]`: the finite value at each knot.
    - `kind`: `"constant"` (value `values[k]` holds on `[ts[k], ts[k+1])`, and before `ts[0]`)
        or `"linear"` (linear between knots, held constant outside them).

    Built directly, it checks the same as the two constructors and raises `ValueError`;
    host inputs become float64 NumPy arrays. Built with traced arrays (inside `jax.jit` or
    `jax.vmap`), the values cannot be checked and are not.
    """

    ts: np.ndarray = eqx.field(converter=_as_host)
    values: np.ndarray = eqx.field(converter=_as_host)
    kind: str = eqx.field(static=True)

    def __check_init__(self):
        if self.kind not in INPUT_KINDS:
            raise ValueError(f"InputTable: `kind` must be one of {INPUT_KINDS}, got {self.kind!r}.")
        if isinstance(self.ts, jax.core.Tracer) or isinstance(self.values, jax.core.Tracer):
            return
        _check(np.asarray(self.ts), np.asarray(self.values), "InputTable")

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
    _check(ts, values, where)
    return InputTable(ts=ts, values=values, kind=kind)


def piecewise_constant(ts: Any, values: Any) -> InputTable:
    """A step input (a feed rate, a set-point): `values[k]` from `ts[k]` until `ts[k+1]`.

    **Arguments:**

    - `ts`: switch times `[K]`, non-decreasing. A time may repeat: adjacent records, where
        one segment ends and the next begins (back-to-back infusions logged as start/stop
        pairs give `[0, 1, 1, 2]`).
    - `values`: `[K]` or `[K, C]`; the value at the first time also holds before it.

    The signal is right-continuous: at a switch time it already has the new value. Records
    are read in order, so of several records at one time the **last** one holds from that
    time on; the earlier ones hold on an empty interval and are dropped (`ts=[0, 1, 1, 2]`,
    `values=[5, 0, 3, 0]` is 5 on `[0, 1)`, 3 on `[1, 2)`, 0 from 2). The table returned
    has strictly increasing times. Raises `ValueError` for a decreasing time, a non-finite
    time or value, or mismatched shapes.
    """
    where = "piecewise_constant"
    ts = np.asarray(ts, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if ts.ndim == 1 and ts.size > 1 and values.shape[:1] == ts.shape:
        if np.all(np.isfinite(ts)) and np.any(np.diff(ts) < 0):
            raise ValueError(
                f"{where}: `ts` must be non-decreasing (a repeated time is allowed; the last "
                f"record at a time holds from it), got {ts.tolist()}."
            )
        # The last record of each run of equal times is the one that holds from that time.
        last = np.append(ts[1:] != ts[:-1], True)
        ts, values = ts[last], values[last]
    return _table(ts, values, "constant", where)


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
    `jump_ts` gives the experiment's switch times, for a `simulate_fn` that calls
    `diffrax.diffeqsolve` itself.
    """

    interpolation: diffrax.LinearInterpolation
    _jump_ts: Float[Array, " J"] | None = None

    def __call__(self, t: Any) -> Float[Array, ...]:
        return self.interpolation.evaluate(t, left=False)

    @property
    def jump_ts(self) -> Float[Array, " J"]:
        """`[J]`: the times at which any input of this experiment switches (or a ramp bends),
        padded with `+inf`; the same array on each of its signals. `solver.diffeqsolve`
        passes them to the step-size controller by itself; a `simulate_fn` that calls
        `diffrax.diffeqsolve` directly must pass them, or the kernels refuse it:

        ```python
        controller = diffrax.ClipStepSizeController(
            diffrax.PIDController(rtol=1e-6, atol=1e-6), jump_ts=covariates["feed"].jump_ts
        )
        ```

        A signal built outside the kernels gives its interpolation's knot times.
        """
        row = current_row()
        if row is not None:
            row.switches_read = True
        return self.interpolation.ts if self._jump_ts is None else self._jump_ts


def stack_inputs(
    tables: list[dict[str, InputTable]], dtype: np.dtype, exp_ids: list[str] | None = None
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]] | None, np.ndarray | None]:
    """Knots of every row padded to one bucket-wide length, and each row's jump times.

    Knots are padded by extending the last value at later, increasing times (a flat segment:
    the signal is unchanged). Jump times are padded with `+inf`, which a
    `diffrax.ClipStepSizeController` never reaches.

    **Returns:** `({name: (ts [N, L], ys [N, L, ...])}, jump_ts [N, J])`, or `(None, None)`
    when the experiments have no inputs; `jump_ts` is `None` when no input ever switches.
    Raises `ValueError` naming the experiment (from `exp_ids`) and the input when a time is
    too large for `dtype` (see the module).
    """
    names = sorted(tables[0])
    if not names:
        return None, None
    for n, row in enumerate(tables):
        exp_id = exp_ids[n] if exp_ids is not None else str(n)
        for name in names:
            where = f"make_dataset: experiment {exp_id!r}, input {name!r}"
            check_times_fit(row[name], dtype, where)
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
    J = max(j.size for j in jumps)
    if J == 0:  # one value each, never switching: nothing for a controller to step to
        return inputs, None
    jump_ts = np.full((len(tables), J), np.inf, dtype)
    for n, j in enumerate(jumps):
        jump_ts[n, : j.size] = j
    return inputs, jump_ts


def row_signals(
    inputs: dict[str, tuple[Array, Array]], jump_ts: Array | None
) -> dict[str, InputSignal]:
    """One row's `InputSignal`s from its (unbatched) knot arrays and jump times `[J]`."""
    return {
        name: InputSignal(diffrax.LinearInterpolation(ts=ts, ys=ys), jump_ts)
        for name, (ts, ys) in inputs.items()
    }
