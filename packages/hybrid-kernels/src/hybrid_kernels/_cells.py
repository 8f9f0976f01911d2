"""Which cells count at a length fraction: the one rule kernels, reductions and penalties share.

A row of union length `L` is scored on its first `max(ceil(L * fraction), 1)` time rows. The
prefix is by row index, not by time value, and is taken per row, so a row padded to a longer
bucket scores exactly the cells it would score unpadded. The clamp at 1 keeps a tiny fraction
from silently scoring nothing.

The same function runs inside a jitted kernel (traced arrays) and on the host (NumPy arrays
between steps): host code that decides shapes or denominators agrees with the kernels cell
for cell because it calls this same arithmetic, not a copy of it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from hybrid_kernels._dtypes import default_float


def length_cutoff(lengths: Any, fraction: Any) -> Int[Array, ...]:
    """`max(ceil(length * fraction), 1)` as int32, computed in jax's default float dtype.

    Under x64 this is float64 arithmetic (the peer always rounded through float32, which moves
    the cutoff of long series). Host code that must agree with the kernels (penalty points,
    reduction denominators) should call this same function.

    **Arguments:**

    - `lengths`: union lengths, a scalar or an array (e.g. `bp.row_lengths`).
    - `fraction`: the length-mask fraction in (0, 1].

    **Returns:** the cutoffs, int32, the shape of `lengths`.
    """
    dt = default_float()
    raw = jnp.ceil(jnp.asarray(lengths).astype(dt) * jnp.asarray(fraction, dtype=dt))
    return jnp.maximum(raw.astype(jnp.int32), 1)


def scored(time_index: Any, row_length: Any, fraction: Any) -> Bool[Array, ...]:
    """Whether the cell at union-row `time_index` of a row of length `row_length` is scored.

    **Arguments** (broadcast against each other):

    - `time_index`: the cell's index on its row's union time axis.
    - `row_length`: the row's own union length (`bp.row_lengths`), before time padding.
    - `fraction`: the length-mask fraction in (0, 1], traced or concrete.

    **Returns:** a boolean array of the broadcast shape.
    """
    return jnp.asarray(time_index).astype(jnp.int32) < length_cutoff(row_length, fraction)


def scored_rows(row_lengths: Int[Any, " N"], T: int, fraction: Any) -> Bool[Array, "N T"]:
    """[`scored`][] over a whole bucket's `[N, T]` time grid."""
    return scored(jnp.arange(T)[None, :], jnp.asarray(row_lengths)[:, None], fraction)
