"""Subsets of a dataset: random splits, splits by id, and bootstrap resamples.

Each subset is re-bucketed from the source experiments with the dataset's own options, so a
split never inherits the parent's bucket shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jaxtyping import Array

from hybrid_kernels._data import Dataset, _rebucketed
from hybrid_kernels._ids import id_text
from hybrid_kernels._preflight import check_int


def _refuse_process_local(dataset: Dataset, where: str) -> None:
    # Each process holds only its own experiments: a subset drawn here would differ between
    # processes (and a part empty on one of them would leave the others waiting in a
    # collective), so the split has to happen on the experiment list, before make_dataset.
    if dataset.process_local:
        raise ValueError(
            f"{where}: `dataset` was built with make_dataset(process_local=True), so this "
            "process holds only its own experiments and a subset drawn here would differ "
            "between processes. Split the experiment list first, by the same rule on every "
            "process (for example by exp_id), then call make_dataset(process_local=True) once "
            "per part."
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

    - `dataset`: the dataset to split (it must still hold its source experiments, and not be
        process-local: split the experiment list before `make_dataset(process_local=True)`).
    - `train`, `val`, `test`: fractions in [0, 1] summing to 1. Each size is
        `floor(fraction * n)`, and the experiments this leaves over go to the last split, in
        the order train, val, test, whose fraction is positive (test, unless `test=0`). A zero
        fraction therefore always gets zero experiments. A positive fraction that still ends
        with zero experiments raises.
    - `key`: a `jax.random` key for the permutation.

    **Returns:** `(train, val, test)`. An empty split has no payloads.
    """
    _refuse_process_local(dataset, "split_dataset")
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
    _refuse_process_local(dataset, "make_bootstrap_dataset")
    exps = dataset.experiments
    if not exps:
        raise ValueError("make_bootstrap_dataset: `dataset` holds no experiments to resample.")
    n = len(exps) if n_experiments is None else n_experiments
    n = check_int(n, "make_bootstrap_dataset: `n_experiments`")
    idx = np.asarray(jax.random.randint(key, (n,), 0, len(exps)))
    return _rebucketed(dataset, [exps[i] for i in idx])


def split_dataset_by_ids(dataset: Dataset, exp_ids: Sequence[str | int]) -> tuple[Dataset, Dataset]:
    """Split named experiments off a dataset (held-out runs), re-bucketing both parts.

    **Arguments:**

    - `dataset`: the dataset (it must still hold its source experiments).
    - `exp_ids`: the ids to split off; each must name an experiment of `dataset`. An integer
        names the experiment whose id is its text, as the table readers write it (`7` and
        `"7"` both name experiment `"7"`).

    **Returns:** `(rest, selected)`, each built with `dataset`'s options; `selected` keeps the
    order of `exp_ids`. An empty part has no payloads.
    """
    _refuse_process_local(dataset, "split_dataset_by_ids")
    if isinstance(exp_ids, str):
        raise TypeError(
            f"split_dataset_by_ids: `exp_ids` must be a sequence of ids, got the string "
            f"{exp_ids!r}; wrap it in a list."
        )
    wanted = [id_text(i, "split_dataset_by_ids: `exp_ids`") for i in exp_ids]
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
