"""`annealing_schedule`: smooth multipliers for custom loops.

The stock trainer changes hyperparameters in blocks (phases). A custom loop that wants a smooth
curve (a cosine-decayed learning rate, a penalty weight that ramps in) multiplies its base value
by one of these schedules. They are optax schedules, so they are pure functions of the step and
work inside `jit` as well as on Python ints.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from hybrid_kernels._preflight import check_int

ANNEALING_KINDS = ("constant", "cosine", "exponential", "linear", "warmup_cosine")
# A geometric decay cannot reach 0; by default it falls two decades.
_EXPONENTIAL_END_FRACTION = 1e-2


def annealing_schedule(
    kind: str = "cosine",
    *,
    total_epochs: int,
    init_value: float = 1.0,
    end_value: float | None = None,
    warmup_epochs: int = 0,
) -> optax.Schedule:
    """Return `schedule(step) -> multiplier` that runs from `init_value` to `end_value`.

    Every kind reaches `end_value` at `step == total_epochs` and stays there; a step is one
    pass over every bucket, so `total_epochs` is the step budget of the loop it scales:
    `lr = base_lr * annealing_schedule("cosine", total_epochs=steps)(step)`.

    **Arguments:**

    - `kind`: `"cosine"`, `"linear"`, `"exponential"` (geometric, rate derived from the end
        points; needs `end_value > 0`), `"warmup_cosine"` (rises linearly from 0 to
        `init_value` over `warmup_epochs`, then cosine-decays) or `"constant"`.
    - `total_epochs`: the number of steps the schedule spans, at least 1.
    - `init_value`: the value at step 0 (the peak for `"warmup_cosine"`), finite and positive.
    - `end_value`: the value from `total_epochs` on, in `[0, init_value]`. `None` (default)
        means 0, except for `"exponential"`, where it means `init_value / 100`.
    - `warmup_epochs`: `"warmup_cosine"` only; in `[0, total_epochs)`.

    **Returns:** an `optax.Schedule`.
    """
    if kind not in ANNEALING_KINDS:
        raise ValueError(f"annealing_schedule: kind={kind!r}; expected one of {ANNEALING_KINDS}")
    total_epochs = check_int(total_epochs, "annealing_schedule: `total_epochs`")
    if not math.isfinite(init_value) or init_value <= 0:
        raise ValueError(
            f"annealing_schedule: init_value must be finite and positive; got {init_value}"
        )
    if end_value is None:
        end_value = init_value * _EXPONENTIAL_END_FRACTION if kind == "exponential" else 0.0
    if not 0.0 <= end_value <= init_value:
        raise ValueError(
            f"annealing_schedule: end_value={end_value} must lie in [0, init_value={init_value}]"
        )
    if kind == "warmup_cosine" and not 0 <= warmup_epochs < total_epochs:
        raise ValueError(
            f"annealing_schedule: warmup_epochs={warmup_epochs} must lie in "
            f"[0, total_epochs={total_epochs})"
        )
    if kind == "constant":
        return optax.constant_schedule(init_value)
    if kind == "cosine":
        return optax.cosine_decay_schedule(
            init_value=init_value, decay_steps=total_epochs, alpha=end_value / init_value
        )
    if kind == "linear":
        return optax.linear_schedule(
            init_value=init_value, end_value=end_value, transition_steps=total_epochs
        )
    if kind == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=init_value,
            warmup_steps=warmup_epochs,
            decay_steps=total_epochs,
            end_value=end_value,
        )
    if end_value <= 0:
        raise ValueError("annealing_schedule: kind='exponential' needs end_value > 0")
    decay = optax.exponential_decay(
        init_value=init_value,
        transition_steps=total_epochs,
        decay_rate=end_value / init_value,
        end_value=end_value,
    )

    def exponential(step):
        return jnp.clip(decay(step), end_value, init_value)

    return exponential
