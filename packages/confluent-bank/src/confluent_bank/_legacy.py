"""The legacy ordinary-only bank and its migration into `ConfluentPackBank`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from confluent_bank._activations import get_activation
from confluent_bank._bank import ConfluentPackBank, init_confluent_bank
from confluent_bank._records import RefinedPack
from confluent_bank._sizes import check_bank_size


@dataclasses.dataclass
class AdaptivePackBank:
    """The legacy bank: ordinary atoms only, metadata read on the host (not jittable).

    **Fields:** `centers`, `weights`, `scales` (`(P,)` float), `orders`, `ages` (`(P,)` int32),
    `active` (`(P,)` bool), `max_order` (int), `base` (activation name).
    """

    centers: Array
    weights: Array
    scales: Array
    orders: Array
    ages: Array
    active: Array
    max_order: int
    base: str

    @property
    def max_packs(self) -> int:
        """The capacity `P`."""
        return int(self.centers.shape[0])


def init_pack_bank(
    packs: Sequence[RefinedPack],
    *,
    max_packs: int = 16,
    max_order: int = 8,
    base: str = "exp",
) -> AdaptivePackBank:
    """A legacy bank with `packs` in the first slots.

    **Arguments:**

    - `packs`: `RefinedPack` records.
    - `max_packs`: capacity `≥ 1`.
    - `max_order`: highest order.
    - `base`: activation name (legacy default `"exp"`, which cannot be migrated).

    Raises `ValueError` for a capacity below 1, a negative order, too many packs, a pack
    order above `max_order`, or a bank that would not fit in this machine's physical memory
    (the message states the bytes it would need; checked before anything is allocated).
    """
    if max_packs < 1:
        raise ValueError(f"max_packs must be >= 1, got {max_packs}")
    if max_order < 0:
        raise ValueError(f"max_order must be >= 0, got {max_order}")
    live = tuple(packs)
    if len(live) > max_packs:
        raise ValueError(f"{len(live)} packs exceed the capacity max_packs={max_packs}")
    if any(pack.order > max_order for pack in live):
        raise ValueError(f"a pack order exceeds max_order={max_order}")
    get_activation(base)  # unknown names fail here, not at the first forward
    check_bank_size(
        f"init_pack_bank(max_packs={max_packs}, max_order={max_order})",
        [(3 * max_packs, np.float64), (2 * max_packs, np.int32), (max_packs, np.bool_)],
    )
    centers, weights, scales = np.zeros(max_packs), np.zeros(max_packs), np.ones(max_packs)
    orders = np.zeros(max_packs, dtype=np.int32)
    ages = np.zeros(max_packs, dtype=np.int32)
    active = np.zeros(max_packs, dtype=bool)
    for i, pack in enumerate(live):
        centers[i], weights[i], scales[i] = pack.center, pack.weight, pack.scale
        orders[i], ages[i], active[i] = pack.order, pack.age, True
    float_dtype = jnp.asarray(0.0).dtype
    return AdaptivePackBank(
        jnp.asarray(centers, dtype=float_dtype),
        jnp.asarray(weights, dtype=float_dtype),
        jnp.asarray(scales, dtype=float_dtype),
        jnp.asarray(orders, dtype=jnp.int32),
        jnp.asarray(ages, dtype=jnp.int32),
        jnp.asarray(active),
        int(max_order),
        base,
    )


def legacy_forward(bank: AdaptivePackBank, x: Array) -> Array:
    """The legacy forward `Σ_active w · s^n · σ^(n)(s(x − c))`, looping over slots on the host.

    `x` is flattened to 1-D (a scalar becomes `(1,)`, a trailing singleton dimension is dropped
    and restored); other 2-D shapes are rejected.
    """
    x = jnp.asarray(x)
    restore: tuple[int, ...] | None = None
    if x.ndim == 0:
        flat = x.reshape(1)
    elif x.ndim == 1:
        flat = x
    elif x.ndim == 2 and x.shape[1] == 1:
        flat, restore = x[:, 0], x.shape
    else:
        raise ValueError(f"legacy_forward expects a 1-D input or shape (n, 1), got {x.shape}")
    spec = get_activation(bank.base)
    host: Any = jax.device_get((bank.centers, bank.weights, bank.scales, bank.orders, bank.active))
    _, _, _, orders, active = host
    out = jnp.zeros_like(flat, dtype=jnp.result_type(flat, bank.weights))
    for i in range(bank.max_packs):
        if not active[i]:
            continue
        n = int(orders[i])
        scale = bank.scales[i]
        derivative = spec.fastpath(scale * (flat - bank.centers[i]), n)  # type: ignore[misc]
        out = out + bank.weights[i] * scale**n * derivative
    return out.reshape(restore) if restore is not None else out


def migrate_legacy(bank: AdaptivePackBank) -> ConfluentPackBank:
    """A `ConfluentPackBank` with the legacy slots as ordinary atoms (same forward values).

    The legacy arrays are kept unchanged, including their int32 metadata; every other block takes
    its empty-slot value. A legacy base other than sigmoid/tanh (e.g. the default `"exp"`) is
    rejected with `ValueError`.
    """
    fresh = init_confluent_bank(
        (),
        max_packs=bank.max_packs,
        max_order=bank.max_order,
        base=bank.base,
        dtype=bank.centers.dtype,
    )
    return dataclasses.replace(
        fresh,
        centers=bank.centers,
        weights=bank.weights,
        scales=bank.scales,
        orders=bank.orders,
        ages=bank.ages,
        active=bank.active,
    )
