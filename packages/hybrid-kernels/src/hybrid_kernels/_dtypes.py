"""The dtype policy: one storage dtype per dataset, and a once-only mixed-precision warning."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_WARNED: set[tuple[str, ...]] = set()


def default_float() -> np.dtype:
    """jax's default float dtype: float64 exactly when `jax_enable_x64` is on."""
    return np.dtype(jnp.result_type(float))


def resolve_dtype(dtype: Any, where: str) -> np.dtype:
    """Validate a user `dtype` option; `None` means jax's default float dtype."""
    if dtype is None:
        return default_float()
    try:
        out = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"{where}: `dtype` must be a float dtype, got {dtype!r}.") from e
    if out not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{where}: `dtype` must be float32 or float64, got {out}.")
    if out == np.float64 and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            f"{where}: `dtype=float64` needs `jax.config.update('jax_enable_x64', True)` first; "
            "without it jax would silently store float32."
        )
    return out


def warn_mixed_dtypes(named_dtypes: dict[str, set[np.dtype]], where: str) -> None:
    """Warn once per distinct combination when the float dtypes of the inputs disagree."""
    found = sorted({np.dtype(d).name for ds in named_dtypes.values() for d in ds})
    if len(found) <= 1:
        return
    key = (where, *found)
    if key in _WARNED:
        return
    _WARNED.add(key)
    detail = ", ".join(
        f"{name}: {'/'.join(sorted(np.dtype(d).name for d in ds))}"
        for name, ds in named_dtypes.items()
        if ds
    )
    warnings.warn(
        f"{where}: mixed float dtypes ({detail}); arithmetic will promote to the widest. "
        "Pass one `dtype` to make_dataset and build y0 and the predictors in it.",
        UserWarning,
        stacklevel=4,
    )
