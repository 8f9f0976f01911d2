"""Bounded predictors: a physical box around an unbounded learnable function.

A :class:`BoundScaler` maps each physical quantity in a box ``[low, high]`` onto an unbounded
*latent* coordinate and back. A :class:`BoundedPredictor` composes two of them around any inner
module: named physical inputs go to latents, the inner module maps latents to latents, and the
output scaler squashes the result into its physical box. Bounds therefore hold by construction,
and there is nothing to clip (clipping would zero the gradient outside the box).

The cost is that the squash flattens near the bounds, so a predictor pushed against a bound
stops receiving gradient. :meth:`BoundScaler.saturation` measures how far latents have run past
the knee (the latent at which the physical value enters the outer 5 % of its box); the bound
penalty in :mod:`hybrid_kernels._penalties` charges it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

# Inside [_EDGE, 1 - _EDGE] of the normalised box the inverse squash is exact; beyond it a
# linear continuation takes over, so inputs on or outside the bounds still get a finite latent
# with a non-zero gradient (never a hard clip, whose gradient would vanish in the adjoint).
_EDGE = 1e-6
# The knee sits where the physical value enters the outer 5 % of its box.
_KNEE_FRACTION = 0.95


class _Squash(NamedTuple):
    forward: Callable[[Array], Array]  # R -> (0, 1)
    inverse: Callable[[Array], Array]  # (0, 1) -> R
    inverse_slope: Callable[[Array], Array]  # d inverse / ds


def _algebraic_inverse(s: Array) -> Array:
    y = 2 * s - 1
    return y / jnp.sqrt(1 - y * y)


_SQUASHES: dict[str, _Squash] = {
    "sigmoid": _Squash(
        forward=jax.nn.sigmoid,
        inverse=lambda s: jnp.log(s) - jnp.log1p(-s),
        inverse_slope=lambda s: 1 / (s * (1 - s)),
    ),
    # Polynomial tails: the gradient decays like |z|^-3 instead of e^-|z|, so a predictor that
    # wandered to a bound can still come back.
    "algebraic": _Squash(
        forward=lambda z: 0.5 * (1 + z / jnp.sqrt(1 + z * z)),
        inverse=_algebraic_inverse,
        inverse_slope=lambda s: 2 * (1 - (2 * s - 1) ** 2) ** -1.5,
    ),
}

_WARPS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "linear": (lambda x: x, lambda w: w),
    # One log warp suffices: the box is normalised in warped coordinates, so log and log10
    # give the same scaler.
    "log": (jnp.log, jnp.exp),
}
# The box itself is warped on the host, in float64, from the static bounds: a jnp call here
# would be staged under jit/vmap/grad and could not be read back into a constant.
_HOST_WARPS: dict[str, Callable[[float], float]] = {"linear": float, "log": math.log}


def available_bound_transforms() -> tuple[str, ...]:
    """The `transform` names [`hybrid_kernels.BoundScaler`][] accepts, sorted (read-only)."""
    return tuple(sorted(_SQUASHES))


def available_warps() -> tuple[str, ...]:
    """The `warp` names [`hybrid_kernels.BoundScaler`][] accepts, sorted (read-only)."""
    return tuple(sorted(_WARPS))


def _continued_inverse(squash: _Squash, s: Array, edge: float) -> Array:
    # Exact inside [edge, 1 - edge], first-order continuation outside: finite and
    # differentiable for every s, with a slope that never vanishes.
    s_in = jnp.clip(s, edge, 1 - edge)
    return squash.inverse(s_in) + squash.inverse_slope(s_in) * (s - s_in)


def _check_edge(edge: float) -> float:
    if not 0 < edge < 0.5:
        raise ValueError(f"edge must lie in (0, 0.5); got {edge!r}")
    return float(edge)


def soft_logit(s: Float[ArrayLike, ...], *, edge: float = _EDGE) -> Float[Array, ...]:
    """`logit(s)`, exact on `[edge, 1 - edge]` and linearly continued beyond it.

    The inverse squash `BoundScaler(transform="sigmoid").to_latent` applies to the position in
    the box: finite for every `s` (0, 1 and values outside `[0, 1]` included), with a positive
    slope everywhere, so a point on or past a bound still gets a gradient. Same shape as `s`.
    """
    return _continued_inverse(_SQUASHES["sigmoid"], jnp.asarray(s), _check_edge(edge))


def soft_clip(
    x: Float[ArrayLike, ...],
    low: Float[ArrayLike, ...],
    high: Float[ArrayLike, ...],
) -> Float[Array, ...]:
    """A smooth, strictly increasing map of `x` into the open interval `(low, high)`.

    `low + (high - low) * sigmoid(4 * (x - mid) / (high - low))` with `mid` the centre: slope 1
    at the centre, a bound reached only asymptotically, and a gradient that decays but never
    vanishes (a hard clip's is zero outside). It is the sigmoid squash of
    `BoundScaler.from_latent`, rescaled to unit slope. `low`, `high` broadcast against `x`
    and need `low < high`.
    """
    x, low, high = jnp.asarray(x), jnp.asarray(low), jnp.asarray(high)
    width = high - low
    return low + width * jax.nn.sigmoid(4 * (x - (low + high) / 2) / width)


def straight_through_clip(
    x: Float[ArrayLike, ...],
    low: Float[ArrayLike, ...],
    high: Float[ArrayLike, ...],
) -> Float[Array, ...]:
    """`clip(x, low, high)` in the forward pass with the identity's gradient (slope 1).

    For when a value must really lie in the box (a solver input, a table lookup) yet the
    optimiser should still see which way to move: the clip is hidden from autodiff with
    `stop_gradient`. (`BoundScaler.to_latent` clips too, then continues linearly past the clip,
    which `soft_logit` exposes.)
    """
    x = jnp.asarray(x)
    return x + jax.lax.stop_gradient(jnp.clip(x, low, high) - x)


def _knee(transform: str) -> float:
    # A scaler may be built inside a traced function; the knee is a constant all the same.
    with jax.ensure_compile_time_eval():
        return float(_SQUASHES[transform].inverse(np.float64(_KNEE_FRACTION)))


class BoundScaler(eqx.Module):
    """Two-way map between physical values in a box and unbounded latents.

    With ``w`` the warp, ``s = (w(x) - w(low)) / (w(high) - w(low))`` the position in the
    box, and ``squash`` the transform:

    - `to_latent(x) = temperature * squash⁻¹(s)` (linearly continued beyond the bounds);
    - `from_latent(z) = w⁻¹(w(low) + (w(high) - w(low)) * squash(z / temperature))`.

    **Arguments:**

    - `bounds`: one `(low, high)` pair per component, finite, `low < high`.
    - `transform`: the squash, `"sigmoid"` (default) or `"algebraic"` (slower-decaying tails).
    - `temperature`: positive scalar dividing the latent; an array leaf, conventionally frozen.
    - `warp`: `"linear"` (default) or `"log"` (halfway means the geometric midpoint; needs
      `low > 0`).
    - `z_knee`: the latent, in units of `temperature`, beyond which `saturation` charges.
      Defaults to the transform's own knee, `squash⁻¹(0.95)` (2.944 for the sigmoid).
    """

    bounds: tuple[tuple[float, float], ...] = eqx.field(static=True)
    transform: str = eqx.field(static=True)
    warp: str = eqx.field(static=True)
    z_knee: float = eqx.field(static=True)
    temperature: Float[Array, ""]

    def __init__(
        self,
        bounds: Sequence[tuple[float, float]],
        transform: str = "sigmoid",
        temperature: ArrayLike = 1.0,
        warp: str = "linear",
        z_knee: float | None = None,
    ):
        if transform not in _SQUASHES:
            raise ValueError(f"transform must be one of {sorted(_SQUASHES)}; got {transform!r}")
        if warp not in _WARPS:
            raise ValueError(f"warp must be one of {sorted(_WARPS)}; got {warp!r}")
        pairs = tuple((float(low), float(high)) for low, high in bounds)
        if not pairs:
            raise ValueError("bounds must hold at least one (low, high) pair; got none")
        for i, (low, high) in enumerate(pairs):
            if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
                raise ValueError(f"bounds[{i}] must be finite with low < high; got ({low}, {high})")
            if warp == "log" and low <= 0:
                raise ValueError(
                    f"warp='log' needs positive bounds; bounds[{i}] = ({low}, {high}) starts at "
                    f"{low}. Use a small positive lower bound or warp='linear'."
                )
        temp = np.asarray(temperature)
        if temp.shape != () or not np.isfinite(temp) or temp <= 0:
            raise ValueError(f"temperature must be a finite positive scalar; got {temperature!r}")
        knee = _knee(transform) if z_knee is None else float(z_knee)
        if not (math.isfinite(knee) and knee >= 0):
            raise ValueError(f"z_knee must be finite and non-negative; got {z_knee!r}")
        self.bounds = pairs
        self.transform = transform
        self.warp = warp
        self.z_knee = knee
        self.temperature = jnp.asarray(temperature, dtype=float)

    @property
    def size(self) -> int:
        """Number of components (length of `bounds`)."""
        return len(self.bounds)

    def _warped_box(self, dtype: Any) -> tuple[Array, Array]:
        forward = _HOST_WARPS[self.warp]
        lows = np.asarray([forward(lo) for lo, _ in self.bounds], dtype=np.float64)
        highs = np.asarray([forward(hi) for _, hi in self.bounds], dtype=np.float64)
        return jnp.asarray(lows, dtype), jnp.asarray(highs, dtype)

    def to_latent(self, x: Float[ArrayLike, "... n"]) -> Float[Array, "... n"]:
        """Physical values `[..., n]` to latents `[..., n]`."""
        x = jnp.asarray(x)
        dtype = jnp.result_type(x.dtype, self.temperature.dtype, float)
        lo, hi = self._warped_box(dtype)
        s = (_WARPS[self.warp][0](x.astype(dtype)) - lo) / (hi - lo)
        z = _continued_inverse(_SQUASHES[self.transform], s, _EDGE)
        return z * self.temperature.astype(dtype)

    def from_latent(self, z: Float[ArrayLike, "... n"]) -> Float[Array, "... n"]:
        """Latents `[..., n]` to physical values `[..., n]`, always inside the box."""
        z = jnp.asarray(z)
        dtype = jnp.result_type(z.dtype, self.temperature.dtype, float)
        lo, hi = self._warped_box(dtype)
        s = _SQUASHES[self.transform].forward(z.astype(dtype) / self.temperature.astype(dtype))
        return _WARPS[self.warp][1](lo + (hi - lo) * s)

    def saturation(self, z: Float[ArrayLike, ...]) -> Float[Array, ""]:
        """Mean squared excess of `|z / temperature|` over `z_knee`; 0 when nothing saturates."""
        z = jnp.asarray(z)
        excess = jnp.maximum(jnp.abs(z / self.temperature) - self.z_knee, 0)
        return jnp.mean(excess**2)

    def input_violation(self, x: Float[ArrayLike, "... n"]) -> Float[Array, ""]:
        """Mean squared distance of physical values `x [..., n]` outside the box, in widths.

        Each component's excess below `low` or above `high` is divided by `high - low` and
        squared (0 inside the box, so the penalty is continuously differentiable), then
        averaged over all entries. Its gradient points back into the box. It is measured in
        physical units whatever the warp, so it stays finite for any `x` (a log warp would be
        undefined at `x <= 0`). Use it as a trajectory penalty rate for a predictor whose
        inputs are states: `penalty_rhs = lambda t, y, args: scaler.input_violation(y[:-1])[None]`.
        """
        x = jnp.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.size:
            raise ValueError(
                f"input_violation: x has shape {x.shape}; expected (..., {self.size}), one "
                "column per bound"
            )
        dtype = jnp.result_type(x.dtype, float)
        box = np.asarray(self.bounds, dtype=np.float64)
        lo, hi = jnp.asarray(box[:, 0], dtype), jnp.asarray(box[:, 1], dtype)
        x = x.astype(dtype)
        below = jnp.maximum(lo - x, 0) / (hi - lo)
        above = jnp.maximum(x - hi, 0) / (hi - lo)
        return jnp.mean(below**2 + above**2)

    def reinitialise(self, key: Any) -> BoundScaler:
        """The scaler unchanged: its bounds and temperature are configuration, not a fit.

        [`reinitialise`][hybrid_kernels.reinitialise] calls this, so the tournament and the
        ensembles never redraw a temperature (a standard-normal draw can be negative).
        """
        del key
        return self


class BoundedPredictor(eqx.Module):
    """Named physical inputs → `in_scaler.to_latent` → `inner` → `out_scaler.from_latent`.

    **Arguments:**

    - `inner`: any callable module mapping latents `[n_inputs]` to latents `[n_outputs]`
      (for example `eqx.nn.MLP`); it never sees a bound.
    - `in_scaler`: a `BoundScaler` with one pair per input.
    - `out_scaler`: a `BoundScaler` with one pair per output.
    - `input_keys`: the names of the inputs, in the order `inner` reads them; covariate names
      let the bound penalty find data points automatically. Defaults to `("x1", ..., "xN")`.

    Calling it with a dict of named scalars (extra keys ignored) or an array `[n_inputs]`
    returns the physical outputs `[n_outputs]`, each inside its box.
    """

    inner: Callable[[Array], Array]
    in_scaler: BoundScaler
    out_scaler: BoundScaler
    input_keys: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        inner: Callable[[Array], Array],
        *,
        in_scaler: BoundScaler,
        out_scaler: BoundScaler,
        input_keys: Sequence[str] | None = None,
    ):
        if not isinstance(in_scaler, BoundScaler) or not isinstance(out_scaler, BoundScaler):
            raise TypeError("in_scaler and out_scaler must be BoundScaler instances")
        keys = (
            tuple(f"x{i + 1}" for i in range(in_scaler.size))
            if input_keys is None
            else tuple(input_keys)
        )
        if len(keys) != in_scaler.size or len(set(keys)) != len(keys):
            raise ValueError(
                f"input_keys must hold {in_scaler.size} distinct names, one per in_scaler bound; "
                f"got {keys}"
            )
        self.inner = inner
        self.in_scaler = in_scaler
        self.out_scaler = out_scaler
        self.input_keys = keys

    @property
    def n_inputs(self) -> int:
        """Number of inputs (length of `input_keys`)."""
        return len(self.input_keys)

    def _stack_inputs(self, inputs: Mapping[str, ArrayLike] | ArrayLike) -> Array:
        if isinstance(inputs, Mapping):
            missing = [k for k in self.input_keys if k not in inputs]
            if missing:
                raise KeyError(
                    f"BoundedPredictor inputs lack {missing}; it reads {self.input_keys}"
                )
            return jnp.stack([jnp.asarray(inputs[k]).reshape(()) for k in self.input_keys])
        x = jnp.asarray(inputs)
        if x.shape != (self.n_inputs,):
            raise ValueError(f"expected inputs of shape ({self.n_inputs},); got {x.shape}")
        return x

    def latent(self, inputs: Mapping[str, ArrayLike] | ArrayLike) -> Float[Array, " n_outputs"]:
        """The inner module's output latents for physical `inputs` (what saturation reads)."""
        z = jnp.asarray(self.inner(self.in_scaler.to_latent(self._stack_inputs(inputs))))
        if z.shape != (self.out_scaler.size,):
            raise ValueError(
                f"inner returned shape {z.shape}; expected ({self.out_scaler.size},), one latent "
                "per out_scaler bound"
            )
        return z

    def __call__(self, inputs: Mapping[str, ArrayLike] | ArrayLike) -> Float[Array, " n_outputs"]:
        return self.out_scaler.from_latent(self.latent(inputs))
