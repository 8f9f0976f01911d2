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
