"""Reading `.npy` data that a file claims to hold, checked before anything is allocated.

A damaged or crafted file may declare any shape in an array's header, for example
`(10**10,)`; reading it as NumPy does would try to allocate that much memory first. Both
loaders (`load_predictors`, `load_training_state`) instead read the header alone, compare it
with what the template expects, and only then read the data.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _same_dtype(got: np.dtype, want: np.dtype) -> bool:
    # .npy stores extension dtypes (bfloat16, float8) as raw void bytes of the same size.
    return got == want or (got.kind == want.kind == "V" and got.itemsize == want.itemsize)


def check_npy_header(
    stream: Any, *, shape: tuple[int, ...] | None, dtype: np.dtype | None, what: str
) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Read the `.npy` header at the position of `stream` and check it.

    **Arguments:**

    - `stream`: a binary file object positioned at the start of a `.npy` record; it is left
      just after the header.
    - `shape`: the shape the caller expects, or `None` to accept any shape whose data is
      present in full.
    - `dtype`: the dtype the caller expects, or `None` to accept any non-object dtype.
    - `what`: how the array is named in error messages.

    **Returns:** the stored shape and dtype, and whether the data is in Fortran order.

    Raises `ValueError` naming `what` when the header is unreadable, holds Python objects,
    or declares another shape or dtype; also when fewer data bytes follow than it declares.
    """
    try:
        version = np.lib.format.read_magic(stream)
        stored_shape, fortran, stored = _READERS[version](stream)
    except (ValueError, KeyError, EOFError, SyntaxError, TypeError) as err:
        raise ValueError(f"{what} has no readable array header") from err
    if stored.hasobject:
        raise ValueError(f"{what} holds Python objects, which are never loaded")
    stored_shape = tuple(stored_shape)
    if shape is not None and stored_shape != tuple(shape):
        raise ValueError(f"{what} is stored with shape {stored_shape}; expected {tuple(shape)}")
    if dtype is not None and not _same_dtype(stored, np.dtype(dtype)):
        raise ValueError(f"{what} is stored with dtype {stored}; expected {np.dtype(dtype)}")
    start = stream.tell()
    available = stream.seek(0, io.SEEK_END) - start
    stream.seek(start)
    needed = math.prod(stored_shape) * stored.itemsize
    if available < needed:
        raise ValueError(f"{what} is truncated: {available} of {needed} data bytes are present")
    return stored_shape, stored, fortran


def read_npy(
    raw: bytes, *, shape: tuple[int, ...] | None, dtype: np.dtype | None, what: str
) -> np.ndarray:
    """The array in the complete `.npy` record `raw`, checked by `check_npy_header`.

    Also refuses data beyond the declared size. The result views `raw` (no copy) and has
    dtype `dtype` (the stored dtype when `dtype` is `None`).
    """
    stream = io.BytesIO(raw)
    shape, stored, fortran = check_npy_header(stream, shape=shape, dtype=dtype, what=what)
    offset = stream.tell()
    count = math.prod(shape)
    if len(raw) - offset != count * stored.itemsize:
        raise ValueError(f"{what} holds more data than its shape {shape} needs")
    data = np.frombuffer(raw, dtype=stored, count=count, offset=offset)
    data = data.reshape(shape, order="F" if fortran else "C")
    return data if dtype is None or stored == np.dtype(dtype) else data.view(dtype)
