"""Experiment ids as text: one rule for the table readers and the splits.

Experiments are named by a `str` id. Tables often number them instead (`ID` 1, 2, 3 in a
NONMEM file), and pandas may read that column as integers, as floats (`1.0`, when a cell
elsewhere is empty) or as text. Each id goes through `id_text`, so `1`, `1.0`, `np.int64(1)`
and `"1"` all name the experiment `"1"`, in every reader and in
[`hybrid_kernels.split_dataset_by_ids`][].
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def id_text(value: Any, where: str) -> str:
    """The id `value` as text: a whole number without its `.0`, a string as it is.

    Raises `TypeError` starting with `where` for a bool or anything not a str or a real
    number, and `ValueError` for a non-finite or fractional number (`1.5` is no id).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: an experiment id must be a str or an integer, got {value!r}.")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    if not math.isfinite(number) or number != int(number):
        raise ValueError(
            f"{where}: experiment id {value!r} is not a whole number; ids are integers or text."
        )
    return str(int(number))


def id_column(cells: Any, where: str) -> Any:
    """A pandas column of ids as text (`id_text` on each cell; text columns as they are)."""
    if cells.dtype.kind in "iu":
        return cells.astype(str)
    if cells.dtype.kind == "O" and all(isinstance(c, str) for c in cells):
        return cells.astype(str)  # the common case, without a Python call per cell
    return cells.map(lambda c: id_text(c, where)).astype(str)
