"""Trajectory penalties: charge what happens along the solve, not only at fixed points.

A predictor embedded in the dynamics (its inputs are states) is only ever evaluated where the
solver takes it, so the bound penalty has no data points for it. The recipe instead widens the
ODE state with `n` accumulators that integrate penalty rates alongside the physics:

1. `y0_fn` returns `attach_penalty_state(physics_y0, n)`;
2. the vector field is `penalty_vector_field(physics_rhs, penalty_rhs)`;
3. `state_to_output` reads `strip_penalty_state(state, n)`;
4. the kernels' `trajectory_penalty_fn(full_state, bp)` returns, for example,
   `penalty_integral(full_state, n).sum()`.

Only the solver's state widens: the signatures of `simulate_fn`, `state_to_output` and the
losses stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from hybrid_kernels._bounded import BoundScaler
from hybrid_kernels._preflight import check_int


def _check_state(state: Array, n: int, name: str) -> None:
    if state.ndim < 1 or state.shape[-1] <= n:
        raise ValueError(
            f"{name} has shape {state.shape}; its last axis must hold the physical components "
            f"plus n = {n} penalty accumulators (more than {n} entries)"
        )


def attach_penalty_state(y0: Float[ArrayLike, " S"], n: int = 1) -> Float[Array, " S+n"]:
    """Append `n` zero accumulators to the physical initial state `y0 [S]`."""
    n = check_int(n, "`n` (the number of penalty accumulators)")
    y0 = jnp.asarray(y0)
    if y0.ndim != 1 or y0.shape[0] < 1:
        raise ValueError(f"y0 must be a non-empty rank-1 state; got shape {y0.shape}")
    return jnp.concatenate([y0, jnp.zeros((n,), y0.dtype)])


def penalty_vector_field(
    base_rhs: Callable[[Any, Array, Any], ArrayLike],
    penalty_rhs: Callable[[Any, Array, Any], ArrayLike],
) -> Callable[[Any, Array, Any], Array]:
    """Widen a physics vector field with penalty rates.

    **Arguments:**

    - `base_rhs(t, y_physical, args) -> [S]`: the physics, on the physical components only
      (the accumulators are removed before it is called).
    - `penalty_rhs(t, y, args) -> [n]`: the penalty rates at the current full state `y [S+n]`
      (read the physical part as `y[:-n]`); `n >= 1`, rank 1.

    **Returns:**

    A diffrax-style vector field `(t, y, args) -> [S+n]`: `[physics_rates, penalty_rates]`, so
    the trailing accumulators integrate the penalty along the trajectory.
    """

    def vector_field(t: Any, y: Array, args: Any) -> Array:
        rates = jnp.asarray(penalty_rhs(t, y, args))
        if rates.ndim != 1 or rates.shape[0] < 1:
            raise ValueError(
                f"penalty_rhs must return a rank-1 array of at least one rate; got {rates.shape}"
            )
        n = rates.shape[0]
        if y.ndim != 1 or y.shape[0] <= n:
            raise ValueError(
                f"state of shape {y.shape} leaves no physical component beside {n} penalty "
                "rates; build y0 with attach_penalty_state(physics_y0, n)"
            )
        physics = jnp.asarray(base_rhs(t, y[:-n], args))
        if physics.shape != (y.shape[0] - n,):
            raise ValueError(
                f"base_rhs returned shape {physics.shape}; expected ({y.shape[0] - n},), one rate "
                "per physical component"
            )
        dtype = jnp.result_type(physics.dtype, rates.dtype)
        return jnp.concatenate([physics.astype(dtype), rates.astype(dtype)])

    return vector_field


def strip_penalty_state(state: Float[ArrayLike, "... S+n"], n: int = 1) -> Float[Array, "... S"]:
    """Drop the `n` trailing accumulators: `[..., S+n] -> [..., S]`."""
    n = check_int(n, "`n` (the number of penalty accumulators)")
    state = jnp.asarray(state)
    _check_state(state, n, "state")
    return state[..., :-n]


def penalty_integral(state: Float[ArrayLike, "... T S+n"], n: int = 1) -> Float[Array, "... n"]:
    """The accumulators at the final time: `[..., T, S+n] -> [..., n]`.

    With zero initial accumulators this is each penalty's time integral over the solve.
    """
    n = check_int(n, "`n` (the number of penalty accumulators)")
    state = jnp.asarray(state)
    _check_state(state, n, "state")
    if state.ndim < 2:
        raise ValueError(f"state must have a time axis before the state axis; got {state.shape}")
    return state[..., -1, -n:]


def trajectory_saturation_penalty(
    outputs: Float[ArrayLike, "... T K"], out_scaler: BoundScaler
) -> Float[Array, ""]:
    """Saturation along a trajectory, for a bounded predictor whose outputs are observed.

    `outputs [..., T, K]` are physical values of the predictor's `K` outputs along the time
    axis (for instance the state components it drives). They are mapped back to latents with
    `out_scaler.to_latent` and the squared excess over the knee is averaged over the outputs
    and any leading axes and summed over time, so longer saturated stretches cost more.
    """
    outputs = jnp.asarray(outputs)
    if outputs.ndim < 2 or outputs.shape[-1] != out_scaler.size:
        raise ValueError(
            f"outputs has shape {outputs.shape}; expected (..., T, {out_scaler.size}) with one "
            "column per out_scaler bound"
        )
    z = out_scaler.to_latent(outputs)
    excess = jnp.maximum(jnp.abs(z / out_scaler.temperature) - out_scaler.z_knee, 0) ** 2
    per_time = jnp.mean(jnp.moveaxis(excess, -2, 0).reshape(outputs.shape[-2], -1), axis=1)
    return jnp.sum(per_time)
