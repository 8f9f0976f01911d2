"""Bounded predictors: a physical box around an unbounded learnable function.

A :class:`BoundScaler` maps each physical quantity in a box ``[low, high]`` onto an unbounded
*latent* coordinate and back. A :class:`BoundedPredictor` composes two of them around any inner
module: named physical inputs go to latents, the inner module maps latents to latents, and the
output scaler squashes the result into its physical box. Bounds therefore hold by construction,
and there is nothing to clip (clipping would zero the gradient outside the box).

The cost is that the squash flattens near the bounds, so a predictor pushed against a bound
stops receiving gradient. :meth:`BoundScaler.saturation` measures how far latents have run past
the knee (the latent at which the physical value enters the outer 5 % of its box); the bound
penalty in :mod:`hybrid_kernels.penalties` charges it.
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

__all__ = ["BoundScaler", "BoundedPredictor"]

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


def _knee(transform: str) -> float:
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
        forward = _WARPS[self.warp][0]
        lows = np.asarray([forward(np.float64(lo)) for lo, _ in self.bounds])
        highs = np.asarray([forward(np.float64(hi)) for _, hi in self.bounds])
        return jnp.asarray(lows, dtype), jnp.asarray(highs, dtype)

    def to_latent(self, x: Float[ArrayLike, "... n"]) -> Float[Array, "... n"]:
        """Physical values `[..., n]` to latents `[..., n]`."""
        x = jnp.asarray(x)
        dtype = jnp.result_type(x.dtype, self.temperature.dtype, float)
        lo, hi = self._warped_box(dtype)
        s = (_WARPS[self.warp][0](x.astype(dtype)) - lo) / (hi - lo)
        squash = _SQUASHES[self.transform]
        s_in = jnp.clip(s, _EDGE, 1 - _EDGE)
        # Exact inside the box, first-order continuation outside: finite and differentiable.
        z = squash.inverse(s_in) + squash.inverse_slope(s_in) * (s - s_in)
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
