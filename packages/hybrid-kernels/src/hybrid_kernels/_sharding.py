"""Several devices: the experiment axis `N` of each bucket, sharded across a mesh.

The rows of a bucket are independent solves, so the `N` axis is embarrassingly parallel.
[`hybrid_kernels.make_dataset`][] pads each bucket's rows to a multiple of the device count
(padding rows are masked and weigh 0) and places every `[N, ...]` array with a
`NamedSharding(mesh, P("rows"))`. Parameters stay replicated: jit follows the input shardings,
and the gradient's sum over rows becomes an all-reduce inside the compiled kernel. Nothing in
the kernels changes.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

ROW_AXIS = "rows"


def make_row_mesh(devices: Any = None) -> Mesh:
    """A one-axis mesh named `"rows"` over `devices` (default: every visible device)."""
    devs = np.asarray(jax.devices() if devices is None else list(devices))
    return Mesh(devs.reshape(-1), (ROW_AXIS,))


def resolve_mesh(mesh: Mesh | None) -> Mesh | None:
    """The mesh a dataset uses: the given one, all devices when several are visible, or None."""
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
        if mesh.devices.ndim != 1:
            raise ValueError(
                f"`mesh` must have exactly one axis (the experiment axis), got axes "
                f"{mesh.axis_names}."
            )
        return mesh
    if jax.device_count() > 1:
        return make_row_mesh()
    return None


def row_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of a bucket's `[N, ...]` arrays: axis 0 split over the mesh's one axis."""
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))


def place_bucket(bp: Any, mesh: Mesh | None) -> Any:
    """Put a bucket's row-indexed arrays on `mesh` (rows split) and its scalars replicated."""
    if mesh is None:
        return bp
    rows = row_sharding(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x):
        return jax.device_put(x, rows if x.ndim >= 1 else replicated)

    return jax.tree.map(put, bp)
