"""Rigorous error bounds for inexact transitions, and an acceptance factory built on them.

Every bound is computed in exact rational arithmetic and rounded up once, from
`derivative_bound(σ, n)`, which bounds `sup |σ^(n)|` by the sum of the absolute Riccati
coefficients (valid because `|σ| ≤ 1` for sigmoid and tanh; loose but safe).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from confluent_bank._activations import ActivationSpec, get_activation, riccati_coefficients
from confluent_bank._host import SERIES_TERMS, HostView
from confluent_bank._moments import Interval, MomentInitialization, initialize_moments
from confluent_bank._records import TransitionKind, TransitionProposal
from confluent_bank._verify import check_implied_updates

EXACT_KINDS = frozenset(
    {
        TransitionKind.CENTERED_PAIR,
        TransitionKind.DUPLICATE_MERGE,
        TransitionKind.REMOVE_ZERO,
        TransitionKind.ZERO_OUTPUT_BIRTH,
    }
)
"""Proposal kinds that are identities in real arithmetic (their bound is 0)."""

Magnitude = float | int | Fraction | Interval


def _kind(activation: str | ActivationSpec) -> str:
    name = get_activation(activation).name
    if name not in ("sigmoid", "tanh"):
        raise ValueError(f"error bounds exist for sigmoid and tanh only, got {name!r}")
    return name


def derivative_bound(activation: str | ActivationSpec, order: int) -> int:
    """`Σ |c_k|` of the Riccati polynomial of `σ^(order)`, an upper bound of `sup |σ^(order)|`.

    **Arguments:**

    - `activation`: `"sigmoid"` (alias `"logistic"`) or `"tanh"`.
    - `order`: derivative order `≥ 0`.

    **Returns:** an exact integer (e.g. 150 for sigmoid order 4, whose true maximum is 0.125).
    """
    return sum(abs(c) for c in riccati_coefficients(_kind(activation), int(order)))


def _magnitude(value: Magnitude, what: str) -> Fraction:
    """Exact upper bound of `|value|` (an interval's largest magnitude)."""
    if isinstance(value, Interval):
        return max(_magnitude(value.lo, what), _magnitude(value.hi, what))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number or an Interval, got {value!r}")
    if isinstance(value, numbers.Rational):
        return abs(Fraction(int(value.numerator), int(value.denominator)))
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{what} must be finite, got {as_float}")
    return abs(Fraction(as_float))


def _upper(value: Fraction) -> float:
    """The smallest float `≥ value`."""
    nearest = float(value)
    return nearest if Fraction(nearest) >= value else math.nextafter(nearest, math.inf)


def cluster_remainder(
    init: MomentInitialization,
    activation: str | ActivationSpec,
    spatial_order: int = 0,
    weight: Magnitude = 1.0,
) -> Interval:
    """Bound `[0, hi]` on `|Σ_i a_i σ^(q)(u + b_i − c) − Σ_k m_k σ^(k+q)(u)| · |w|^q` for all `u`.

    `hi ≥ |w|^q · ((Σ_i |a_i| |b_i − c|^L / L!) · D(L + q) + Σ_k |err_k| · D(k + q))` with
    `L = order + 1` (Taylor remainder) and `err_k` the rounding error of the stored moments.

    **Arguments:**

    - `init`: the `initialize_moments` record of the cluster.
    - `activation`: `"sigmoid"` or `"tanh"`.
    - `spatial_order`: derivative order `q ≥ 0` in `x`.
    - `weight`: the common input scale `w` (each `x`-derivative brings a factor `w`).
    """
    q = int(spatial_order)
    if q < 0:
        raise ValueError(f"spatial_order must be >= 0, got {q}")
    count = len(init.moments)
    taylor = sum(
        (abs(a) * abs(d) ** count for a, d in zip(init.coefficients, init.offsets, strict=True)),
        Fraction(0),
    ) / math.factorial(count)
    rounding = sum(
        (
            _magnitude(error, "conversion error") * derivative_bound(activation, k + q)
            for k, error in enumerate(init.conversion_errors)
        ),
        Fraction(0),
    )
    total = _magnitude(weight, "weight") ** q * (
        taylor * derivative_bound(activation, count + q) + rounding
    )
    return Interval(0.0, _upper(total))


def _spread_terms(
    rho: Magnitude,
    eta: Magnitude,
    weight: Magnitude,
    direction: Magnitude,
    spatial_order: int,
    activation: str | ActivationSpec,
) -> tuple[Fraction, Callable[[int], Fraction]]:
    """`(ρ_hi, bound)` where `bound(k)` bounds the k-th `h`-derivative factor of
    `σ^(q)(z + hη)(W + hV)^q` (Leibniz rule)."""
    q = int(spatial_order)
    if q < 0:
        raise ValueError(f"spatial_order must be >= 0, got {q}")
    rho_hi = rho.hi if isinstance(rho, Interval) else rho
    rho_hi = max(Fraction(0), _magnitude(rho_hi, "rho") if float(rho_hi) > 0 else Fraction(0))
    h_hat = Fraction(math.nextafter(math.sqrt(float(rho_hi)), math.inf)) if rho_hi else Fraction(0)
    w, v, e = (
        _magnitude(weight, "weight"),
        _magnitude(direction, "direction"),
        _magnitude(eta, "eta"),
    )
    slope = w + h_hat * v

    def bound(k: int) -> Fraction:
        return sum(
            (
                math.comb(k, j)
                * Fraction(math.factorial(q), math.factorial(q - j))
                * v**j
                * slope ** (q - j)
                * e ** (k - j)
                * derivative_bound(activation, q + k - j)
                for j in range(min(k, q) + 1)
            ),
            Fraction(0),
        )

    return rho_hi, bound


def pair_derivative_error(
    rho: Magnitude,
    eta: Magnitude,
    m0: Magnitude,
    m1: Magnitude,
    *,
    weight: Magnitude = 1.0,
    direction: Magnitude = 0.0,
    spatial_order: int = 0,
    activation: str | ActivationSpec = "sigmoid",
) -> Interval:
    """Bound `[0, hi]` on the change of a centred pair when its spread is set to 0.

    `hi = ρ · (|m0| · bound(2)/2 + |m1| · bound(3)/6)` (Taylor in `h` of
    `σ^(q)(z + hη)(W + hV)^q`); 0 when `ρ_hi = 0`.

    **Arguments:**

    - `rho`: spread `ρ ≥ 0` (a number or an `Interval`, whose `hi` is used).
    - `eta`: bound on `|η|` over the domain (number or `Interval`).
    - `m0`, `m1`: even and odd moments.
    - `weight`: input scale `W` (slope of `z` in `x`).
    - `direction`: direction slope `V` (slope of `η` in `x`).
    - `spatial_order`: derivative order `q` in `x`.
    - `activation`: `"sigmoid"` or `"tanh"`.
    """
    rho_hi, bound = _spread_terms(rho, eta, weight, direction, spatial_order, activation)
    if rho_hi == 0:
        return Interval(0.0, 0.0)
    total = rho_hi * (_magnitude(m0, "m0") * bound(2) / 2 + _magnitude(m1, "m1") * bound(3) / 6)
    return Interval(0.0, _upper(total))


def pair_series_error(
    rho: Magnitude,
    eta: Magnitude,
    series_terms: int = SERIES_TERMS,
    *,
    weight: Magnitude = 1.0,
    direction: Magnitude = 0.0,
    spatial_order: int = 0,
    activation: str | ActivationSpec = "sigmoid",
) -> tuple[Interval, Interval]:
    """Truncation bounds of the centred pair's `T`-term series, for `A` and for `B`.

    `(ρ^T · bound(2T)/(2T)!, ρ^T · bound(2T+1)/(2T+1)!)`, arguments as in
    `pair_derivative_error`; `series_terms` is `T ≥ 1`.
    """
    if series_terms < 1:
        raise ValueError(f"series_terms must be >= 1, got {series_terms}")
    rho_hi, bound = _spread_terms(rho, eta, weight, direction, spatial_order, activation)
    t = int(series_terms)
    a = rho_hi**t * bound(2 * t) / math.factorial(2 * t)
    b = rho_hi**t * bound(2 * t + 1) / math.factorial(2 * t + 1)
    return Interval(0.0, _upper(a)), Interval(0.0, _upper(b))


def _exact_float(value: Any) -> Fraction:
    return Fraction(float(value))


def _pair_bound(
    host: dict[str, Any], base: str, slot: int, domain: tuple[Fraction, Fraction], q: int
) -> float:
    v, d = _exact_float(host["directions"][slot]), _exact_float(host["direction_bias"][slot])
    eta = max(abs(v * domain[0] + d), abs(v * domain[1] + d))
    rho = max(_exact_float(host["rho"][slot]), Fraction(0))
    return pair_derivative_error(
        rho,
        eta,
        _exact_float(host["weights"][slot]),
        _exact_float(host["odd_moments"][slot]),
        weight=_exact_float(host["scales"][slot]),
        direction=v,
        spatial_order=q,
        activation=base,
    ).hi


def _cluster_bound(
    host: dict[str, Any], base: str, slots: tuple[int, ...], proposal: TransitionProposal, q: int
) -> float:
    orders = [u.value for u in proposal.updates if u.name == "orders" and u.index == slots[0]]
    if len(orders) != 1:
        raise ValueError("a cluster_to_moments proposal must set the first slot's order")
    scale = _exact_float(host["scales"][slots[0]])
    centers = [_exact_float(host["centers"][i]) for i in slots]
    mean = sum(centers, Fraction(0)) / len(centers)
    init = initialize_moments(
        [-scale * c for c in centers],
        [_exact_float(host["weights"][i]) for i in slots],
        order=int(orders[0]),  # type: ignore[arg-type]
        center=-scale * mean,
    )
    truncation = Fraction(cluster_remainder(init, base, q, scale).hi)
    # The stored centre is float(mean), not the exact mean the moments are taken about: the
    # argument shifts by δ = s·(float(mean) − mean), which moves each σ^(k+q) by ≤ D(k+q+1)·|δ|.
    shift = abs(scale * (Fraction(float(mean)) - mean))
    moved = sum(
        (abs(Fraction(m)) * derivative_bound(base, k + q + 1) for k, m in enumerate(init.moments)),
        Fraction(0),
    )
    return _upper(truncation + abs(scale) ** q * moved * shift)


def within_error_budget(
    domain: tuple[float, float], *, spatial_orders: Sequence[int] = (0,)
) -> Callable[[Any, TransitionProposal], bool]:
    """An `acceptance(bank, proposal)` callback that accepts only provably small changes.

    It first checks that the proposal's updates are exactly the ones its kind's rule gives for
    `bank` (the check `commit_transition` makes), so a relabelled or edited proposal raises
    instead of borrowing another kind's bound. It then computes a rigorous bound for the kind
    over `x ∈ domain` and each requested derivative order, and accepts when every bound is
    `≤ proposal.error_budget`:

    - exact kinds (`EXACT_KINDS`: pair, duplicate merge, remove-zero, birth) have bound 0, so
      they pass even at budget 0;
    - `"pair_to_derivative"` uses `pair_derivative_error` with `|η| ≤ max |v x + d|`;
    - `"cluster_to_moments"` uses `cluster_remainder` plus the rounding of the stored centre.

    **Arguments:**

    - `domain`: finite `(lo, hi)` with `lo ≤ hi`, the inputs the bank must stay accurate on.
    - `spatial_orders`: derivative orders in `x` to control (default `(0,)`: values only).

    Raises `ValueError` (from the callback) for a kind without a known bound, and for a
    proposal whose updates are not its kind's ("tampered or inconsistent").
    """
    try:
        lo, hi = (float(domain[0]), float(domain[1]))
        if len(domain) != 2:
            raise ValueError
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"domain must be a pair of numbers (lo, hi), got {domain!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"domain must be finite with lo <= hi, got {domain!r}")
    orders = tuple(int(q) for q in spatial_orders)
    if not orders or any(q < 0 for q in orders):
        raise ValueError(f"spatial_orders must be non-empty and >= 0, got {spatial_orders!r}")
    exact_domain = (Fraction(lo), Fraction(hi))

    def acceptance(bank: Any, proposal: TransitionProposal) -> bool:
        view = HostView.read(bank)  # inside a commit: the commit's view, no second read
        host = view.host
        slots = view.positions(proposal.slot_ids)
        check_implied_updates(view, proposal, slots)
        if proposal.kind in EXACT_KINDS:
            return True
        if proposal.kind == TransitionKind.PAIR_TO_DERIVATIVE:
            bounds = [_pair_bound(host, bank.base, slots[0], exact_domain, q) for q in orders]
        elif proposal.kind == TransitionKind.CLUSTER_TO_MOMENTS:
            bounds = [_cluster_bound(host, bank.base, slots, proposal, q) for q in orders]
        else:
            raise ValueError(f"no error bound is known for proposal kind {proposal.kind!r}")
        return max(bounds) <= proposal.error_budget

    return acceptance
