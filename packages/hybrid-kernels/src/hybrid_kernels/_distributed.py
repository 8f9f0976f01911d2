"""Process-local data: each JAX process loads only its own experiments.

With `make_dataset(..., process_local=True)` in a run of several processes (joined by
`jax.distributed.initialize`), every process passes a different, disjoint list. The
processes then agree on everything that shapes a compiled kernel:

- the time-axis lengths of all experiments are gathered, and the bucket bins are chosen
  from the global set, exactly as one process holding every experiment would choose them;
- in each bucket every process contributes the same number of rows `R` (its own rows, then
  masked padding rows of weight 0), a multiple of its local device count;
- each `[N, ...]` field becomes one global array of `N = R * process_count()` rows with
  `jax.make_array_from_process_local_data`, split over the row mesh; `n_obs` is the global
  count of observed cells, replicated.

`Dataset.exp_ids` names the global rows (process by process, in mesh order), so metrics,
failed-row reports and predictions name experiments globally. `Dataset.experiments` keeps
only this process's experiments. The host-side readers (`compute_metrics`,
`predictions_table`, `failed_exp_ids`) read such arrays through `to_host`, which gathers
what this process does not hold, so every process gets the same, global result.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hybrid_kernels._bucketing import choose_bins, stack_bucket
from hybrid_kernels._jumps import jump_slots
from hybrid_kernels._sharding import row_sharding


def to_host(x: Any) -> np.ndarray:
    """`x` as a NumPy array holding all its rows, on every process.

    An array spread over several processes' devices (not fully addressable) is gathered with
    `process_allgather`, a collective every process must join; its rows keep their global
    order, the order of `Dataset.exp_ids`. Anything else is read as it is.
    """
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def held_whole(dataset: Any) -> Any:
    """`dataset` with every bucket held whole by this process, on its default device.

    A bucket whose rows are spread over several processes' devices is gathered (a collective:
    every process must call this); a dataset this process already holds whole is returned as
    it is. For the host-side readers that walk rows one by one (`predict_dense`, `plot_fit`).
    """
    leaves = jax.tree.leaves(dataset.bucket_payloads)
    if all(getattr(x, "is_fully_addressable", True) for x in leaves):
        return dataset
    payloads = tuple(
        jax.tree.map(lambda x: jnp.asarray(to_host(x)), bp) for bp in dataset.bucket_payloads
    )
    return dataclasses.replace(dataset, bucket_payloads=payloads)


def _gather_ints(values: np.ndarray) -> list[np.ndarray]:
    """Every process's 1-D int array (lengths may differ), indexed by process."""
    values = np.asarray(values, np.int64)
    counts = multihost_utils.process_allgather(np.asarray([values.size], np.int64))
    width = int(counts.max())
    padded = np.full((width,), -1, np.int64)
    padded[: values.size] = values
    gathered = multihost_utils.process_allgather(padded)
    return [gathered[p, : int(counts[p, 0])] for p in range(gathered.shape[0])]


def _gather_strings(names: tuple[str, ...]) -> list[list[str]]:
    """Every process's list of names, indexed by process."""
    encoded = [n.encode("utf-8") for n in names]
    width = multihost_utils.process_allgather(
        np.asarray([max((len(e) for e in encoded), default=0)], np.int64)
    )
    width = max(int(width.max()), 1)
    table = np.zeros((len(encoded), width), np.int64)
    for i, e in enumerate(encoded):
        table[i, : len(e)] = np.frombuffer(e, np.uint8)
    flat = _gather_ints(table.reshape(-1))
    return [
        [bytes(row[row > 0].astype(np.uint8)).decode("utf-8") for row in f.reshape(-1, width)]
        for f in flat
    ]


def _process_order(mesh: Mesh) -> list[int]:
    """The processes in the order their rows take along the mesh's one axis."""
    owners = [d.process_index for d in mesh.devices.flat]
    order = list(dict.fromkeys(owners))
    blocks = [owners.count(p) for p in order]
    contiguous = owners == [p for p, k in zip(order, blocks, strict=True) for _ in range(k)]
    if not contiguous or len(set(blocks)) != 1 or len(order) != jax.process_count():
        raise ValueError(
            "make_dataset(process_local=True): `mesh` must hold the same number of devices of "
            "every process, each process's devices next to each other along its axis; got "
            f"the process indices {owners}."
        )
    return order


def _check_global_ids(ids: list[list[str]]) -> None:
    seen: dict[str, int] = {}
    for p, names in enumerate(ids):
        for name in names:
            if name in seen:
                raise ValueError(
                    f"make_dataset(process_local=True): exp_id {name!r} is given by process "
                    f"{seen[name]} and by process {p}; every experiment must be loaded by "
                    "exactly one process."
                )
            seen[name] = p


def _empty_rows(experiments, scattered, bin_len: int, rows: int, dtype: np.dtype, slots=None):
    """`rows` padding rows for a bucket where this process has no experiment of its own."""
    fits = [i for i, s in enumerate(scattered) if s[0].shape[0] <= bin_len]
    if not fits:
        raise ValueError(
            f"make_dataset(process_local=True): process {jax.process_index()} has no "
            f"experiment of at most {bin_len} times to pad its share of that bucket with; "
            "give every process at least one short experiment."
        )
    i = fits[0]
    fields, _ = stack_bucket([experiments[i]], [scattered[i]], bin_len, rows, dtype, slots)
    fields["row_weights"] = np.zeros_like(fields["row_weights"])
    fields["mask"] = np.zeros_like(fields["mask"])
    fields["y_observed"] = np.zeros_like(fields["y_observed"])
    fields["n_obs"] = np.asarray(0, np.int32)
    return fields, ("",) * rows


def _global(fields: dict[str, Any], mesh: Mesh, n_global: int) -> dict[str, Any]:
    rows = row_sharding(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0:
            return jax.make_array_from_process_local_data(replicated, x)
        return jax.make_array_from_process_local_data(rows, x, (n_global, *x.shape[1:]))

    return jax.tree.map(put, fields)


def process_local_buckets(
    experiments: tuple[Any, ...],
    scattered: list[tuple[np.ndarray, ...]],
    bucket_policy: str,
    max_shapes: int | None,
    planned_steps: int | None,
    mesh: Mesh,
    dtype: np.dtype,
) -> tuple[list[dict[str, Any]], list[tuple[str, ...]]]:
    """The fields of every global bucket (ascending `T`) and their global row ids.

    `experiments` and `scattered` are this process's own; `mesh` spans every process's
    devices. Each returned field dict holds global `jax.Array`s, ready for `BucketPayload`.
    """
    order = _process_order(mesh)
    n_local_devices = mesh.devices.size // len(order)
    me = jax.process_index()
    local_lengths = np.asarray([s[0].shape[0] for s in scattered])
    lengths = _gather_ints(local_lengths)
    ids = _gather_strings(tuple(e.exp_id for e in experiments))
    _check_global_ids(ids)
    bins_all = choose_bins(np.concatenate(lengths), bucket_policy, max_shapes, planned_steps)
    offsets = np.cumsum([0, *(len(x) for x in lengths)])
    bins = [bins_all[offsets[p] : offsets[p + 1]] for p in range(len(lengths))]

    buckets, bucket_ids = [], []
    for bin_len in sorted(set(bins_all.tolist())):
        counts = [int(np.sum(b == bin_len)) for b in bins]
        rows = math.ceil(max(counts) / n_local_devices) * n_local_devices
        mine = [i for i in range(len(experiments)) if bins[me][i] == bin_len]
        slots = _jump_slots([len(getattr(experiments[i], "jumps", ())) for i in mine])
        if mine:
            fields, _ = stack_bucket(
                [experiments[i] for i in mine],
                [scattered[i] for i in mine],
                bin_len,
                rows,
                dtype,
                slots,
            )
        else:
            fields, _ = _empty_rows(experiments, scattered, bin_len, rows, dtype, slots)
        total_obs = multihost_utils.process_allgather(np.asarray(fields["n_obs"], np.int64))
        fields["n_obs"] = np.asarray(int(np.sum(total_obs)), np.int32)
        _check_trailing_shapes(fields, bin_len)
        buckets.append(_global(fields, mesh, rows * len(order)))
        bucket_ids.append(
            tuple(
                name
                for p in order
                for name in [
                    *(ids[p][i] for i in np.flatnonzero(bins[p] == bin_len)),
                    *([""] * (rows - counts[p])),
                ]
            )
        )
    return buckets, bucket_ids


def _jump_slots(local_counts: list[int]) -> int | None:
    """One padded state-jump count for a bucket on every process (`None`: no jumps anywhere)."""
    most = max(
        (int(np.max(g)) for g in _gather_ints(np.asarray(local_counts, np.int64)) if len(g)),
        default=0,
    )
    return jump_slots(most) if most else None


def _check_trailing_shapes(fields: dict[str, Any], bin_len: int) -> None:
    """Every process must build the same shapes (inputs tables and switch counts may not)."""
    leaves, _ = jax.tree.flatten_with_path(fields)
    shapes = np.asarray([d for _, x in leaves for d in (np.ndim(x), *np.shape(x)[1:])], np.int64)
    gathered = _gather_ints(shapes)
    if any(len(g) != len(shapes) or np.any(g != gathered[0]) for g in gathered):
        raise ValueError(
            f"make_dataset(process_local=True): the processes built different shapes for the "
            f"bucket of {bin_len} times (their inputs tables or switch counts differ); give "
            "every process experiments whose inputs have the same number of entries."
        )
