"""Activations and their derivative towers (closed forms through Riccati polynomials).

`σ^(n)(z) = P_n(σ(z))` for the logistic sigmoid and `tanh^(n)(z) = Q_n(tanh(z))`, where the
integer polynomials follow `P_{n+1}(s) = s(1 − s) P_n'(s)` and `Q_{n+1}(t) = (1 − t²) Q_n'(t)`.
One native activation call plus a Horner evaluation gives every derivative row at once.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

MAX_TOWER_ORDER = 512
"""Highest derivative order the exact coefficient generator accepts.

Evaluating a row in floating point needs its coefficients as floats, so the float tower stops
earlier: at order 159 (sigmoid) / 162 (tanh) in float64 and 30 / 31 in float32 (see
`_finite_tower_order`).
"""


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
    """An activation and (optionally) fast derivative kernels.

    **Arguments:**

    - `name`: registry name.
    - `forward`: `z ↦ σ(z)`, elementwise.
    - `fastpath`: optional `(z, n) ↦ σ^(n)(z)`; may raise `NotImplementedError` for some `n`.
    - `tower`: optional `(z, m) ↦ [σ^(0)(z), …, σ^(m)(z)]`, shape `(m + 1, *z.shape)`.
    - `rows`: optional `(z, m) ↦ (σ^(0)(z), …, σ^(m)(z))`, the same tower as a tuple of arrays.
      Consumers that combine rows elementwise (the bank) use it when present: every operation
      stays elementwise, so XLA fuses the whole slot computation and its gradient.
    """

    name: str
    forward: Callable[[Array], Array]
    fastpath: Callable[[Array, int], Array] | None = None
    tower: Callable[[Array, int], Array] | None = None
    rows: Callable[[Array, int], tuple[Array, ...]] | None = None


@functools.lru_cache(maxsize=2 * MAX_TOWER_ORDER + 8)
def riccati_coefficients(kind: str, order: int) -> tuple[int, ...]:
    """Exact integer coefficients `(c_0, …, c_{order+1})` of `P_order` (sigmoid) / `Q_order` (tanh).

    **Arguments:**

    - `kind`: `"sigmoid"` or `"tanh"`.
    - `order`: derivative order, `0 ≤ order ≤ 512`.
    """
    if kind not in ("sigmoid", "tanh"):
        raise ValueError(f"Riccati coefficients exist for 'sigmoid' and 'tanh', not {kind!r}")
    if not 0 <= order <= MAX_TOWER_ORDER:
        raise ValueError(f"derivative order must be in 0..{MAX_TOWER_ORDER}, got {order}")
    if order == 0:
        return (0, 1)
    previous = riccati_coefficients(kind, order - 1)
    derivative = [k * c for k, c in enumerate(previous)][1:]
    result = [0] * (len(previous) + 1)
    for k, d in enumerate(derivative):
        if kind == "sigmoid":  # (s − s²) · P'
            result[k + 1] += d
            result[k + 2] -= d
        else:  # (1 − t²) · Q'
            result[k] += d
            result[k + 2] -= d
    return tuple(result)


@functools.lru_cache(maxsize=32)
def _finite_tower_order(kind: str, dtype: Any) -> int:
    """The highest order `n` whose Riccati coefficients sum to a finite `dtype` value, in absolute
    value. Every row up to `n` then evaluates without overflow: `|s|, |t| ≤ 1`, so each Horner
    step stays below `Σ|c_k|`. Above it a coefficient overflows (an `OverflowError`, or inf and
    NaN rows)."""
    largest = int(float(jnp.finfo(dtype).max))
    order = 0
    while order < MAX_TOWER_ORDER:
        if sum(abs(c) for c in riccati_coefficients(kind, order + 1)) > largest:
            break
        order += 1
    return order


def _check_finite_order(kind: str, order: int, dtype: Any) -> None:
    """Refuse a derivative order whose Riccati coefficients overflow `dtype`."""
    limit = _finite_tower_order(kind, dtype)
    if order > limit:
        raise ValueError(
            f"derivative order {order} of {kind} is above {limit}, the highest order whose "
            f"Riccati coefficients are finite in {dtype}"
        )


def _horner(value: Array, kind: str, order: int) -> Array:
    """`P_order(value)` (sigmoid) / `Q_order(value)` (tanh) by Horner from the top; zero
    coefficients are not skipped. Refuses an order whose coefficients overflow `value.dtype`."""
    _check_finite_order(kind, order, value.dtype)
    coefficients = riccati_coefficients(kind, order)
    acc = jnp.full_like(value, float(coefficients[-1]))
    for c in reversed(coefficients[:-1]):
        acc = acc * value + float(c)
    return acc


def _riccati_rows(
    kind: str, native: Callable[[Array], Array]
) -> Callable[[Array, int], tuple[Array, ...]]:
    # d/dz σ^(k) = σ^(k+1): the tangent of the tower is the next tower shifted by one row. This
    # custom JVP replaces differentiating the Horner recurrences by one more row: gradients stay
    # elementwise, cheap to compile and to run, and exact to every order of nesting.
    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def rows(z: Array, order: int) -> tuple[Array, ...]:
        value = native(z)
        return (
            value,
            *(_horner(value, kind, n) for n in range(1, order + 1)),
        )

    @rows.defjvp
    def rows_jvp(
        order: int, primals: tuple[Array], tangents: tuple[Array]
    ) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
        (z,), (dz,) = primals, tangents
        extended = rows(z, order + 1)
        return extended[:-1], tuple(row * dz for row in extended[1:])

    def checked(z: Array, order: int) -> tuple[Array, ...]:
        if order < 0:
            raise ValueError(f"tower order must be >= 0, got {order}")
        return rows(jnp.asarray(z), int(order))

    return checked


@functools.lru_cache(maxsize=64)
def _reduced_matrix(kind: str, order: int) -> np.ndarray:
    """`R_1 … R_order` as floats, shape `(order, order)`: row `n − 1` holds the coefficients of
    `R_n = P_n / (s − s²)` (sigmoid) or `Q_n / (1 − t²)` (tanh), padded with zeros.

    Every derivative row of order `n ≥ 1` carries the factor `σ'` as a polynomial in `σ`
    (`P_{n+1} = (s − s²)·P_n'`), so a series of rows is `a_0·σ + σ'·Σ_n a_n R_n(σ)`: the factor
    is exactly 0 where the activation has saturated, as every such row is.
    """
    factor = (0, 1, -1) if kind == "sigmoid" else (1, 0, -1)
    matrix = np.zeros((order, order))
    for n in range(1, order + 1):
        remainder = list(riccati_coefficients(kind, n))
        quotient = [0] * (len(remainder) - 2)
        for k in range(len(quotient) - 1, -1, -1):  # long division from the top degree
            quotient[k] = remainder[k + 2] // factor[2]
            for j, f in enumerate(factor):
                remainder[k + j] -= quotient[k] * f
        assert not any(remainder), (kind, n)
        matrix[n - 1, : len(quotient)] = [float(c) for c in quotient]
    return matrix


def _riccati_series(kind: str, native: Callable[[Array], Array]) -> Callable[[Array, Array], Array]:
    def plain(coefficients: Array, z: Array) -> Array:
        order = coefficients.shape[0] - 1
        _check_finite_order(kind, order, coefficients.dtype)
        value = native(z)
        if order == 0:
            return coefficients[0] * value
        # The polynomial in σ(z) that multiplies σ'(z), for the whole combination: its
        # coefficients as elementwise sums over the rows (a dot would be a separate, unfused
        # kernel, costly at the bank's small sizes inside a solver loop).
        matrix = _reduced_matrix(kind, order)
        reduced = [
            functools.reduce(
                operator.add,
                [float(c) * coefficients[n + 1] for n, c in enumerate(matrix[:, j]) if c != 0],
            )
            for j in range(order)
        ]
        acc = reduced[-1]
        for j in range(order - 2, -1, -1):
            acc = acc * value + reduced[j]
        slope = value * (1 - value) if kind == "sigmoid" else (1 - value) * (1 + value)
        return coefficients[0] * value + slope * acc

    @jax.custom_jvp
    def series(coefficients: Array, z: Array) -> Array:
        return plain(coefficients, z)

    def series_jvp(primals: tuple[Array, Array], tangents: tuple[Any, Any]) -> tuple[Array, Array]:
        (coefficients, z), (dcoefficients, dz) = primals, tangents
        value = series(coefficients, z)
        tangent = jnp.zeros_like(value)
        if not isinstance(dz, jax.custom_derivatives.SymbolicZero):
            # d/dz Σ_k a_k σ^(k) = Σ_k a_k σ^(k+1): the same series with the rows shifted by one.
            shifted = jnp.concatenate([jnp.zeros_like(coefficients[:1]), coefficients])
            tangent = tangent + series(shifted, z) * dz
        if not isinstance(dcoefficients, jax.custom_derivatives.SymbolicZero):
            tangent = tangent + plain(dcoefficients, z)  # linear in the coefficients
        return value, tangent

    series.defjvp(series_jvp, symbolic_zeros=True)
    return series


def _stacked(rows: Callable[[Array, int], tuple[Array, ...]]) -> Callable[[Array, int], Array]:
    def tower(z: Array, order: int) -> Array:
        return jnp.stack(rows(z, order))

    return tower


def _riccati_fastpath(kind: str, native: Callable[[Array], Array]) -> Callable[[Array, int], Array]:
    # One row, with the same derivative rule as the tower (row n+1 is the derivative of row n).
    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def row(z: Array, order: int) -> Array:
        value = native(z)
        return value if order == 0 else _horner(value, kind, order)

    @row.defjvp
    def row_jvp(order: int, primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
        (z,), (dz,) = primals, tangents
        return row(z, order), row(z, order + 1) * dz

    def fastpath(z: Array, order: int) -> Array:
        if order < 0:
            raise ValueError(f"derivative order must be >= 0, got {order}")
        return row(jnp.asarray(z), int(order))

    return fastpath


def _softplus_fastpath(z: Array, order: int) -> Array:
    if order == 0:
        return jax.nn.softplus(jnp.asarray(z))
    return _SIGMOID.fastpath(z, order - 1)  # type: ignore[misc]


def _softplus_tower(z: Array, order: int) -> Array:
    if order < 0:
        raise ValueError(f"tower order must be >= 0, got {order}")
    z = jnp.asarray(z)
    head = jax.nn.softplus(z)[None]
    if order == 0:
        return head
    return jnp.concatenate([head, _SIGMOID.tower(z, order - 1)], axis=0)  # type: ignore[misc]


def _exp_fastpath(z: Array, order: int) -> Array:
    if order < 0:
        raise ValueError(f"derivative order must be >= 0, got {order}")
    return jnp.exp(jnp.asarray(z))


def _exp_tower(z: Array, order: int) -> Array:
    if order < 0:
        raise ValueError(f"tower order must be >= 0, got {order}")
    value = jnp.exp(jnp.asarray(z))
    return jnp.broadcast_to(value[None], (order + 1, *value.shape))


_SIGMOID_ROWS = _riccati_rows("sigmoid", jax.nn.sigmoid)
_SERIES = {
    "sigmoid": _riccati_series("sigmoid", jax.nn.sigmoid),
    "tanh": _riccati_series("tanh", jnp.tanh),
}
_TANH_ROWS = _riccati_rows("tanh", jnp.tanh)
_SIGMOID = ActivationSpec(
    "sigmoid",
    jax.nn.sigmoid,
    _riccati_fastpath("sigmoid", jax.nn.sigmoid),
    _stacked(_SIGMOID_ROWS),
    _SIGMOID_ROWS,
)
_TANH = ActivationSpec(
    "tanh", jnp.tanh, _riccati_fastpath("tanh", jnp.tanh), _stacked(_TANH_ROWS), _TANH_ROWS
)
_SOFTPLUS = ActivationSpec("softplus", jax.nn.softplus, _softplus_fastpath, _softplus_tower)
_EXP = ActivationSpec("exp", jnp.exp, _exp_fastpath, _exp_tower)

_REGISTRY: dict[str, ActivationSpec] = {
    spec.name: spec for spec in (_SIGMOID, _TANH, _SOFTPLUS, _EXP)
}
_ALIASES: dict[str, str] = {"logistic": "sigmoid"}


def get_activation(activation: str | ActivationSpec) -> ActivationSpec:
    """Look up an activation by (case-insensitive) name or alias; a spec passes through.

    **Arguments:**

    - `activation`: a name (`"sigmoid"`, alias `"logistic"`, `"tanh"`, `"softplus"`, `"exp"`)
      or an `ActivationSpec`.

    Raises `TypeError` for anything else and `KeyError` (listing the known names) for an
    unknown name.
    """
    if isinstance(activation, ActivationSpec):
        return activation
    if not isinstance(activation, str):
        raise TypeError(
            f"activation must be a name or an ActivationSpec, got {type(activation).__name__}"
        )
    key = activation.lower()
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        known = sorted({*_REGISTRY, *_ALIASES})
        raise KeyError(f"unknown activation {activation!r}; known activations: {known}")
    return _REGISTRY[key]


def sigma_tower(activation: str | ActivationSpec, z: Array, order: int) -> Array:
    """All derivatives `σ^(0..order)(z)`, shape `(order + 1, *z.shape)`.

    Uses the spec's `tower` when it also has a `fastpath`; otherwise `forward` for row 0 and
    `fastpath(z, k)` for the other rows. A spec without a `fastpath` supports order 0 only.

    **Arguments:**

    - `activation`: a name or `ActivationSpec` (see `get_activation`).
    - `z`: array of any shape.
    - `order`: highest derivative order, `≥ 0`.
    """
    spec = get_activation(activation)
    if order < 0:
        raise ValueError(f"tower order must be >= 0, got {order}")
    z = jnp.asarray(z)
    if spec.fastpath is None:
        if order >= 1:
            raise ValueError(
                f"activation {spec.name!r} has no fastpath, so derivatives of order >= 1 are "
                "unavailable"
            )
        return spec.forward(z)[None]
    if spec.tower is not None:
        return spec.tower(z, order)
    rows = [spec.forward(z)]
    for k in range(1, order + 1):
        try:
            rows.append(spec.fastpath(z, k))
        except NotImplementedError:
            raise ValueError(
                f"activation {spec.name!r} does not implement derivative order {k}"
            ) from None
    return jnp.stack(rows)


def sigma_tower_rows(activation: str | ActivationSpec, z: Array, order: int) -> tuple[Array, ...]:
    """`sigma_tower` as a tuple of `order + 1` arrays of `z.shape` (same values, same rules).

    Uses the spec's `rows` when it has one (and a `fastpath`), otherwise splits `sigma_tower`.

    **Arguments:** as for `sigma_tower`.
    """
    spec = get_activation(activation)
    if order < 0:
        raise ValueError(f"tower order must be >= 0, got {order}")
    if spec.rows is not None and spec.fastpath is not None:
        return tuple(spec.rows(jnp.asarray(z), order))
    tower = sigma_tower(spec, z, order)
    return tuple(tower[k] for k in range(order + 1))
