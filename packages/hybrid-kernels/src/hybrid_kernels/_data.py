"""Experiments, channels and the bucketed dataset the kernels consume.

Data flows one way: :class:`ChannelObs` and :class:`Experiment` hold one experiment's sparse,
per-channel observations on the host; :func:`make_dataset` scatters each experiment onto its own
union time axis and stacks experiments into :class:`BucketPayload` buckets of equal shape. Each
bucket shape is one compiled kernel, so the bucket policy (see
`hybrid_kernels._bucketing`) is what bounds the compile count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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
from hybrid_kernels._dtypes import resolve_dtype
from hybrid_kernels._inputs import InputTable

__all__ = [
    "BucketPayload",
    "ChannelObs",
    "Dataset",
    "Experiment",
    "describe_buckets",
    "failed_exp_ids",
    "make_bootstrap_dataset",
    "make_dataset",
    "make_experiment",
    "split_dataset",
    "split_dataset_by_ids",
]


class ChannelObs(eqx.Module):
    """One measured quantity of one experiment: sparse observations at their own times.

    **Arguments:**

    - `ts`: observation times `[Tc]`, finite; need not be sorted. A repeated time is a
        replicate: each replicate is its own cell on the union axis and counts in the loss.
    - `values`: observed values `[Tc]`, finite. An empty `values` with non-empty `ts` is a
        *probe* channel: its times shape the integration grid but nothing is observed.
    - `variance`: observation variance, a positive scalar (broadcast) or `[Tc]`.

    Arrays are kept as host NumPy arrays at their given precision, so the dataset's
    `dtype` option (not the jax x64 flag at construction time) decides the stored precision.
    """

    ts: np.ndarray
    values: np.ndarray
    variance: np.ndarray

    def __init__(self, ts: Any, values: Any, variance: Any = 1.0):
        ts = _as_float_array(ts, "ts")
        values = _as_float_array(values, "values")
        if ts.ndim != 1:
            raise ValueError(f"ChannelObs: `ts` must be rank-1, got shape {ts.shape}.")
        if values.ndim != 1:
            raise ValueError(f"ChannelObs: `values` must be rank-1, got shape {values.shape}.")
        probe = values.size == 0
        if not probe and values.shape != ts.shape:
            raise ValueError(
                f"ChannelObs: `values` has shape {values.shape} but `ts` has shape {ts.shape}; "
                "they must match (or `values` must be empty for a probe channel)."
            )
        variance = _as_float_array(variance, "variance")
        if variance.ndim == 0:
            variance = np.full(values.shape, variance, dtype=variance.dtype)
        elif variance.shape != values.shape:
            raise ValueError(
                f"ChannelObs: `variance` must be a scalar or have the shape of `values` "
                f"{values.shape}, got {variance.shape}."
            )
        if not np.all(np.isfinite(ts)):
            raise ValueError("ChannelObs: `ts` must be finite.")
        if not np.all(np.isfinite(values)):
            raise ValueError("ChannelObs: `values` must be finite.")
        if not (np.all(np.isfinite(variance)) and np.all(variance > 0)):
            raise ValueError("ChannelObs: `variance` must be finite and strictly positive.")
        self.ts = ts
        self.values = values
        self.variance = variance

    @property
    def is_probe(self) -> bool:
        """True when the channel has times but no observed values."""
        return self.values.size == 0


class Experiment(eqx.Module):
    """One experiment: covariates, time-varying inputs, initial state and observed channels.

    Build it with [`hybrid_kernels.make_experiment`][]. `exp_id` is host-side only: it never
    reaches a kernel, and [`hybrid_kernels.Dataset`][] keeps it to map rows back. `t0` is the
    time `y0` applies at (`None` only for experiments built by hand: then the first observed
    time). `inputs` maps names to [`hybrid_kernels.InputTable`][]s.
    """

    covariates: dict[str, np.ndarray]
    y0: np.ndarray
    channels: dict[str, ChannelObs]
    exp_id: str = eqx.field(static=True, default="")
    t0: float | None = eqx.field(static=True, default=None)
    inputs: dict[str, InputTable] = eqx.field(default_factory=dict)


def make_experiment(
    *,
    covariates: Mapping[str, Any],
    channels: Mapping[str, ChannelObs],
    y0_fn: Callable[[dict[str, Array], Mapping[str, ChannelObs]], Any],
    exp_id: str = "",
    t0: float | None = None,
    inputs: Mapping[str, InputTable] | None = None,
) -> Experiment:
    """Validate and assemble one [`hybrid_kernels.Experiment`][].

    **The start-time rule.** `y0_fn` gives the state at `t0`, and the solve starts at `t0`.
    When `t0` is not given it is 0, and then the experiment's earliest time (over its channels,
    probes included) must be exactly 0: an experiment first sampled later raises, so the initial
    state is never moved silently to the first sample (nor silently back to 0). Pass `t0=0.0`
    for a run that started at 0 and was first sampled later, or `t0=` the first sample time to
    start the solve there. Observations before `t0` raise.

    **Arguments:**

    - `covariates`: name → scalar or `[K]` value, constant in time.
    - `channels`: name → [`hybrid_kernels.ChannelObs`][].
    - `y0_fn`: `y0_fn(covariates_as_jax_arrays, channels) -> [S]`, the *full* state at `t0`
        (it may include unobserved components such as penalty accumulators).
    - `exp_id`: a host-side name for error messages, failure reports and predictions.
    - `t0`: the start time (see the rule above).
    - `inputs`: name → [`hybrid_kernels.InputTable`][] (from
        [`hybrid_kernels.piecewise_constant`][] or [`hybrid_kernels.piecewise_linear`][]):
        signals that change in time. Inside `simulate_fn`, `covariates[name]` is then an
        [`hybrid_kernels.InputSignal`][] to call at `t`, and the table's switch times reach the
        step-size controller as jump times. Names must differ from the covariates'.

    **Returns:** the experiment. Raises `ValueError` naming `exp_id` on a rank>1 or non-finite
    covariate, a `y0` that is not rank-1 and finite, a missing `t0` or an observation before
    it; `TypeError` on a non-str `exp_id`, a non-numeric covariate or `y0`, or a channel that
    is not a `ChannelObs`.
    """
    if not isinstance(exp_id, str):
        raise TypeError(f"make_experiment: `exp_id` must be a str, got {exp_id!r}.")
    for arg, value in (("covariates", covariates), ("channels", channels)):
        if not isinstance(value, Mapping):
            raise TypeError(
                f"make_experiment({exp_id!r}): `{arg}` must be a mapping of name to value, "
                f"got {type(value).__name__}."
            )
    covs: dict[str, np.ndarray] = {}
    for name in sorted(covariates):
        if not isinstance(name, str):
            raise TypeError(
                f"make_experiment({exp_id!r}): covariate names must be str, got {name!r}."
            )
        value = _as_array(covariates[name], f"make_experiment({exp_id!r}): covariate {name!r}")
        if value.dtype.kind not in "biuf":
            raise TypeError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be numeric, "
                f"got dtype {value.dtype}."
            )
        if value.ndim > 1:
            raise ValueError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be rank 0 or 1, "
                f"got shape {value.shape}."
            )
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise ValueError(
                f"make_experiment({exp_id!r}): covariate {name!r} must be finite, got {value}."
            )
        covs[name] = value
    for name, ch in channels.items():
        if not isinstance(name, str):
            raise TypeError(
                f"make_experiment({exp_id!r}): channel names must be str, got {name!r}."
            )
        if not isinstance(ch, ChannelObs):
            raise TypeError(
                f"make_experiment({exp_id!r}): channel {name!r} must be a ChannelObs, "
                f"got {type(ch).__name__}."
            )
    if not callable(y0_fn):
        raise TypeError(
            f"make_experiment({exp_id!r}): `y0_fn` must be callable, got {type(y0_fn).__name__}."
        )
    t0 = _start_time(exp_id, channels, t0)
    tables = dict(inputs or {})
    for name, table in tables.items():
        if not isinstance(table, InputTable):
            raise TypeError(
                f"make_experiment({exp_id!r}): input {name!r} must be an InputTable (see "
                f"piecewise_constant / piecewise_linear), got {type(table).__name__}."
            )
        if name in covs:
            raise ValueError(
                f"make_experiment({exp_id!r}): input {name!r} is also a covariate; "
                "names must differ."
            )
    y0 = _as_array(
        y0_fn({k: jnp.asarray(v) for k, v in covs.items()}, channels),
        f"make_experiment({exp_id!r}): `y0_fn`'s return value",
    )
    if y0.dtype.kind not in "iuf":
        raise TypeError(
            f"make_experiment({exp_id!r}): y0_fn must return a numeric state, got dtype {y0.dtype}."
        )
    if y0.ndim != 1:
        raise ValueError(
            f"make_experiment({exp_id!r}): y0_fn must return a rank-1 state [S], "
            f"got shape {y0.shape}."
        )
    if not np.all(np.isfinite(y0)):
        raise ValueError(f"make_experiment({exp_id!r}): `y0` must be finite, got {y0}.")
    return Experiment(
        covariates=covs,
        y0=y0,
        channels=dict(channels),
        exp_id=exp_id,
        t0=t0,
        inputs={k: tables[k] for k in sorted(tables)},
    )


def _start_time(exp_id: str, channels: Mapping[str, ChannelObs], t0: Any) -> float:
    """make_experiment's start-time rule (see its docstring); every message names the field."""
    firsts = {n: float(np.min(c.ts)) for n, c in channels.items() if c.ts.size}
    if t0 is None:
        if firsts and min(firsts.values()) != 0.0:
            name = min(firsts, key=firsts.__getitem__)
            raise ValueError(
                f"make_experiment({exp_id!r}): no `t0` given and the first time is "
                f"{firsts[name]!r} (channel {name!r}, field `ts`), not 0. Pass `t0`, the time "
                "y0_fn's state applies at: t0=0.0 to start the solve before the first sample, "
                f"or t0={firsts[name]!r} to start it there."
            )
        return 0.0
    if isinstance(t0, bool) or not isinstance(t0, int | float | np.number) or not math.isfinite(t0):
        raise ValueError(f"make_experiment({exp_id!r}): `t0` must be a finite float, got {t0!r}.")
    for name, first in firsts.items():
        if first < t0:
            raise ValueError(
                f"make_experiment({exp_id!r}): channel {name!r} has a time {first!r} in `ts` "
                f"before t0={float(t0)!r}; observations must not precede the start."
            )
    return float(t0)


class BucketPayload(NamedTuple):
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
    - `row_weights` `[N]`: 1 for real rows, 0 for padding rows.
    - `row_lengths` `[N]` int32: each row's own union length (before time padding). The
        length mask takes its prefix per row, so padding never changes which cells are scored.
    - `inputs`: name → `(ts [N, L], ys [N, L, ...])`, the knots of each row's input signal,
        padded to a bucket-wide `L` (see [`hybrid_kernels.InputTable`][]); `None` without inputs.
    - `jump_ts` `[N, J]`: each row's input switch times, padded with `+inf`; `None` without
        inputs.

    `row_weights` and `row_lengths` default to `None` (all rows real, of length `T`), so a
    payload written by hand with the seed's seven fields still works.
    """

    ts: Float[Array, "N T"]
    y_observed: Float[Array, "N T D"]
    yvar: Float[Array, "N T D"]
    mask: Bool[Array, "N T D"]
    covariates: dict[str, Array]
    y0: Float[Array, "N S"]
    n_obs: Int[Array, ""]
    row_weights: Float[Array, " N"] | None = None
    row_lengths: Int[Array, " N"] | None = None
    inputs: dict[str, tuple[Array, Array]] | None = None
    jump_ts: Float[Array, "N J"] | None = None


class Dataset(eqx.Module):
    """The bucketed dataset: what the kernels loop over.

    - `bucket_payloads`: one [`hybrid_kernels.BucketPayload`][] per compiled shape, ascending `T`.
    - `output_channel_names`: channel order along `D`.
    - `covariate_names`: sorted covariate keys.
    - `exp_ids`: for each bucket, the `exp_id` of each row (`""` for padding rows).
    - `experiments`: the source experiments, so subsets can be re-bucketed.
    - `bucket_policy`, `max_shapes`, `dtype`, `mesh`, `planned_steps`: the options it was built
        with; subsets reuse them.
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
    if max_shapes is not None and (
        isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1
    ):
        raise ValueError(f"make_dataset: `max_shapes` must be a positive int, got {max_shapes!r}.")
    if planned_steps is not None and (
        isinstance(planned_steps, bool) or not isinstance(planned_steps, int) or planned_steps < 1
    ):
        raise ValueError(
            f"make_dataset: `planned_steps` must be None or a positive int, got {planned_steps!r}."
        )
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
    # --- process-local data (several processes, each with its own experiments) ---
    if process_local and jax.process_count() > 1:
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


def _as_array(x: Any, what: str) -> np.ndarray:
    """`np.asarray(x)`, with numpy's ragged-sequence error re-raised naming `what`."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{what} must be a numeric array, not a ragged sequence ({e}).") from e


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


def _as_float_array(x: Any, name: str) -> np.ndarray:
    arr = _as_array(x, f"ChannelObs: `{name}`")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"ChannelObs: `{name}` must be numeric, got dtype {arr.dtype}.")
    return arr if arr.dtype.kind == "f" else arr.astype(np.float64)


def describe_buckets(dataset: Dataset) -> str:
    """One line per bucket: index, `N` (real rows), `T`, `D` and the mask fill fraction."""
    lines = []
    for i, bp in enumerate(dataset.bucket_payloads):
        N, T, D = bp.mask.shape
        n_real = N if bp.row_weights is None else int(np.count_nonzero(bp.row_weights))
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


def split_dataset(
    dataset: Dataset,
    *,
    train: float = 0.8,
    val: float = 0.1,
    test: float = 0.1,
    key: Array,
) -> tuple[Dataset, Dataset, Dataset]:
    """Randomly split experiments into train/val/test datasets, each re-bucketed from scratch.

    **Arguments:**

    - `dataset`: the dataset to split (it must still hold its source experiments).
    - `train`, `val`, `test`: fractions in [0, 1] summing to 1. Each size is
        `floor(fraction * n)`, and the experiments this leaves over go to the last split, in
        the order train, val, test, whose fraction is positive (test, unless `test=0`). A zero
        fraction therefore always gets zero experiments. A positive fraction that still ends
        with zero experiments raises.
    - `key`: a `jax.random` key for the permutation.

    **Returns:** `(train, val, test)`. An empty split has no payloads.
    """
    fracs = {"train": train, "val": val, "test": test}
    for name, f in fracs.items():
        if not (isinstance(f, int | float) and 0.0 <= f <= 1.0):
            raise ValueError(f"split_dataset: `{name}` must be a fraction in [0, 1], got {f!r}.")
    if not math.isclose(train + val + test, 1.0, abs_tol=1e-9):
        raise ValueError(
            f"split_dataset: `train + val + test` must be 1, got {train + val + test!r}."
        )
    exps = dataset.experiments
    if not exps:
        raise ValueError("split_dataset: `dataset` holds no experiments to split.")
    n = len(exps)
    sizes = [math.floor(f * n) for f in fracs.values()]
    sizes[max(i for i, f in enumerate(fracs.values()) if f > 0)] += n - sum(sizes)
    n_train, n_val, n_test = sizes
    for name, f, k in (("train", train, n_train), ("val", val, n_val), ("test", test, n_test)):
        if f > 0 and k == 0:
            raise ValueError(
                f"split_dataset: `{name}={f}` of {n} experiments floors to 0 experiments."
            )
    perm = np.asarray(jax.random.permutation(key, n))
    parts = (perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :])
    return tuple(_rebucketed(dataset, [exps[i] for i in sorted(p)]) for p in parts)  # type: ignore[return-value]


def make_bootstrap_dataset(
    dataset: Dataset, *, key: Array, n_experiments: int | None = None
) -> Dataset:
    """Resample experiments with replacement and re-bucket.

    **Arguments:**

    - `dataset`: the source dataset (it must hold its source experiments).
    - `key`: a `jax.random` key.
    - `n_experiments`: sample size; defaults to the source's experiment count.
    """
    exps = dataset.experiments
    if not exps:
        raise ValueError("make_bootstrap_dataset: `dataset` holds no experiments to resample.")
    n = len(exps) if n_experiments is None else n_experiments
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            "make_bootstrap_dataset: `n_experiments` must be a positive int, "
            f"got {n_experiments!r}."
        )
    idx = np.asarray(jax.random.randint(key, (n,), 0, len(exps)))
    return _rebucketed(dataset, [exps[i] for i in idx])


def failed_exp_ids(dataset: Dataset, failed: Sequence[Any]) -> tuple[str, ...]:
    """Map per-row failure flags back to experiment ids.

    **Arguments:**

    - `dataset`: the dataset the flags were computed on.
    - `failed`: one `[N]` boolean array per bucket, in `dataset.bucket_payloads` order (for
        example the `failed` flags returned by a kernel built with `return_status=True`).

    **Returns:** the ids of the failed real experiments, in bucket then row order. Padding rows
    are never reported.
    """
    if len(failed) != len(dataset.exp_ids):
        raise ValueError(
            f"failed_exp_ids: got {len(failed)} flag arrays for {len(dataset.exp_ids)} buckets."
        )
    out = []
    for b, (flags, ids) in enumerate(zip(failed, dataset.exp_ids, strict=True)):
        flags = np.asarray(flags)
        if flags.shape != (len(ids),):
            raise ValueError(
                f"failed_exp_ids: bucket {b} flags have shape {flags.shape}, "
                f"expected ({len(ids)},)."
            )
        out.extend(i for i, f in zip(ids, flags, strict=True) if f and i != "")
    return tuple(out)


def split_dataset_by_ids(dataset: Dataset, exp_ids: Sequence[str]) -> tuple[Dataset, Dataset]:
    """Split named experiments off a dataset (held-out runs), re-bucketing both parts.

    **Arguments:**

    - `dataset`: the dataset (it must still hold its source experiments).
    - `exp_ids`: the ids to split off; each must name an experiment of `dataset`.

    **Returns:** `(rest, selected)`, each built with `dataset`'s options; `selected` keeps the
    order of `exp_ids`. An empty part has no payloads.
    """
    if isinstance(exp_ids, str):
        raise TypeError(
            f"split_dataset_by_ids: `exp_ids` must be a sequence of ids, got the string "
            f"{exp_ids!r}; wrap it in a list."
        )
    wanted = list(exp_ids)
    by_id = {e.exp_id: e for e in dataset.experiments}
    unknown = [i for i in wanted if i not in by_id]
    if unknown:
        raise ValueError(
            f"split_dataset_by_ids: experiment id(s) {unknown} (field `exp_ids`) are not in the "
            f"dataset; it holds {sorted(by_id)}."
        )
    chosen = set(wanted)
    rest = [e for e in dataset.experiments if e.exp_id not in chosen]
    return _rebucketed(dataset, rest), _rebucketed(dataset, [by_id[i] for i in wanted])
