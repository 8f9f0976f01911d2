"""State jumps: instantaneous changes of one state component at a given time.

A bolus dose, a pulse feed, a media exchange or a sample withdrawal is not a change of the
vector field but of the state itself: at `time`, `y[state] ← scale · y[state] + add`.
[`hybrid_kernels.StateJump`][] describes one such event on the host; it is given to
[`hybrid_kernels.make_experiment`][] as `jumps=[...]`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from hybrid_kernels._inputs import unusable_times


def _finite_real(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"StateJump: `{field}` must be a real number, got {value!r}.")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"StateJump: `{field}` must be finite, got {value!r}.")
    return out


@dataclasses.dataclass(frozen=True)
class StateJump:
    """At `time`, `y[state] ← scale · y[state] + add`.

    Jumps are right-continuous, like inputs: an observation at exactly `time` sees the state
    after the jump. Several jumps at one time apply in the order they are listed.

    **Arguments:**

    - `time`: when the jump happens, finite (and not before the experiment's `t0`, checked by
        [`hybrid_kernels.make_experiment`][]).
    - `state`: the index of the state component that jumps, an int `>= 0` (and below the
        state size `S`, checked by `make_experiment`).
    - `add`: the amount added after scaling, finite (default 0), e.g. a bolus dose `AMT`.
    - `scale`: the factor applied first, finite (default 1), e.g. `0.0` to empty a
        compartment or `0.9` to withdraw a tenth.

    Raises `TypeError` for a non-numeric field or a non-int `state`, and `ValueError` for a
    non-finite `time`, `add` or `scale` or a negative `state`.
    """

    time: float
    state: int
    add: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", _finite_real(self.time, "time"))
        object.__setattr__(self, "add", _finite_real(self.add, "add"))
        object.__setattr__(self, "scale", _finite_real(self.scale, "scale"))
        if isinstance(self.state, bool) or not isinstance(self.state, numbers.Integral):
            raise TypeError(f"StateJump: `state` must be an int index, got {self.state!r}.")
        if self.state < 0:
            raise ValueError(f"StateJump: `state` must be >= 0, got {self.state!r}.")
        object.__setattr__(self, "state", int(self.state))


class JumpArrays(NamedTuple):
    """Jumps of the rows of one bucket, padded to a bucket-wide count `M` (see `jump_slots`).

    - `ts` `[N, M]`: jump times, sorted per row; padding is `+inf` (never reached).
    - `state` `[N, M]` int32: the state index each jump changes; padding 0.
    - `add` `[N, M]`, `scale` `[N, M]`: `y[state] ← scale · y[state] + add`; padding 0 and 1,
        a no-op even if it were reached.
    """

    ts: Float[Array, "N M"]
    state: Int[Array, "N M"]
    add: Float[Array, "N M"]
    scale: Float[Array, "N M"]


def jump_slots(count: int) -> int:
    """The padded jump count of a bucket whose rows have at most `count` jumps.

    The next power of two (at least 1): the count is part of the compiled shape, so datasets
    with, say, 3 and 5 doses per subject share one program (8 slots), and a subject with
    thousands of doses costs at most twice the padding of its own count, in
    `log2(max count)` possible shapes.
    """
    return 1 << max(count - 1, 0).bit_length()


def stack_jumps(
    rows: list[tuple[StateJump, ...]], dtype: Any, exp_ids: list[str], slots: int | None = None
) -> JumpArrays | None:
    """Each row's jumps padded to `slots` (default `jump_slots` of the most in a row).

    **Returns:** the arrays, or `None` when no row has a jump (and `slots` is not given).
    Raises `ValueError` naming the experiment and the jump when a time is too large for
    `dtype` (`t + 1 == t`) or `add`/`scale` overflow it.
    """
    most = max((len(r) for r in rows), default=0)
    if slots is None:
        if most == 0:
            return None
        slots = jump_slots(most)
    info = np.finfo(dtype)
    for exp_id, jumps in zip(exp_ids, rows, strict=True):
        for i, jump in enumerate(jumps):
            where = f"make_dataset: experiment {exp_id!r}, jump {i} ({jump!r})"
            if unusable_times([jump.time], dtype):
                raise ValueError(
                    f"{where}: `time` is too large for {np.dtype(dtype).name} times "
                    "(t + 1 == t); shift or rescale the times, or pass dtype='float64'."
                )
            for field in ("add", "scale"):
                if abs(getattr(jump, field)) > info.max:
                    raise ValueError(
                        f"{where}: `{field}` becomes inf in {np.dtype(dtype).name}; rescale it "
                        "or pass dtype='float64'."
                    )
    N = len(rows)
    out = JumpArrays(
        ts=np.full((N, slots), np.inf, dtype),
        state=np.zeros((N, slots), np.int32),
        add=np.zeros((N, slots), dtype),
        scale=np.ones((N, slots), dtype),
    )
    for n, jumps in enumerate(rows):
        for m, jump in enumerate(jumps):
            out.ts[n, m], out.state[n, m] = jump.time, jump.state
            out.add[n, m], out.scale[n, m] = jump.add, jump.scale
    return out


def solve_with_jumps(solve: Callable, ts: Any, y0: Any, jumps: JumpArrays) -> diffrax.Solution:
    """One row's solve, integrated piecewise between its jumps and applying each of them.

    `solve(t0, t1, save_ts, y0)` is one diffrax solve from `t0` to `t1` saving at `save_ts`.
    Segment `k` runs from jump `k - 1` to jump `k` (the first from `ts[0]`, the last to
    `ts[-1]`; jump times are clipped into `[ts[0], ts[-1]]`, so padding and jumps after the
    last time give empty segments). It saves at every time of `ts` clipped into it plus its
    end, and an observation keeps the value of the segment holding it: the last segment whose
    start is at or before it, so an observation at a jump's time sees the state after the
    jump. A `jax.lax.scan` over the `M + 1` segments: one compiled solve whatever `M`, cost
    linear in `M` (each segment visits the `T` save times once).

    With `throw=False` a failed segment's row stays failed: later segments are not solved
    (zero length from a zero state) and their times get `+inf`, as diffrax marks the times a
    failed solve never reached.

    **Returns:** a `diffrax.Solution` with `ts`, `ys [T, S]`, `stats` (step counts summed
    over segments) and `result`; it carries no dense interpolation.
    """
    t_first, t_last = ts[0], ts[-1]
    bounds = jnp.clip(jumps.ts.astype(ts.dtype), t_first, t_last)
    starts = jnp.concatenate([t_first[None], bounds])
    ends = jnp.concatenate([bounds, t_last[None]])
    # The last segment's end has no jump: a no-op one keeps the scan body uniform.
    state = jnp.concatenate([jumps.state, jnp.zeros((1,), jumps.state.dtype)])
    add = jnp.concatenate([jumps.add, jnp.zeros((1,), jumps.add.dtype)])
    scale = jnp.concatenate([jumps.scale, jnp.ones((1,), jumps.scale.dtype)])
    segment_of = jnp.searchsorted(jumps.ts.astype(ts.dtype), ts, side="right")  # [T] in 0..M

    def body(carry, x):
        y, failed, result, counts = carry
        a, b, s, ad, sc = x
        sol = solve(a, jnp.where(failed, a, b), jnp.clip(ts, a, b), jnp.where(failed, 0, y))
        ok = sol.result == diffrax.RESULTS.successful
        ys = jnp.where(failed, jnp.inf, sol.ys)
        end = ys[-1]
        end = end.at[s].set(sc.astype(end.dtype) * end[s] + ad.astype(end.dtype))
        result = diffrax.RESULTS.where(failed, result, sol.result)
        counts = tuple(c + sol.stats[k] for c, k in zip(counts, _COUNTS, strict=True))
        return (end, failed | ~ok, result, counts), ys[:-1]

    zero = jnp.zeros((), jnp.int32)
    init = (y0, jnp.zeros((), bool), diffrax.RESULTS.successful, (zero,) * len(_COUNTS))
    (_, _, result, counts), per_segment = jax.lax.scan(
        body, init, (starts, ends, state, add, scale)
    )
    ys = per_segment[segment_of, jnp.arange(ts.shape[0])]
    stats = dict(zip(_COUNTS, counts, strict=True))
    return diffrax.Solution(
        t0=t_first,
        t1=t_last,
        ts=ts,
        ys=ys,
        interpolation=None,
        stats=stats,
        result=result,
        solver_state=None,
        controller_state=None,
        made_jump=None,
        event_mask=None,
    )


_COUNTS = ("num_steps", "num_accepted_steps", "num_rejected_steps")
