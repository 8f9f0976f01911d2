"""Long-format tables out: predictions in the lab's own format, and their error metrics.

[`hybrid_kernels.predictions_table`][] turns predictions back into the long format
[`hybrid_kernels.experiments_from_table`][] reads, with the same column names, and
[`hybrid_kernels.metrics_table`][] summarises that table per variable. pandas is an optional
dependency (`pip install hybrid-kernels[table]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_kernels._bucketing import scatter
from hybrid_kernels._data import Dataset
from hybrid_kernels._distributed import to_host
from hybrid_kernels._tables import _pandas


def predictions_table(
    dataset: Dataset,
    predictions: Sequence[Any],
    *,
    exp_col: str = "experiment",
    time_col: str = "time",
    variable_col: str = "variable",
    value_col: str = "value",
) -> Any:
    """Predictions back in the lab's long format, one row per measured cell.

    **Arguments:**

    - `dataset`: the dataset the predictions were made on.
    - `predictions`: one `[N, T, D]` array per bucket, e.g. from
        [`hybrid_kernels.predict_dataset`][].
    - `exp_col`, `time_col`, `variable_col`, `value_col`: column names, the same as given to
        [`hybrid_kernels.experiments_from_table`][].

    **Returns:** a DataFrame with columns `exp_col`, `time_col`, `variable_col`, `value_col`
    (the measurement), `"prediction"` and `"residual"` (prediction − measurement). Replicates
    stay separate rows; padding never appears. Times and measurements are the experiments' own,
    at the precision they were given, not the dataset's: in a float32 dataset a time of `4.7`
    stays `4.7` (not `4.699999809…`), so the table joins back onto the lab's. With several
    processes, call it on every process: each gets the table of every experiment (times and
    measurements of experiments another process holds come from the dataset's arrays).
    """
    pd = _pandas()
    if len(predictions) != len(dataset.bucket_payloads):
        raise ValueError(
            f"predictions_table: `predictions` holds {len(predictions)} arrays but the dataset "
            f"has {len(dataset.bucket_payloads)} buckets; pass predict_dataset's output."
        )
    names = np.asarray(dataset.output_channel_names, dtype=object)
    sources = _source_cells(dataset)
    parts = []
    for b, (pred, bp, ids) in enumerate(
        zip(predictions, dataset.bucket_payloads, dataset.exp_ids, strict=True)
    ):
        pred = np.asarray(to_host(pred), dtype=np.float64)
        if pred.shape != tuple(bp.y_observed.shape):
            raise ValueError(
                f"predictions_table: `predictions[{b}]` has shape {pred.shape}; expected "
                f"{tuple(bp.y_observed.shape)}, the shape of bucket {b}'s y_observed."
            )
        n, t, d = np.nonzero(to_host(bp.mask))
        real = np.asarray(ids, dtype=object)[n] != ""
        n, t, d = n[real], t[real], d[real]
        times = np.array(to_host(bp.ts), dtype=np.float64)  # copies: filled below
        values = np.array(to_host(bp.y_observed), dtype=np.float64)
        for row, exp_id in enumerate(ids):
            if exp_id in sources:
                ts64, y64 = sources[exp_id]
                times[row, : ts64.size] = ts64
                values[row, : ts64.size] = y64
        obs = values[n, t, d]
        p = pred[n, t, d]
        parts.append(
            pd.DataFrame(
                {
                    exp_col: np.asarray(ids, dtype=object)[n],
                    time_col: times[n, t],
                    variable_col: names[d],
                    value_col: obs,
                    "prediction": p,
                    "residual": p - obs,
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            columns=[exp_col, time_col, variable_col, value_col, "prediction", "residual"]
        )
    return pd.concat(parts, ignore_index=True).sort_values(
        [exp_col, variable_col, time_col], kind="stable", ignore_index=True
    )


def _source_cells(dataset: Dataset) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each source experiment's union axis `[T]` and measurements `[T, D]` in float64, laid
    out as `make_dataset` lays them (the layout depends on the times, not on the dtype)."""
    names = tuple(dataset.output_channel_names)
    cells = {}
    for exp in dataset.experiments:
        ts, y, _, _ = scatter(exp, names, np.dtype(np.float64))
        cells[exp.exp_id] = (ts, y)
    return cells


def metrics_table(
    table: Any, *, by: Sequence[str] = ("variable",), value_col: str = "value"
) -> Any:
    """Error metrics of a [`hybrid_kernels.predictions_table`][], per group.

    **Arguments:**

    - `table`: the predictions table.
    - `by`: the columns to group by: `("variable",)` (default; channels carry different units
        and are never pooled) or e.g. `("experiment", "variable")`.
    - `value_col`: the measurement column.

    **Returns:** a DataFrame with the `by` columns and `n`, `mse`, `rmse`, `mae` and `r2`
    (`1 - SS_res / SS_tot`, NaN for a constant group).
    """
    pd = _pandas()
    missing = [c for c in (*by, value_col, "residual") if c not in table.columns]
    if missing:
        raise ValueError(f"metrics_table: `table` has no column(s) {missing}.")

    def stats(g: Any) -> Any:
        r = g["residual"].to_numpy()
        y = g[value_col].to_numpy()
        ss_tot = float(((y - y.mean()) ** 2).sum())
        mse = float((r**2).mean())
        return pd.Series(
            {
                "n": len(r),
                "mse": mse,
                "rmse": float(np.sqrt(mse)),
                "mae": float(np.abs(r).mean()),
                "r2": 1 - mse * len(r) / ss_tot if ss_tot > 0 else float("nan"),
            }
        )

    rows = [
        {**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)), **stats(g)}
        for key, g in table.groupby(list(by), sort=True)
    ]
    out = pd.DataFrame(rows, columns=[*by, "n", "mse", "rmse", "mae", "r2"])
    return out.astype({"n": int})
