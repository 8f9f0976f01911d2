"""The bucketed dataset the kernels consume.

Data flows one way: [`hybrid_kernels.make_dataset`][] scatters each experiment
(`hybrid_kernels._experiments`) onto its own union time axis and stacks experiments into
[`hybrid_kernels.BucketPayload`][] buckets of equal shape. Each bucket shape is one compiled
kernel, so the bucket policy (see `hybrid_kernels._bucketing`) is what bounds the compile count.
Subsets (`hybrid_kernels._splits`) are re-bucketed from the source experiments with the
options the dataset was built with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from hybrid_kernels._bucketing import (
    BUCKET_POLICIES,
    choose_bins,
    scatter,
    stack_bucket,
    validate_experiments,
)
from hybrid_kernels._distributed import to_host
from hybrid_kernels._dtypes import resolve_dtype
from hybrid_kernels._experiments import Experiment
from hybrid_kernels._jumps import JumpArrays
from hybrid_kernels._preflight import check_int


class _PayloadFields(NamedTuple):
    ts: Float[Array, "N T"]
    y_observed: Float[Array, "N T D"]
    yvar: Float[Array, "N T D"]
    mask: Bool[Array, "N T D"]
    covariates: dict[str, Array]
    y0: Float[Array, "N S"]
    n_obs: Int[Array, ""]
    row_weights: Float[Array, " N"] = None  # type: ignore[assignment]  # filled by __new__
    row_lengths: Int[Array, " N"] = None  # type: ignore[assignment]  # filled by __new__
    inputs: dict[str, tuple[Array, Array]] | None = None
    jump_ts: Float[Array, "N J"] | None = None
    jumps: JumpArrays | None = None


class BucketPayload(_PayloadFields):
    """One bucket: `N` experiments stacked on a shared union length `T`.

    Fields, in this order (the first seven are the seed's; the rest are ours):

    - `ts` `[N, T]`: each row's sorted union time axis. Rows padded by the bucket policy
        repeat their last time, so the solve is unchanged.
    - `y_observed` `[N, T, D]`: observations, 0 where not observed.
    - `yvar` `[N, T, D]`: observation variances, 1 where not observed.
    - `mask` `[N, T, D]` bool: True only where a real measurement exists.
    - `covariates`: name → `[N]` or `[N, K]`, keys sorted.
    - `y0` `[N, S]`: full initial states.
    - `n_obs` `[]` int32: `mask.sum()`.
    - `row_weights` `[N]`: 1 for real rows, 0 for padding rows. Optional: omitted (or
        `None`), every row is real, `ones(N)` in the dtype of `ts`.
    - `row_lengths` `[N]` int32: each row's own union length (before time padding). The
        length mask takes its prefix per row, so padding never changes which cells are scored.
        Optional: omitted (or `None`), it is read from `mask`: one past the last time row
        with any observed channel, or `T` for a row with none (so an unpadded row gets `T`).
    - `inputs`: name → `(ts [N, L], ys [N, L, ...])`, the knots of each row's input signal,
        padded to a bucket-wide `L` (see [`hybrid_kernels.InputTable`][]); `None` without inputs.
    - `jump_ts` `[N, J]`: each row's input switch times, padded with `+inf`; `None` without
        inputs.
    - `jumps`: each row's state jumps ([`hybrid_kernels.StateJump`][]) as arrays
        `(ts, state, add, scale)`, each `[N, M]`, sorted by time per row and padded with no-op
        jumps at `+inf` to `M`, the next power of two (at least 8) of the most jumps in a row,
        so nearby counts share one compiled shape; `None` when no row of the bucket has a jump.

    Every constructor ([`hybrid_kernels.make_dataset`][] and the dataset splits) fills
    `row_weights` and `row_lengths`; a payload written by hand with only the seed's seven
    fields gets the defaults above when it is built, so every consumer sees arrays.
    """

    __slots__ = ()

    def __new__(
        cls,
        ts: Any,
        y_observed: Any,
        yvar: Any,
        mask: Any,
        covariates: Any,
        y0: Any,
        n_obs: Any,
        row_weights: Any = None,
        row_lengths: Any = None,
        inputs: Any = None,
        jump_ts: Any = None,
        jumps: Any = None,
    ) -> BucketPayload:
        # Only real arrays get defaults: jax and equinox rebuild payloads with placeholders
        # (None after a partition, sentinels for vmap axes) that must stay as they are.
        if row_weights is None and _is_array(ts):
            row_weights = jnp.ones(jnp.shape(ts)[:1], jnp.result_type(ts))
        if row_lengths is None and _is_array(mask):
            row_lengths = _lengths_from_mask(mask)
        return super().__new__(
            cls,
            ts,
            y_observed,
            yvar,
            mask,
            covariates,
            y0,
            n_obs,
            row_weights,
            row_lengths,
            inputs,
            jump_ts,
            jumps,
        )


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def _lengths_from_mask(mask: Any) -> Int[Array, " N"]:
    """One past each row's last time row with an observed channel; `T` for a row with none."""
    observed = jnp.asarray(mask).any(axis=-1)  # [N, T]
    T = observed.shape[1]
    last = T - jnp.argmax(observed[:, ::-1], axis=1)
    return jnp.where(observed.any(axis=1), last, T).astype(jnp.int32)


class Dataset(eqx.Module):
    """The bucketed dataset: what the kernels loop over.

    - `bucket_payloads`: one [`hybrid_kernels.BucketPayload`][] per compiled shape, ascending `T`.
    - `output_channel_names`: channel order along `D`.
    - `covariate_names`: sorted covariate keys.
    - `exp_ids`: for each bucket, the `exp_id` of each row (`""` for padding rows).
    - `experiments`: the source experiments, so subsets can be re-bucketed.
    - `bucket_policy`, `max_shapes`, `dtype`, `mesh`, `planned_steps`: the options it was built
        with; subsets reuse them.
    - `process_local`: built by `make_dataset(process_local=True)` in a run of several
        processes: `experiments` are this process's own, `bucket_payloads` and `exp_ids` global.
    """

    bucket_payloads: tuple[BucketPayload, ...]
    output_channel_names: tuple[str, ...] = eqx.field(static=True)
    covariate_names: tuple[str, ...] = eqx.field(static=True)
    exp_ids: tuple[tuple[str, ...], ...] = eqx.field(static=True)
    experiments: tuple[Experiment, ...]
    bucket_policy: str = eqx.field(static=True, default="padded")
    max_shapes: int | None = eqx.field(static=True, default=None)
    dtype: str = eqx.field(static=True, default="float32")
    mesh: Any = eqx.field(static=True, default=None)
    planned_steps: int | None = eqx.field(static=True, default=None)
    process_local: bool = eqx.field(static=True, default=False)

    @property
    def n_experiments(self) -> int:
        """Number of real experiments (padding rows excluded)."""
        return len(self.experiments)


def make_dataset(
    experiments: Sequence[Experiment],
    *,
    output_channel_names: Sequence[str],
    bucket_policy: str = "padded",
    max_shapes: int | None = None,
    dtype: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    planned_steps: int | None = None,
    process_local: bool = False,
) -> Dataset:
    """Scatter experiments onto their union time axes and stack them into buckets.

    **Arguments:**

    - `experiments`: the experiments; all share one covariate key set and per-key shapes.
    - `output_channel_names`: the observed channels, in `D` order; every experiment must define
        each of them (extra channels are ignored).
    - `bucket_policy`: `"padded"` (default) pads each experiment's time axis up to one of at
        most `max_shapes` bin lengths, chosen to minimise padded cells, so the compile count is
        bounded whatever the data. `"exact"` groups experiments by exact union length (one
        compiled shape per distinct length, the peer's behaviour, no padding).
    - `max_shapes`: the most distinct bucket lengths the `"padded"` policy may produce. `None`
        (default) lets a cost model choose the number of shapes (at most 4): each shape costs
        one compile of a few seconds, each padded cell a little solve time in every one of
        `planned_steps` steps. Small datasets get one or two shapes. See the guide's "Buckets".
    - `planned_steps`: the training steps the dataset is built for, for that cost model
        (default `None`: 1000).
    - `dtype`: storage dtype of every float array (`"float32"`, `"float64"`, or `None` for
        jax's default float dtype, i.e. float64 exactly when `jax_enable_x64` is on).
    - `mesh`: a `jax.sharding.Mesh` to shard each bucket's experiment axis over. When `None`
        and more than one device is visible, all devices are used. Rows are then padded to a
        multiple of the device count (masked, weight 0). See the guide's "Several devices" section.
    - `process_local`: with several JAX processes, `experiments` are this process's own (each
        experiment given to exactly one process) rather than the same full list everywhere.
        Bucket shapes are then chosen from every process's lengths, each bucket is one global
        array over all processes' devices, and `exp_ids` name the global rows. Every process
        must call `make_dataset` together. See "Several processes and machines".

    **Returns:** a [`hybrid_kernels.Dataset`][]. Buckets come in ascending `T`; inside a bucket,
    rows keep the experiments' input order.
    """
    from hybrid_kernels._sharding import place_bucket, resolve_mesh

    if isinstance(experiments, Experiment) or not isinstance(experiments, Sequence):
        raise TypeError(
            "make_dataset: `experiments` must be a sequence of Experiment objects, "
            f"got {type(experiments).__name__}."
        )
    experiments = tuple(experiments)
    if isinstance(output_channel_names, str) or not isinstance(output_channel_names, Sequence):
        raise TypeError(
            "make_dataset: `output_channel_names` must be a sequence of channel names (str), "
            f"got {output_channel_names!r}."
        )
    names = tuple(output_channel_names)
    bad_names = [n for n in names if not isinstance(n, str)]
    if bad_names:
        raise TypeError(
            f"make_dataset: `output_channel_names` must hold str names, got {bad_names[0]!r}."
        )
    if bucket_policy not in BUCKET_POLICIES:
        raise ValueError(
            f"make_dataset: `bucket_policy` must be one of {sorted(BUCKET_POLICIES)}, "
            f"got {bucket_policy!r}."
        )
    if max_shapes is not None:
        check_int(max_shapes, "make_dataset: `max_shapes`")
    if planned_steps is not None:
        check_int(planned_steps, "make_dataset: `planned_steps`")
    if not isinstance(process_local, bool):
        raise TypeError(f"make_dataset: `process_local` must be a bool, got {process_local!r}.")
    np_dtype = resolve_dtype(dtype, "make_dataset")
    if not experiments:
        raise ValueError("make_dataset: `experiments` is empty; give at least one Experiment.")
    for exp in experiments:
        if not isinstance(exp, Experiment):
            raise TypeError(
                "make_dataset: `experiments` must hold Experiment objects (see make_experiment), "
                f"got {type(exp).__name__}."
            )
    validate_experiments(experiments, names)
    for exp in experiments:
        _check_fits_dtype(exp, names, np_dtype)
    _check_unique_ids(experiments)
    mesh = resolve_mesh(mesh)
    n_devices = 1 if mesh is None else mesh.devices.size

    scattered = [scatter(exp, names, np_dtype) for exp in experiments]
    lengths = np.array([s[0].shape[0] for s in scattered])
    bins = choose_bins(lengths, bucket_policy, max_shapes, planned_steps)

    payloads, ids = [], []
    process_local = process_local and jax.process_count() > 1
    # --- process-local data (several processes, each with its own experiments) ---
    if process_local:
        from hybrid_kernels._distributed import process_local_buckets

        fields, ids = process_local_buckets(
            experiments, scattered, bucket_policy, max_shapes, planned_steps, mesh, np_dtype
        )
        payloads = [BucketPayload(**f) for f in fields]
        bins = np.asarray([], int)  # global buckets are built; the loop below has no work
    # --- end of process-local data ---
    for bin_len in sorted(set(bins.tolist())):
        rows = [i for i in range(len(experiments)) if bins[i] == bin_len]
        fields, row_ids = stack_bucket(
            [experiments[i] for i in rows],
            [scattered[i] for i in rows],
            int(bin_len),
            n_devices,
            np_dtype,
        )
        bp = BucketPayload(**jax.tree.map(jnp.asarray, fields))
        payloads.append(place_bucket(bp, mesh))
        ids.append(row_ids)
    return Dataset(
        bucket_payloads=tuple(payloads),
        output_channel_names=names,
        covariate_names=tuple(sorted(experiments[0].covariates)),
        exp_ids=tuple(ids),
        experiments=experiments,
        bucket_policy=bucket_policy,
        max_shapes=max_shapes,
        dtype=np.dtype(np_dtype).name,
        mesh=mesh,
        planned_steps=planned_steps,
        process_local=process_local,
    )


def _check_fits_dtype(exp: Experiment, names: tuple[str, ...], dtype: np.dtype) -> None:
    """Refuse values that the storage `dtype` would turn into inf, or variances into 0."""
    info = np.finfo(dtype)

    def check(x: np.ndarray, field: str, positive: bool = False) -> None:
        if x.dtype.kind != "f" or x.size == 0:
            return
        big = np.abs(x) > info.max
        with np.errstate(over="ignore", under="ignore"):
            tiny = (x.astype(dtype) == 0) & (x != 0) if positive else np.zeros_like(big)
        if np.any(big) or np.any(tiny):
            bad = x[big | tiny].flat[0]
            becomes = "inf" if np.any(big) else "0"
            raise ValueError(
                f"make_dataset: experiment {exp.exp_id!r} {field} holds {bad!r}, which becomes "
                f"{becomes} in {np.dtype(dtype).name}; rescale it or pass dtype='float64'."
            )

    for name in names:
        ch = exp.channels[name]
        check(ch.ts, f"channel {name!r} `ts`")
        check(ch.values, f"channel {name!r} `values`")
        check(ch.variance, f"channel {name!r} `variance`", positive=True)
    for name, value in exp.covariates.items():
        check(value, f"covariate {name!r}")
    check(exp.y0, "`y0`")


def _check_unique_ids(experiments: Sequence[Experiment]) -> None:
    """Rows map back to experiments by id, so two experiments must never share one.

    The same experiment object may repeat (a bootstrap resample draws with replacement).
    """
    seen: dict[str, Experiment] = {}
    for exp in experiments:
        if exp.exp_id and seen.setdefault(exp.exp_id, exp) is not exp:
            raise ValueError(
                f"make_dataset: experiment id {exp.exp_id!r} (field `exp_id`) is used by two "
                "different experiments; ids must be unique."
            )


def describe_buckets(dataset: Dataset) -> str:
    """One line per bucket: index, `N` (real rows), `T`, `D` and the mask fill fraction."""
    lines = []
    for i, bp in enumerate(dataset.bucket_payloads):
        N, T, D = bp.mask.shape
        n_real = int(np.count_nonzero(bp.row_weights))
        fill = float(np.asarray(bp.mask).mean()) if bp.mask.size else 0.0
        lines.append(f"bucket {i}: N={N} ({n_real} real), T={T}, D={D}, mask fill {fill:.1%}")
    return "\n".join(lines)


def _rebucketed(dataset: Dataset, experiments: Sequence[Experiment]) -> Dataset:
    """A dataset over `experiments` built with `dataset`'s options (empty: no payloads)."""
    if experiments:
        return make_dataset(
            experiments,
            output_channel_names=dataset.output_channel_names,
            bucket_policy=dataset.bucket_policy,
            max_shapes=dataset.max_shapes,
            dtype=dataset.dtype,
            mesh=dataset.mesh,
            planned_steps=dataset.planned_steps,
        )
    return Dataset(
        bucket_payloads=(),
        output_channel_names=dataset.output_channel_names,
        covariate_names=dataset.covariate_names,
        exp_ids=(),
        experiments=(),
        bucket_policy=dataset.bucket_policy,
        max_shapes=dataset.max_shapes,
        dtype=dataset.dtype,
        mesh=dataset.mesh,
        planned_steps=dataset.planned_steps,
    )


def failed_exp_ids(dataset: Dataset, failed: Sequence[Any]) -> tuple[str, ...]:
    """Map per-row failure flags back to experiment ids.

    **Arguments:**

    - `dataset`: the dataset the flags were computed on.
    - `failed`: one `[N]` boolean array per bucket, in `dataset.bucket_payloads` order (for
        example the `failed` flags returned by a kernel built with `return_status=True`).

    **Returns:** the ids of the failed real experiments, in bucket then row order. Padding rows
    are never reported. With several processes, call it on every process: flags spread over
    them are gathered, and every process gets the same, global ids.
    """
    if len(failed) != len(dataset.exp_ids):
        raise ValueError(
            f"failed_exp_ids: got {len(failed)} flag arrays for {len(dataset.exp_ids)} buckets."
        )
    out = []
    for b, (flags, ids) in enumerate(zip(failed, dataset.exp_ids, strict=True)):
        flags = to_host(flags)
        if flags.shape != (len(ids),):
            raise ValueError(
                f"failed_exp_ids: bucket {b} flags have shape {flags.shape}, "
                f"expected ({len(ids)},)."
            )
        out.extend(i for i, f in zip(ids, flags, strict=True) if f and i != "")
    return tuple(out)
