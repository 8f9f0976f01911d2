"""The three atom kinds a bank slot can hold: ordinary, centred pair ("collision"), moments.

All functions are elementwise and broadcast, so the bank evaluates them once for every slot at
once (slots are a leading array axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import Array

from confluent_bank._activations import ActivationSpec, get_activation, sigma_tower
from confluent_bank._host import SERIES_RADIUS, SERIES_TERMS


def retract_spread(rho: Array) -> Array:
    """Project spreads onto `ρ ≥ 0`: `where(ρ ≥ 0, ρ, 0)`.

    The derivative is exactly 1 at `ρ = 0` and 0 for negative `ρ`.
    """
    rho = jnp.asarray(rho)
    return jnp.where(rho >= 0, rho, jnp.zeros_like(rho))


def _pair_spec(activation: str | ActivationSpec) -> ActivationSpec:
    spec = get_activation(activation)
    if spec.name not in ("sigmoid", "tanh"):
        raise ValueError(f"the centred pair supports sigmoid and tanh only, got {spec.name!r}")
    return spec


def _g(u: Array) -> Array:
    """`(1 − e^{−2u}) / (2u)` for `u > 0`, without cancellation."""
    return -jnp.expm1(-2 * u) / (2 * u)


def _finite_pair(name: str, z: Array, u: Array, eta: Array) -> tuple[Array, Array]:
    # σ(z+u) − σ(z−u) = σ(z+u)·σ(u−z)·(1 − e^{−2u}): no two close activation values are
    # subtracted, so the difference quotient keeps full relative accuracy.
    sigmoid = jax.nn.sigmoid
    if name == "sigmoid":
        plus, minus, cross = sigmoid(z + u), sigmoid(z - u), sigmoid(u - z)
        return (plus + minus) * 0.5, eta * plus * cross * _g(u)
    zz, uu = 2 * z, 2 * u  # tanh(y) = 2σ(2y) − 1
    plus, minus, cross = sigmoid(zz + uu), sigmoid(zz - uu), sigmoid(uu - zz)
    return 2 * ((plus + minus) * 0.5) - 1, 2 * (eta * 2 * plus * cross * _g(uu))


def _even_series(w: Array, terms: int, offset: int) -> Array:
    """`Σ_{k<terms} w^k / (2k + offset)!` by Horner: `cosh √w` (offset 0) or `sinh √w / √w`
    (offset 1), truncated. Entire in `w`, so every `ρ`-derivative is finite at `w = 0`."""
    total = jnp.full_like(w, 1 / math.factorial(2 * (terms - 1) + offset))
    for k in range(terms - 2, -1, -1):
        total = total * w + 1 / math.factorial(2 * k + offset)
    return total


def _near_pair(name: str, z: Array, w: Array, eta: Array, terms: int) -> tuple[Array, Array]:
    """`(A, B)` for `w = ρη² ≤ r²` from exact rational forms, without derivative rows.

    With `u = hη` and `q = e^{−|z|}`, `σ(z + u) ± σ(z − u)` have the common denominator
    `D = 1 + 2q·cosh u + q²`, and both `cosh u = C(w)` and `sinh(u)/u = S(w)` are entire in
    `w = u²`. Hence, for the sigmoid,
    `A = (1 + qC)/D` (`z ≥ 0`) or `q(q + C)/D` (`z < 0`), and `B = η·q·S/D`;
    for tanh, with `q = e^{−2|z|}` and `C, S` at `4w`,
    `A = sign(z)·(1 − q²)/(1 + q² + 2qC)` and `B = 4η·q·S/(1 + q² + 2qC)`.
    Nothing overflows (`q ≤ 1`, `C ≈ 1`) and nothing cancels (`1 − q²` by `expm1`), so both
    keep full relative accuracy. `C` and `S` are truncated after `terms` terms: the truncation
    is `O(w^T/(2T)!)`, the order of the `T`-term series in `ρ` of `A` and `B`.
    """
    positive = z >= 0
    # |z| with the derivative of the side it is on (`abs` has derivative 0 at 0).
    magnitude = jnp.where(positive, z, -z)
    if name == "sigmoid":
        q = jnp.exp(-magnitude)
        c, s = _even_series(w, terms, 0), _even_series(w, terms, 1)
        denominator = 1 + q * (2 * c + q)
        a = jnp.where(positive, 1 + q * c, q * (q + c)) / denominator
        return a, eta * q * s / denominator
    q = jnp.exp(-2 * magnitude)
    c, s = _even_series(4 * w, terms, 0), _even_series(4 * w, terms, 1)
    denominator = 1 + q * (q + 2 * c)
    a = -jnp.expm1(-4 * magnitude) / denominator
    return jnp.where(positive, a, -a), 4 * eta * q * s / denominator


def _exact_where(condition: Array, value: Array, exact: Array) -> Array:
    """`exact` where `condition` holds, `value` elsewhere, with `value`'s derivatives throughout."""
    correction = jax.lax.stop_gradient(exact - value)
    return value + jnp.where(condition, correction, jnp.zeros_like(value))


def _pair_terms(
    name: str,
    z: Array,
    rho: Array,
    eta: Array,
    tower: Sequence[Array] | Array,
    series_terms: int = SERIES_TERMS,
    series_radius: float = SERIES_RADIUS,
) -> tuple[Array, Array]:
    """`(A, B)` of the centred pair; `tower[k]` (a stacked tower or a tuple of rows) must hold
    `σ^(k)(z)` for `k ≤ 1` (the values at `ρ = 0`)."""
    p = retract_spread(rho)
    w = p * eta**2
    near = w <= series_radius**2
    # Safe stand-ins: the discarded branch must not produce inf/NaN (its zero cotangent would
    # turn into a NaN gradient), and a huge spread must not overflow the discarded powers of w.
    h = jnp.sqrt(jnp.where(near, jnp.ones_like(p), p))
    u = jnp.where(near, jnp.ones_like(h * eta), jnp.abs(h * eta))
    a_finite, b_finite = _finite_pair(name, z, u, eta)
    w_near = jnp.where(near, w, jnp.zeros_like(w))
    a_near, b_near = _near_pair(name, z, w_near, eta, series_terms)
    # At ρη² = 0 the pair is exactly the derivative neuron `σ(z) + η σ'(z)`, bitwise as the
    # tower gives it (so the pair and its limit atom agree to the last bit there); the
    # derivatives stay those of the rational forms. `a + (b − a)` is `b` exactly when `b − a`
    # is exact, as it is for values within a factor of 2 of each other (Sterbenz).
    collided = w_near == 0
    a_near = _exact_where(collided, a_near, tower[0])
    b_near = _exact_where(collided, b_near, eta * tower[1])
    return jnp.where(near, a_near, a_finite), jnp.where(near, b_near, b_finite)


def collision_atom(
    z: Array,
    rho: Array,
    eta: Array,
    m0: Array,
    m1: Array,
    *,
    activation: str | ActivationSpec = "sigmoid",
    tower: Array | None = None,
    series_terms: int = SERIES_TERMS,
    series_radius: float = SERIES_RADIUS,
) -> Array:
    """The centred pair `m0·A(z, ρ, η) + m1·B(z, ρ, η)` with `ρ = h²`.

    `A = [σ(z + hη) + σ(z − hη)]/2` and `B = [σ(z + hη) − σ(z − hη)]/(2h)` (`B = η σ'(z)` at
    `ρ = 0`). Near the collision (`|hη| ≤ series_radius`) both are exact rational forms in
    `e^{−|z|}` and the entire functions `cosh √w`, `sinh √w / √w` of `w = ρη²`, each summed to
    `series_terms` terms, so values and all `ρ`-derivatives stay finite at `ρ = 0` (where the
    atom is `m0 σ(z) + m1 η σ'(z)`, bitwise the tower's rows); elsewhere a cancellation-free
    closed form. Both keep full relative accuracy. The spec writes the near side as the `T`-term
    series of `A` and `B` in `ρ`, which needs derivative rows up to `2T − 1`; both truncations
    are `O(w^T)`, so with the defaults (`w ≤ 10⁻⁴`, `T = 6`) they agree to rounding. Negative
    spreads are treated as 0.

    **Arguments:**

    - `z`: argument, any shape; `rho`, `eta`, `m0`, `m1` broadcast against it.
    - `rho`: spread `ρ = h²`.
    - `eta`: direction value `η`.
    - `m0`, `m1`: even and odd moments.
    - `activation`: `"sigmoid"` (alias `"logistic"`) or `"tanh"`.
    - `tower`: optional precomputed `sigma_tower(activation, z, K)` with `K ≥ 2·series_terms − 1`
        (the spec's requirement, kept); rows 0 and 1 give the values at `ρ = 0`.
    - `series_terms`: number of series terms `T ≥ 1` (default 6).
    - `series_radius`: series radius `0 < r ≤ 0.1` (default 0.01).

    **Returns:** an array of the broadcast shape.
    """
    spec = _pair_spec(activation)
    if series_terms < 1:
        raise ValueError(f"series_terms must be >= 1, got {series_terms}")
    if not 0 < series_radius <= 0.1:
        raise ValueError(f"series_radius must be in (0, 0.1], got {series_radius}")
    z = jnp.asarray(z)
    if tower is None:
        tower = sigma_tower(spec, z, 1)
    elif tower.shape[0] <= 2 * series_terms - 1:
        raise ValueError(
            f"the tower needs more than {2 * series_terms - 1} rows for {series_terms} series "
            f"terms, got {tower.shape[0]}"
        )
    a, b = _pair_terms(
        spec.name,
        z,
        jnp.asarray(rho),
        jnp.asarray(eta),
        tower,
        series_terms,
        series_radius,
    )
    return m0 * a + m1 * b


def _moment_sum(coefficients: Sequence[Array], tower: Sequence[Array] | Array) -> Array:
    """`Σ_k coefficients[k] · tower[k]`, accumulated in increasing k."""
    total = coefficients[0] * tower[0]
    for k in range(1, len(coefficients)):
        total = total + coefficients[k] * tower[k]
    return total


def moment_atom(
    z: Array,
    moments: Array,
    *,
    activation: str | ActivationSpec = "sigmoid",
    tower: Array | None = None,
) -> Array:
    """Truncated moment expansion `Σ_{k=0}^{n} M_k · σ^(k)(z)` with `n = len(M) − 1`.

    **Arguments:**

    - `z`: argument, any shape.
    - `moments`: 1-D, non-empty Taylor-normalised moments `M`.
    - `activation`: activation name or spec.
    - `tower`: optional precomputed tower with at least `n + 1` rows.
    """
    moments = jnp.asarray(moments)
    if moments.ndim != 1 or moments.shape[0] == 0:
        raise ValueError(f"moments must be a non-empty 1-D array, got shape {moments.shape}")
    order = moments.shape[0] - 1
    z = jnp.asarray(z)
    if tower is None:
        tower = sigma_tower(activation, z, order)
    elif tower.shape[0] < order + 1:
        raise ValueError(
            f"the tower needs at least {order + 1} rows for {order + 1} moments, "
            f"got {tower.shape[0]}"
        )
    return _moment_sum([moments[k] for k in range(order + 1)], tower)


def _pair_limit(
    activation: ActivationSpec,
    direction: float,
    scale: Array,
    center: Array,
    rho: Array,
    eta_slope: Array,
    eta_bias: Array,
) -> tuple[Array, Array]:
    """`(A, B)` of the centred pair in `u = s(x − c)`, `η = v·x + d`, as `x → direction·∞`.

    The two activations see `u ± hη = (s ± hv)·x + (−sc ± hd)`: each tends to `±∞` with the sign
    of its slope, or to its constant when the slope is exactly 0. `B` is their difference over
    `2h`; at `h = 0` it is `η σ'(u)`, which vanishes for `s ≠ 0` (the exponential wins over the
    linear growth of `η`) and is returned as 0 otherwise: a bank replaces it where it diverges.
    Inputs broadcast; only comparisons see the slopes, so gradients stay finite.
    """
    p = retract_spread(rho)
    spread = p > 0
    h_safe = jnp.sqrt(jnp.where(spread, p, jnp.ones_like(p)))
    h = jnp.where(spread, h_safe, jnp.zeros_like(h_safe))
    infinity = direction * jnp.asarray(jnp.inf, dtype=h.dtype)

    def limit(slope: Array, constant: Array) -> Array:
        return jnp.where(slope > 0, infinity, jnp.where(slope < 0, -infinity, constant))

    plus = activation.forward(limit(scale + h * eta_slope, -scale * center + h * eta_bias))
    minus = activation.forward(limit(scale - h * eta_slope, -scale * center - h * eta_bias))
    a = (plus + minus) * 0.5
    b = jnp.where(spread, (plus - minus) / (2 * h_safe), jnp.zeros_like(plus))
    return a, b
