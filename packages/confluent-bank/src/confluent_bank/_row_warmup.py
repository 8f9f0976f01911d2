"""`row_warmup`: a per-coordinate linear warm-up of an optax optimizer's updates.

Restarted coordinates (a commit's fresh rows) ramp their updates in from 0 to full over
`steps` updates; the adapters of `confluent_bank.optax` restart the counters. Imports optax, so
only `confluent_bank.optax` imports this module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class RowWarmupState(NamedTuple):
    """The state of `row_warmup`: the wrapped optimizer's state and the warm-up counters.

    **Fields:**

    - `inner_state`: the wrapped optimizer's state.
    - `ramp`: a pytree shaped like the params; each int32 entry counts the updates since
      that coordinate was (re)started, capped at `steps` (a coordinate at `steps` is warm).
    """

    inner_state: Any
    ramp: Any


def row_warmup(
    optimizer: optax.GradientTransformation, *, steps: int
) -> optax.GradientTransformationExtraArgs:
    """Wrap `optimizer` so that restarted coordinates ramp their updates in from 0 to full.

    Each coordinate has a counter `r`; the `k`-th update after a restart is multiplied by
    `min(k, steps) / steps`, a linear learning-rate warm-up applied per coordinate. At
    `init` every coordinate is warm (the first updates of a fresh run are not scaled). The
    adapters of this module restart the counters of a commit's fresh coordinates (a birth's
    slot, a pair's `directions`; with `commit_adapter(transport=False)` every affected row).

    **Choosing `steps`.** An adaptive optimizer (Adam and relatives) moves a coordinate with
    fresh moments by about the learning rate `η` per update whatever its gradient, so a
    newborn weight oscillates around its optimum with amplitude `~η·k/steps` after `k`
    updates. For the loss to stay near its current value `L` that amplitude must stay below
    the weight the residual can use, `~√(L / E[σ²])`; with `k` the horizon you want quiet,
    `steps ≳ k·η / √(L / E[σ²])` (e.g. `η = 0.03`, `L = 2·10⁻⁵`, 50 quiet steps: about 200).
    Plain SGD with momentum scales its step with the (small) gradient and needs little
    warm-up; a few tens of steps, about `1/(1 − momentum)`, fill its momentum.

    **Arguments:**

    - `optimizer`: any optax `GradientTransformation`.
    - `steps`: ramp length, a positive integer.

    **Returns:** an optax `GradientTransformationExtraArgs` with state `RowWarmupState`.

    **Raises:** `ValueError` for a non-positive `steps`; `TypeError` for a non-integer one.
    """
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"row_warmup steps must be an integer, got {steps!r}")
    if steps < 1:
        raise ValueError(f"row_warmup steps must be >= 1, got {steps}")
    inner = optax.with_extra_args_support(optimizer)

    def init(params: Any) -> RowWarmupState:
        ramp = jax.tree.map(lambda p: jnp.full(jnp.shape(p), steps, jnp.int32), params)
        return RowWarmupState(inner.init(params), ramp)

    def update(
        updates: Any, state: RowWarmupState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, RowWarmupState]:
        updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
        ramp = jax.tree.map(lambda r: jnp.minimum(r + 1, steps), state.ramp)
        scaled = jax.tree.map(lambda u, r: u * (r / steps).astype(u.dtype), updates, ramp)
        return scaled, RowWarmupState(inner_state, ramp)

    return optax.GradientTransformationExtraArgs(init, update)
