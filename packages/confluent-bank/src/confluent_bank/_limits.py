"""What a bank of a given dtype can hold, checked before `init_confluent_bank` allocates it:
the tower order its Riccati coefficients allow, pack values the dtype can store, and the pair
capacity."""

from __future__ import annotations

from typing import Any

import numpy as np

from confluent_bank._activations import _finite_tower_order
from confluent_bank._records import RefinedPack, as_index

DERIVATIVE_HEADROOM = 4  # nested derivatives of the forward that stay within the tower limit
SPEC_TOWER_HEIGHT = 11  # the spec's centred-pair series reads rows 0..2T−1 with T = 6


def pair_capacity(max_pairs: Any, max_packs: int) -> int | None:
    """`max_pairs` validated against the capacity: `None`, or an int in `0..max_packs`."""
    if max_pairs is None:
        return None
    max_pairs = as_index(max_pairs, "max_pairs", "an integer or None")
    if not 0 <= max_pairs <= max_packs:
        raise ValueError(
            f"max_pairs must be in 0..max_packs={max_packs} (or None for any number of pairs), "
            f"got {max_pairs}"
        )
    return max_pairs


def check_tower_order(max_order: int, base: str, dtype: Any) -> None:
    # The forward reads rows up to max(N, 1) and each nested derivative asks for one more. The
    # floor stays at the spec's pair-series height (rows 0..11), so the dtypes a bank accepts
    # are what they were when the pair read those rows (float16 stays refused).
    needed = max(max_order, SPEC_TOWER_HEIGHT) + DERIVATIVE_HEADROOM
    limit = _finite_tower_order(base, dtype)
    finite = f"the Riccati coefficients are finite in {dtype} only up to order {limit}"
    if needed <= limit:
        return
    if limit - DERIVATIVE_HEADROOM < SPEC_TOWER_HEIGHT:
        raise ValueError(
            f"a {base} bank cannot use dtype {dtype}: a bank needs finite tower rows up to order "
            f"{needed} (the spec's pair-series height {SPEC_TOWER_HEIGHT} and "
            f"{DERIVATIVE_HEADROOM} nested derivatives), but {finite}"
        )
    raise ValueError(
        f"max_order={max_order} is too high for a {base} bank in {dtype}: the forward and "
        f"{DERIVATIVE_HEADROOM} nested derivatives need tower rows up to order {needed}, but "
        f"{finite} (max_order <= {limit - DERIVATIVE_HEADROOM})"
    )


def cast_pack(pack: RefinedPack, slot: int, dtype: Any) -> tuple[Any, Any, Any]:
    """The pack's centre, weight and scale in `dtype`; refuses values the cast makes non-finite
    (or a zero scale), naming the slot and the field."""
    values = []
    for field in ("center", "weight", "scale"):
        given = getattr(pack, field)
        with np.errstate(over="ignore", under="ignore"):
            value = np.asarray(given).astype(dtype)
        if not np.isfinite(value):
            raise ValueError(
                f"slot {slot}: packs[{slot}].{field} = {given!r} overflows to {value} in {dtype}"
            )
        if field == "scale" and value == 0:
            raise ValueError(
                f"slot {slot}: packs[{slot}].scale = {given!r} rounds to 0 in {dtype}; scales "
                "must be non-zero"
            )
        values.append(value)
    return values[0], values[1], values[2]


def cast_age(pack: RefinedPack, slot: int, dtype: Any) -> int:
    if pack.age > np.iinfo(dtype).max:
        raise ValueError(
            f"slot {slot}: packs[{slot}].age = {pack.age} does not fit in {np.dtype(dtype)} "
            f"(at most {np.iinfo(dtype).max})"
        )
    return pack.age
