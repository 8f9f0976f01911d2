"""How much memory a bank needs, checked before anything is allocated.

A bank is preallocated: `max_packs` and `max_order` fix the size of every block. A capacity
typed with one digit too many would otherwise end in numpy's `MemoryError` (or in the kernel
killing the process once the pages are touched) with nothing said about which argument asked
for it. The limit is the machine's physical memory, where the operating system reports it: a
bank larger than that cannot be built on the host, let alone used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or `None` where it cannot be read."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # e.g. Windows has no sysconf
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return int(pages) * int(page_size)


def _readable(size: int) -> str:
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}"


def check_bank_size(call: str, blocks: Sequence[tuple[int, np.dtype]]) -> None:
    """Refuse a bank whose blocks would not fit in physical memory, before allocating them.

    **Arguments:**

    - `call`: the user's call with its size arguments, e.g.
      `"init_confluent_bank(max_packs=1000000000000, max_order=8)"`, for the message.
    - `blocks`: `(number of elements, dtype)` for each block the bank allocates.

    **Raises:** `ValueError` stating the elements and bytes the bank would need and the
    memory this machine has.
    """
    elements = sum(count for count, _ in blocks)
    size = sum(count * np.dtype(dtype).itemsize for count, dtype in blocks)
    memory = physical_memory()
    if memory is not None and size > memory:
        raise ValueError(
            f"{call} would need {elements} values, {size} bytes ({_readable(size)}), more "
            f"than this machine's physical memory of {memory} bytes ({_readable(memory)}); "
            "reduce max_packs or max_order"
        )


def check_confluent_bank_size(
    max_packs: int, max_order: int, float_dtype: Any, int_dtype: Any
) -> None:
    """Refuse an `init_confluent_bank` whose slot ids overflow `int_dtype` or whose blocks
    would not fit in physical memory (see `check_bank_size`)."""
    call = f"init_confluent_bank(max_packs={max_packs}, max_order={max_order})"
    if max_packs - 1 > np.iinfo(int_dtype).max:
        raise ValueError(
            f"{call}: the slot ids 0..{max_packs - 1} do not fit the metadata integer "
            f"{np.dtype(int_dtype)} (at most {np.iinfo(int_dtype).max})"
        )
    check_bank_size(
        call,
        [
            # seven per-slot trainable blocks and the moment rows
            (max_packs * 7 + max_packs * (max_order + 1), float_dtype),
            (4 * max_packs + 1, int_dtype),  # orders, ages, modes, slot_ids; the version
            (max_packs, np.bool_),
        ],
    )
