"""Built-in losses: `loss(pred_obs [N, T, D], bp) -> scalar`, NaN-safe in masked cells.

Every loss first replaces masked cells of the prediction and the data by 0 (and masked
variances by 1), then gates each contribution with `where`. A NaN or Inf in a masked cell
therefore reaches neither the value nor the gradient: a masked cell gets exactly zero
gradient. Mean-type losses divide by a count clamped at 1.

Channel options (keyword-only on every built-in): `channel_idx` keeps only those output
channels, `channel_weights` weighs the kept channels (one weight each; weights do not enter
the denominator).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float

_LOG_2PI = math.log(2.0 * math.pi)
_MIN_VAR = 1e-12


def _select(pred, bp, channel_idx, channel_weights):
    """(p, y, v, m, w) restricted to the selected channels, masked cells made harmless."""
    D = bp.mask.shape[-1]
    y, v, m = bp.y_observed, bp.yvar, bp.mask
    if channel_idx is not None:
        idx = tuple(int(i) for i in channel_idx)
        bad = [i for i in idx if not -D <= i < D]
        if bad:
            raise ValueError(f"channel_idx {bad} out of range for D = {D} output channels.")
        sel = jnp.asarray(idx, dtype=jnp.int32)
        pred, y, v, m = (a[..., sel] for a in (pred, y, v, m))
    n_sel = m.shape[-1]
    if channel_weights is None:
        w = jnp.ones((n_sel,), dtype=pred.dtype)
    else:
        w = jnp.asarray(channel_weights, dtype=pred.dtype)
        if w.shape != (n_sel,):
            raise ValueError(
                f"channel_weights has shape {w.shape}; expected ({n_sel},), one weight per "
                "selected channel."
            )
    p = jnp.where(m, pred, 0.0)
    y = jnp.where(m, y, 0.0)
    v = jnp.where(m, v, 1.0)
    return p, y, v, m, w


def masked_mse(
    pred_obs: Float[Array, "N T D"],
    bp: Any,
    *,
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
) -> Float[Array, ""]:
    """`Σ w_d·m·r² / max(Σ m, 1)`: mean squared residual over observed cells."""
    p, y, _, m, w = _select(pred_obs, bp, channel_idx, channel_weights)
    sq = jnp.where(m, (p - y) ** 2, 0.0) * w
    return sq.sum() / jnp.maximum(m.sum(), 1).astype(p.dtype)


def _nll(p, y, v, m):
    v = jnp.maximum(v, _MIN_VAR)
    return jnp.where(m, 0.5 * (_LOG_2PI + jnp.log(v)) + 0.5 * (p - y) ** 2 / v, 0.0)


def masked_mle(
    pred_obs: Float[Array, "N T D"],
    bp: Any,
    *,
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
) -> Float[Array, ""]:
    """Gaussian negative log-likelihood, summed (not averaged) over observed cells.

    `Σ_{n,d} w_d Σ_t m·[½ log(2π v) + ½ r²/v]` with `v = max(variance, 1e-12)`.
    """
    p, y, v, m, w = _select(pred_obs, bp, channel_idx, channel_weights)
    return (_nll(p, y, v, m) * w).sum()


def _balanced(per_cell, m, w):
    counts = m.sum(axis=1)  # [N, D]
    a = per_cell.sum(axis=1) / jnp.maximum(counts, 1).astype(per_cell.dtype)
    e = (a * w).sum(axis=-1)  # [N]
    observed = counts.sum(axis=-1) > 0
    return jnp.where(observed, e, 0.0).sum() / jnp.maximum(observed.sum(), 1).astype(e.dtype)


def bal_mse(
    pred_obs: Float[Array, "N T D"],
    bp: Any,
    *,
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
) -> Float[Array, ""]:
    """Experiment-balanced MSE: per-(experiment, channel) means, weighted over channels,
    averaged over experiments with at least one selected observation (probes excluded)."""
    p, y, _, m, w = _select(pred_obs, bp, channel_idx, channel_weights)
    return _balanced(jnp.where(m, (p - y) ** 2, 0.0), m, w)


def bal_mle(
    pred_obs: Float[Array, "N T D"],
    bp: Any,
    *,
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
) -> Float[Array, ""]:
    """Experiment-balanced Gaussian NLL, reduced like [`hybrid_kernels.bal_mse`][]."""
    p, y, v, m, w = _select(pred_obs, bp, channel_idx, channel_weights)
    return _balanced(_nll(p, y, v, m), m, w)


LOSS_REGISTRY: dict[str, Callable[..., Array]] = {
    "mse": masked_mse,
    "mle": masked_mle,
    "bal_mse": bal_mse,
    "bal_mle": bal_mle,
}
"""Built-in losses by name: `"mse"`, `"mle"`, `"bal_mse"`, `"bal_mle"`.

Each is `(pred_obs [N, T, D], bp) -> []`.
"""


def available_losses() -> tuple[str, ...]:
    """The loss names [`hybrid_kernels.resolve_loss_fn`][] and `OptaxTrainingConfig(loss=...)`
    accept, sorted: a read-only snapshot of the built-in losses."""
    return tuple(sorted(LOSS_REGISTRY))


def _accepts_channel_kwargs(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    return (
        any(p.kind is p.VAR_KEYWORD for p in params)
        or {
            "channel_idx",
            "channel_weights",
        }
        <= names
    )


def resolve_loss_fn(
    loss: str | Callable[..., Array],
    channel_idx: Sequence[int] | None = None,
    channel_weights: Sequence[float] | None = None,
) -> Callable[[Array, Any], Array]:
    """Turn a loss name or callable plus channel options into `(pred_obs, bp) -> scalar`.

    **Arguments:**

    - `loss`: a built-in loss by name, `"mse"`, `"mle"`, `"bal_mse"` or `"bal_mle"` (case and
        whitespace ignored), or a callable `(pred_obs, bp) -> scalar`.
    - `channel_idx`: output channels to keep.
    - `channel_weights`: one weight per kept channel.

    A callable that accepts `channel_idx`/`channel_weights` (or `**kwargs`) receives them; a
    plain two-argument callable instead sees `pred_obs` and the payload's `y_observed`, `yvar`
    and `mask` sliced to the kept channels. A plain callable cannot take `channel_weights`.
    """
    if isinstance(loss, str):
        key = "".join(loss.split()).lower()
        if key not in LOSS_REGISTRY:
            raise ValueError(f"Unknown loss {loss!r}; available: {sorted(LOSS_REGISTRY)}.")
        fn = LOSS_REGISTRY[key]
    elif callable(loss):
        fn = loss
    else:
        raise TypeError(f"`loss` must be a name or a callable, got {type(loss).__name__}.")
    if channel_idx is None and channel_weights is None:
        return fn
    if _accepts_channel_kwargs(fn):
        return _Bound(fn, channel_idx, channel_weights)
    if channel_weights is not None:
        raise ValueError(
            "`channel_weights` needs a loss that accepts `channel_idx` and `channel_weights` "
            "keywords; this callable takes only (pred_obs, bp)."
        )
    return _Projected(fn, tuple(int(i) for i in channel_idx))  # type: ignore[union-attr]


class _Bound:
    """A loss with its channel options bound; hashable so kernels cache on it."""

    def __init__(self, fn, channel_idx, channel_weights):
        self.fn = fn
        self.channel_idx = None if channel_idx is None else tuple(int(i) for i in channel_idx)
        self.channel_weights = (
            None if channel_weights is None else tuple(float(w) for w in channel_weights)
        )

    def __call__(self, pred_obs, bp):
        return self.fn(
            pred_obs, bp, channel_idx=self.channel_idx, channel_weights=self.channel_weights
        )

    def _key(self):
        return (self.fn, self.channel_idx, self.channel_weights)

    def __eq__(self, other):
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())


class _Projected:
    """A plain `(pred_obs, bp)` loss that sees only the selected channels."""

    def __init__(self, fn, channel_idx):
        self.fn = fn
        self.channel_idx = channel_idx

    def __call__(self, pred_obs, bp):
        D = bp.mask.shape[-1]
        bad = [i for i in self.channel_idx if not -D <= i < D]
        if bad:
            raise ValueError(f"channel_idx {bad} out of range for D = {D} output channels.")
        sel = jnp.asarray(self.channel_idx, dtype=jnp.int32)
        sub = bp._replace(
            y_observed=bp.y_observed[..., sel], yvar=bp.yvar[..., sel], mask=bp.mask[..., sel]
        )
        return self.fn(pred_obs[..., sel], sub)

    def __eq__(self, other):
        return type(other) is type(self) and (other.fn, other.channel_idx) == (
            self.fn,
            self.channel_idx,
        )

    def __hash__(self):
        return hash((self.fn, self.channel_idx))
