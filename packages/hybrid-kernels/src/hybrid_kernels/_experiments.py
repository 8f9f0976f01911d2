"""One experiment on the host: its channels, covariates, inputs and initial state.

[`hybrid_kernels.ChannelObs`][] holds one channel's sparse observations at their own times;
[`hybrid_kernels.make_experiment`][] validates and assembles an
[`hybrid_kernels.Experiment`][]. Nothing here is bucketed or on a device yet: that is
`make_dataset`'s job (`hybrid_kernels._data`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from hybrid_kernels._inputs import InputTable, check_times_fit, unusable_times
from hybrid_kernels._jumps import StateJump


class ChannelObs(eqx.Module):
    """One measured quantity of one experiment: sparse observations at their own times.

    **Arguments:**

    - `ts`: observation times `[Tc]`, finite; need not be sorted. A repeated time is a
        replicate: each replicate is its own cell on the union axis and counts in the loss.
    - `values`: observed values `[Tc]`, finite. An empty `values` with non-empty `ts` is a
        *probe* channel: its times shape the integration grid but nothing is observed.
    - `variance`: observation variance, a positive scalar (broadcast) or `[Tc]`.

    Arrays are kept as host NumPy arrays at their given precision, so the dataset's
    `dtype` option (not the jax x64 flag at construction time) decides the stored precision.
    """

    ts: np.ndarray
    values: np.ndarray
    variance: np.ndarray

    def __init__(self, ts: Any, values: Any, variance: Any = 1.0):
        ts = _as_float_array(ts, "ts")
        values = _as_float_array(values, "values")
        if ts.ndim != 1:
            raise ValueError(f"ChannelObs: `ts` must be rank-1, got shape {ts.shape}.")
        if values.ndim != 1:
            raise ValueError(f"ChannelObs: `values` must be rank-1, got shape {values.shape}.")
        probe = values.size == 0
        if not probe and values.shape != ts.shape:
            raise ValueError(
                f"ChannelObs: `values` has shape {values.shape} but `ts` has shape {ts.shape}; "
                "they must match (or `values` must be empty for a probe channel)."
            )
        variance = _as_float_array(variance, "variance")
        if variance.ndim == 0:
            variance = np.full(values.shape, variance, dtype=variance.dtype)
        elif variance.shape != values.shape:
            raise ValueError(
                f"ChannelObs: `variance` must be a scalar or have the shape of `values` "
                f"{values.shape}, got {variance.shape}."
            )
        if not np.all(np.isfinite(ts)):
            raise ValueError("ChannelObs: `ts` must be finite.")
        if not np.all(np.isfinite(values)):
            raise ValueError("ChannelObs: `values` must be finite.")
        if not (np.all(np.isfinite(variance)) and np.all(variance > 0)):
            raise ValueError("ChannelObs: `variance` must be finite and strictly positive.")
        self.ts = ts
        self.values = values
        self.variance = variance

    @property
    def is_probe(self) -> bool:
        """True when the channel has times but no observed values."""
        return self.values.size == 0


class Experiment(eqx.Module):
    """One experiment: covariates, time-varying inputs, initial state and observed channels.

    Build it with [`hybrid_kernels.make_experiment`][]. `exp_id` is host-side only: it never
    reaches a kernel, and [`hybrid_kernels.Dataset`][] keeps it to map rows back. `t0` is the
    time `y0` applies at (`None` only for experiments built by hand: then the first observed
    time). `inputs` maps names to [`hybrid_kernels.InputTable`][]s. `jumps` holds its
    [`hybrid_kernels.StateJump`][]s sorted by time (stably: jumps at one time keep the order
    they were given in).
    """

    covariates: dict[str, np.ndarray]
    y0: np.ndarray
    channels: dict[str, ChannelObs]
    exp_id: str = eqx.field(static=True, default="")
    t0: float | None = eqx.field(static=True, default=None)
    inputs: dict[str, InputTable] = eqx.field(default_factory=dict)
    jumps: tuple[StateJump, ...] = eqx.field(static=True, default=())


def make_experiment(
    *,
    covariates: Mapping[str, Any],
    channels: Mapping[str, ChannelObs],
    y0_fn: Callable[[dict[str, Array], Mapping[str, ChannelObs]], Any],
    exp_id: str = "",
    t0: float | None = None,
    inputs: Mapping[str, InputTable] | None = None,
    jumps: Sequence[StateJump] = (),
) -> Experiment:
    """Validate and assemble one [`hybrid_kernels.Experiment`][].

    **The start-time rule.** `y0_fn` gives the state at `t0`, and the solve starts at `t0`.
    When `t0` is not given it is 0, and then the experiment's earliest time (over its channels,
    probes included) must be exactly 0: an experiment first sampled later raises, so the initial
    state is never moved silently to the first sample (nor silently back to 0). Pass `t0=0.0`
    for a run that started at 0 and was first sampled later, or `t0=` the first sample time to
    start the solve there. Observations before `t0` raise.

    **Arguments:**

    - `covariates`: name → scalar or `[K]` value, constant in time.
    - `channels`: name → [`hybrid_kernels.ChannelObs`][].
    - `y0_fn`: `y0_fn(covariates_as_jax_arrays, channels) -> [S]`, the *full* state at `t0`
        (it may include unobserved components such as penalty accumulators).
    - `exp_id`: a host-side name for error messages, failure reports and predictions.
    - `t0`: the start time (see the rule above).
    - `inputs`: name → [`hybrid_kernels.InputTable`][] (from
        [`hybrid_kernels.piecewise_constant`][] or [`hybrid_kernels.piecewise_linear`][]):
        signals that change in time. Inside `simulate_fn`, `covariates[name]` is then an
        [`hybrid_kernels.InputSignal`][] to call at `t`, and the table's switch times reach the
        step-size controller as jump times. Names must differ from the covariates'.
    - `jumps`: [`hybrid_kernels.StateJump`][]s, instantaneous changes of one state component
        (a bolus dose, a pulse feed, a withdrawal), applied by `solver.diffeqsolve` inside
        `simulate_fn`. Right-continuous: an observation at a jump's time sees the state after
        it; jumps at one time apply in the order given. Stored sorted by time.

    **Returns:** the experiment. Raises `ValueError` naming `exp_id` on a rank>1 or non-finite
    covariate, a `y0` that is not rank-1 and finite, a missing `t0` or an observation before
    it, an input time too large for float64 times (`t + 1 == t`, naming the input), or a jump
    (named by its index in `jumps`) before `t0`, on a state index `>= S`, or at a time too
    large for float64 times; `TypeError` on a non-str `exp_id`, a non-numeric covariate or
    `y0`, a channel that is not a `ChannelObs`, or a jump that is not a `StateJump`.
    """
    if not isinstance(exp_id, str):
        raise TypeError(f"make_experiment: `exp_id` must be a str, got {exp_id!r}.")
    for arg, value in (("covariates", covariates), ("channels", channels)):
        if not isinstance(value, Mapping):
            raise TypeError(
                f"make_experiment({exp_id!r}): `{arg}` must be a mapping of name to value, "
                f"got {type(value).__name__}."
            )
    covs: dict[str, np.ndarray] = {}
    for name in sorted(covariates):
        if not isinstance(name, str):
            raise TypeError(
                f"make_experiment({exp_id!r}): covariate names must be str, got {name!r}."
            )
        value = _as_array(covariates[name], f"make_experiment({exp_id!r}): covariate {name!r}")
        if value.dtype.kind not in "biuf":
            raise TypeError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be numeric, "
                f"got dtype {value.dtype}."
            )
        if value.ndim > 1:
            raise ValueError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be rank 0 or 1, "
                f"got shape {value.shape}."
            )
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise ValueError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be finite, got {value}."
            )
        covs[name] = value
    for name, ch in channels.items():
        if not isinstance(name, str):
            raise TypeError(
                f"make_experiment({exp_id!r}): channel names must be str, got {name!r}."
            )
        if not isinstance(ch, ChannelObs):
            raise TypeError(
                f"make_experiment({exp_id!r}): channel {name!r} must be a ChannelObs, "
                f"got {type(ch).__name__}."
            )
    if not callable(y0_fn):
        raise TypeError(
            f"make_experiment({exp_id!r}): `y0_fn` must be callable, got {type(y0_fn).__name__}."
        )
    t0 = _start_time(exp_id, channels, t0)
    tables = dict(inputs or {})
    for name, table in tables.items():
        if not isinstance(table, InputTable):
            raise TypeError(
                f"make_experiment({exp_id!r}): input {name!r} must be an InputTable (see "
                f"piecewise_constant / piecewise_linear), got {type(table).__name__}."
            )
        if name in covs:
            raise ValueError(
                f"make_experiment({exp_id!r}): input {name!r} is also a covariate; "
                "names must differ."
            )
        check_times_fit(table, np.float64, f"make_experiment({exp_id!r}): input {name!r}")
    jump_list = _check_jump_types(exp_id, jumps)
    y0 = _as_array(
        y0_fn({k: jnp.asarray(v) for k, v in covs.items()}, channels),
        f"make_experiment({exp_id!r}): `y0_fn`'s return value",
    )
    if y0.dtype.kind not in "iuf":
        raise TypeError(
            f"make_experiment({exp_id!r}): y0_fn must return a numeric state, got dtype {y0.dtype}."
        )
    if y0.ndim != 1:
        raise ValueError(
            f"make_experiment({exp_id!r}): y0_fn must return a rank-1 state [S], "
            f"got shape {y0.shape}."
        )
    if not np.all(np.isfinite(y0)):
        raise ValueError(f"make_experiment({exp_id!r}): `y0` must be finite, got {y0}.")
    _check_jumps(exp_id, jump_list, t0, y0.shape[0])
    return Experiment(
        covariates=covs,
        y0=y0,
        channels=dict(channels),
        exp_id=exp_id,
        t0=t0,
        inputs={k: tables[k] for k in sorted(tables)},
        jumps=tuple(sorted(jump_list, key=lambda j: j.time)),  # stable: list order at ties
    )


def _check_jump_types(exp_id: str, jumps: Any) -> list[StateJump]:
    if isinstance(jumps, StateJump) or not isinstance(jumps, Sequence):
        raise TypeError(
            f"make_experiment({exp_id!r}): `jumps` must be a sequence of StateJump, "
            f"got {type(jumps).__name__}."
        )
    for i, jump in enumerate(jumps):
        if not isinstance(jump, StateJump):
            raise TypeError(
                f"make_experiment({exp_id!r}): jump {i} in `jumps` must be a StateJump, "
                f"got {type(jump).__name__} {jump!r}."
            )
    return list(jumps)


def _check_jumps(exp_id: str, jumps: list[StateJump], t0: float, n_states: int) -> None:
    """Each jump's time against `t0` and float64, and its state index against `S`."""
    for i, jump in enumerate(jumps):
        where = f"make_experiment({exp_id!r}): jump {i} in `jumps` ({jump!r})"
        if jump.time < t0:
            raise ValueError(
                f"{where}: `time` {jump.time!r} is before t0={t0!r}; a jump must not precede "
                "the start of the solve."
            )
        if jump.state >= n_states:
            raise ValueError(
                f"{where}: `state` {jump.state} is out of range for the state of size "
                f"S = {n_states} that y0_fn returns; expected 0 <= state < {n_states}."
            )
        if unusable_times([jump.time], np.float64):
            raise ValueError(
                f"{where}: `time` {jump.time!r} is too large for float64 times (t + 1 == t): "
                "the solver cannot step to just before and after it. Shift or rescale the "
                "times (for example hours instead of seconds)."
            )


def _start_time(exp_id: str, channels: Mapping[str, ChannelObs], t0: Any) -> float:
    """make_experiment's start-time rule (see its docstring); every message names the field."""
    firsts = {n: float(np.min(c.ts)) for n, c in channels.items() if c.ts.size}
    if t0 is None:
        if firsts and min(firsts.values()) != 0.0:
            name = min(firsts, key=firsts.__getitem__)
            raise ValueError(
                f"make_experiment({exp_id!r}): no `t0` given and the first time is "
                f"{firsts[name]!r} (channel {name!r}, field `ts`), not 0. Pass `t0`, the time "
                "y0_fn's state applies at: t0=0.0 to start the solve before the first sample, "
                f"or t0={firsts[name]!r} to start it there."
            )
        return 0.0
    if isinstance(t0, bool) or not isinstance(t0, int | float | np.number) or not math.isfinite(t0):
        raise ValueError(f"make_experiment({exp_id!r}): `t0` must be a finite float, got {t0!r}.")
    for name, first in firsts.items():
        if first < t0:
            raise ValueError(
                f"make_experiment({exp_id!r}): channel {name!r} has a time {first!r} in `ts` "
                f"before t0={float(t0)!r}; observations must not precede the start."
            )
    return float(t0)


def _as_array(x: Any, what: str) -> np.ndarray:
    """`np.asarray(x)`, with numpy's ragged-sequence error re-raised naming `what`."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{what} must be a numeric array, not a ragged sequence ({e}).") from e


def _as_float_array(x: Any, name: str) -> np.ndarray:
    arr = _as_array(x, f"ChannelObs: `{name}`")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"ChannelObs: `{name}` must be numeric, got dtype {arr.dtype}.")
    return arr if arr.dtype.kind == "f" else arr.astype(np.float64)
