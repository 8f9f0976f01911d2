"""Long-format tables in: the way a lab keeps its data.

A long table has one row per measurement: experiment, time, variable, value and an optional
standard deviation. [`hybrid_kernels.experiments_from_table`][] turns it (and per-experiment
covariate, input and state-jump tables) into experiments; `_result_tables` writes predictions
back in the same format. pandas is an optional dependency (`pip install hybrid-kernels[table]`),
imported only through `_pandas`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hybrid_kernels._experiments import ChannelObs, Experiment, make_experiment
from hybrid_kernels._ids import id_column, id_text
from hybrid_kernels._inputs import INPUT_KINDS, piecewise_constant, piecewise_linear
from hybrid_kernels._jumps import StateJump
from hybrid_kernels._optional import require
from hybrid_kernels._paths import file_to_read, unreadable

_WHERE = "experiments_from_table"


def _pandas() -> Any:
    return require("pandas", "table", "Tables")


def _read(table: Any, what: str, where: str = _WHERE) -> Any:
    """A DataFrame from a DataFrame, or from a path pandas can read (CSV, Parquet, Excel)."""
    pd = _pandas()
    if isinstance(table, pd.DataFrame):
        return table
    if isinstance(table, str | os.PathLike):
        path = file_to_read(table, what)
        try:
            if path.suffix == ".parquet":
                return pd.read_parquet(path)
            if path.suffix in (".xls", ".xlsx"):
                return pd.read_excel(path)
            return pd.read_csv(path)
        except OSError as error:  # a file the system refuses to read (permissions...)
            raise unreadable(what, path, error) from None
    raise TypeError(
        f"{where}: `{what}` must be a pandas DataFrame or a path to a file pandas reads, "
        f"got {type(table).__name__}."
    )


def _need(df: Any, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(
            f"{_WHERE}: `{what}` has no column(s) {missing}; it has {list(df.columns)}. Name "
            "them with the `*_col` arguments."
        )


def _rows(positions: np.ndarray) -> str:
    shown = positions[:10].tolist()
    more = f" and {positions.size - 10} more" if positions.size > 10 else ""
    return f"row(s) {shown}{more} (data rows counted from 0)"


def _labels(df: Any, col: str, what: str) -> Any:
    """Column `col` as strings, after refusing missing or blank cells.

    Checked before converting, because pandas versions disagree about what `astype(str)` makes
    of a missing cell (`'nan'` in pandas 2, a missing value in pandas 3).
    """
    cells = df[col]
    missing = cells.isna().to_numpy(dtype=bool)
    blank = np.zeros(len(cells), dtype=bool)
    blank[~missing] = cells[~missing].astype(str).str.strip().eq("").to_numpy(dtype=bool)
    bad = np.flatnonzero(missing | blank)
    if bad.size:
        raise ValueError(
            f"{_WHERE}: `{what}` has no {col!r} in {_rows(bad)}; every row needs one (an "
            "experiment id or a variable name)."
        )
    return cells.astype(str)


def _exp_labels(df: Any, col: str, what: str) -> Any:
    """The experiment column as text ids (see `hybrid_kernels._ids`): `1` and `1.0` are `'1'`."""
    _labels(df, col, what)  # refuses missing and blank cells first
    return id_column(df[col], f"{_WHERE}: `{what}` column {col!r}")


def _numeric(df: Any, col: str, what: str, exp_col: str, var_col: str | None) -> np.ndarray:
    pd = _pandas()
    values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(values) & df[col].notna().to_numpy()
    if bad.any():
        row = df[bad].iloc[0]
        var = f", variable {row[var_col]!r}" if var_col else ""
        raise ValueError(
            f"{_WHERE}: `{what}` experiment {row[exp_col]!r}{var}, field {col!r}: "
            f"{row[col]!r} is not a number."
        )
    return values


def experiments_from_table(
    observations: Any,
    *,
    y0_fn: Callable[..., Any],
    covariates: Any = None,
    inputs: Any = None,
    input_kinds: Mapping[str, str] | None = None,
    jumps: Any = None,
    variables: Sequence[str] | None = None,
    t0: float | Mapping[str, float] | None = None,
    exp_col: str = "experiment",
    time_col: str = "time",
    variable_col: str = "variable",
    value_col: str = "value",
    std_col: str | None = "std",
) -> list[Experiment]:
    """Experiments from a long-format table of measurements.

    **Arguments:**

    - `observations`: one row per measurement, with columns `exp_col`, `time_col`,
        `variable_col`, `value_col` and optionally `std_col` (a standard deviation; the
        variance is its square, 1 where absent). A pandas DataFrame or a path pandas reads.
        A NaN value is a missing measurement and is skipped. Several rows of one variable at
        one time are replicates: each is kept as its own observation and counts in the loss.
    - `y0_fn`: as for [`hybrid_kernels.make_experiment`][]: `(covariates, channels) -> [S]`,
        the state at `t0`.
    - `covariates`: `exp_col` and one column per covariate: one row per experiment, or a
        covariate repeated on several rows of its experiment (as NONMEM tables do), as long
        as it has the same value on each.
    - `inputs`: long-format time-varying inputs: `exp_col`, `time_col`, `variable_col` (the
        input name) and `value_col`; each (experiment, input) is one table.
    - `input_kinds`: input name → `"constant"` (default: a step signal such as a feed) or
        `"linear"` (a ramp). See [`hybrid_kernels.piecewise_constant`][].
    - `jumps`: instantaneous changes of the state (a bolus dose, a sample withdrawn, a
        medium exchange), one row per [`hybrid_kernels.StateJump`][]: `exp_col`, `time_col`,
        `state` (the index of the state component, an integer), and `add` and/or `scale`
        (`y[state] ← scale·y[state] + add`; an absent column or an empty cell is 0 for `add`
        and 1 for `scale`). Rows at one time apply in table order. Every experiment named
        here must have observations: a dose for an experiment the observations lack (a
        misspelt id) raises instead of being dropped.
    - `variables`: the channels to build, in order (default: those in the table, sorted). Each
        experiment gets every one, empty where it was never measured.
    - `t0`: the start time, one float or experiment → float; see the start-time rule of
        [`hybrid_kernels.make_experiment`][].
    - `exp_col`, `time_col`, `variable_col`, `value_col`, `std_col`: the column names.
        [`hybrid_kernels.predictions_table`][] writes the same names back.

    **Returns:** the experiments in order of first appearance; `exp_id` is the experiment
    column as text, whole numbers without a `.0` (`1`, `1.0` and `"1"` are all `"1"`, as in
    [`hybrid_kernels.split_dataset_by_ids`][]; `t0` may be keyed either way). Every error
    names the experiment, the variable and the field.

    **Raises:** `ValueError` for a missing or blank experiment id or variable name (with the
    row numbers, counted from 0 at the first data row), a `std` that is present but not
    finite and > 0, a covariate that is not a finite number or differs between rows of one
    experiment (naming experiment and column), a fractional experiment id,
    a jump row whose `state` is missing or not a whole number `>= 0`, whose `add`/`scale` is
    not finite, or whose experiment has no observations, and a path that does not exist, is a
    directory or cannot be read (naming the argument).
    """
    obs = _read(observations, "observations")
    cols = [exp_col, time_col, variable_col, value_col]
    _need(obs, cols, "observations")
    has_std = std_col is not None and std_col in obs.columns
    obs = obs.assign(
        **{
            exp_col: _exp_labels(obs, exp_col, "observations"),
            variable_col: _labels(obs, variable_col, "observations"),
        }
    )
    times = _numeric(obs, time_col, "observations", exp_col, variable_col)
    values = _numeric(obs, value_col, "observations", exp_col, variable_col)
    stds = _numeric(obs, std_col, "observations", exp_col, variable_col) if has_std else None
    if stds is not None:
        _check_stds(obs, stds, std_col, exp_col, variable_col)
    names = sorted(obs[variable_col].unique()) if variables is None else list(variables)
    ids = list(dict.fromkeys(obs[exp_col]))

    cov_rows = _covariate_rows(covariates, exp_col, ids)
    starts = (
        {id_text(k, f"{_WHERE}: `t0`"): v for k, v in t0.items()} if isinstance(t0, Mapping) else {}
    )
    tables = _input_tables(inputs, input_kinds or {}, exp_col, time_col, variable_col, value_col)
    state_jumps = _jump_rows(jumps, exp_col, time_col, ids)

    keep = ~np.isnan(values)
    out = []
    groups = obs.groupby(exp_col, sort=False).indices
    for exp_id in ids:
        rows = groups[exp_id]
        rows = rows[keep[rows]]
        chans = {}
        for name in names:
            sel = rows[obs[variable_col].to_numpy()[rows] == name]
            var = 1.0 if stds is None else np.where(np.isnan(stds[sel]), 1.0, stds[sel] ** 2)
            try:
                chans[name] = ChannelObs(times[sel], values[sel], var)
            except ValueError as e:
                raise ValueError(
                    f"{_WHERE}: experiment {exp_id!r}, variable {name!r}: {e} (fields "
                    f"{time_col!r}, {value_col!r}{', ' + repr(std_col) if has_std else ''})"
                ) from e
        start = starts.get(exp_id) if isinstance(t0, Mapping) else t0
        try:
            exp = make_experiment(
                covariates=cov_rows.get(exp_id, {}),
                channels=chans,
                y0_fn=y0_fn,
                exp_id=exp_id,
                t0=start,
                inputs=tables.get(exp_id, {}),
                jumps=state_jumps.get(exp_id, ()),
            )
        except ValueError as e:
            raise ValueError(f"{_WHERE}: {e}") from e
        out.append(exp)
    return out


def _check_stds(obs: Any, stds: np.ndarray, std_col: str, exp_col: str, variable_col: str) -> None:
    # An empty cell means "no std given" (variance 1); anything else must be a real std: a
    # negative one would otherwise square into a plausible variance.
    bad = np.flatnonzero(~np.isnan(stds) & ~(np.isfinite(stds) & (stds > 0)))
    if bad.size:
        row = obs.iloc[bad[0]]
        raise ValueError(
            f"{_WHERE}: `observations` experiment {row[exp_col]!r}, variable "
            f"{row[variable_col]!r}: field {std_col!r} is {float(stds[bad[0]])} in {_rows(bad)}; a "
            "standard deviation must be finite and > 0 (leave the cell empty for variance 1)."
        )


def _covariate_rows(covariates: Any, exp_col: str, ids: list[str]) -> dict[str, dict[str, float]]:
    if covariates is None:
        return {}
    df = _read(covariates, "covariates")
    _need(df, [exp_col], "covariates")
    df = df.assign(**{exp_col: _exp_labels(df, exp_col, "covariates")})
    given = set(df[exp_col])
    missing = [i for i in ids if i not in given]
    if missing:
        raise ValueError(
            f"{_WHERE}: `covariates` has no row for experiment(s) {missing} (field {exp_col!r})."
        )
    names = [c for c in df.columns if c != exp_col]
    ids_in_order = df[exp_col].tolist()
    pd = _pandas()
    columns = {}
    for c in names:
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = bad[0]
            cell = df[c].iloc[i]
            if df[c].isna().iloc[i]:
                why = "is missing"
            else:
                why = "is not a number" if np.isnan(values[i]) else "is not finite"
            raise ValueError(
                f"{_WHERE}: `covariates` experiment {ids_in_order[i]!r}, column {c!r}: "
                f"{cell!r} {why} ({_rows(bad)}); every covariate must be a finite number."
            )
        columns[c] = values
    return constant_per_group(columns, ids_in_order, f"{_WHERE}: `covariates`")


def constant_per_group(
    columns: Mapping[str, np.ndarray], ids: Sequence[str], where: str
) -> dict[str, dict[str, float]]:
    """Each id's value of each column, which must be the same on every row of that id.

    A covariate may be repeated on every row of its experiment (as NONMEM tables do); rows
    that disagree raise `ValueError` naming the experiment, the column and the rows.
    """
    groups: dict[str, list[int]] = {}
    for i, exp_id in enumerate(ids):
        groups.setdefault(exp_id, []).append(i)
    out = {}
    for exp_id, rows in groups.items():
        out[exp_id] = {}
        for c, values in columns.items():
            seen = values[rows]
            if np.any(seen != seen[0]):
                raise ValueError(
                    f"{where} experiment {exp_id!r}, column {c!r}: takes the values "
                    f"{list(dict.fromkeys(seen.tolist()))} in {_rows(np.asarray(rows))}; a "
                    "covariate must be the same on every row of its experiment (give a value "
                    "that changes over time as an input)."
                )
            out[exp_id][c] = float(seen[0])
    return out


def _input_tables(inputs, kinds, exp_col, time_col, variable_col, value_col):
    if inputs is None:
        return {}
    df = _read(inputs, "inputs")
    _need(df, [exp_col, time_col, variable_col, value_col], "inputs")
    labels = {exp_col: _exp_labels(df, exp_col, "inputs")}
    labels[variable_col] = _labels(df, variable_col, "inputs")
    df = df.assign(**labels)
    for name, kind in kinds.items():
        if kind not in INPUT_KINDS:
            raise ValueError(
                f"{_WHERE}: `input_kinds[{name!r}]` must be one of {INPUT_KINDS}, got {kind!r}."
            )
    times = _numeric(df, time_col, "inputs", exp_col, variable_col)
    values = _numeric(df, value_col, "inputs", exp_col, variable_col)
    out: dict[str, dict[str, Any]] = {}
    for (exp_id, name), rows in df.groupby([exp_col, variable_col], sort=False).indices.items():
        order = rows[np.argsort(times[rows], kind="stable")]
        make = piecewise_linear if kinds.get(name, "constant") == "linear" else piecewise_constant
        try:
            out.setdefault(exp_id, {})[name] = make(times[order], values[order])
        except ValueError as e:
            raise ValueError(
                f"{_WHERE}: `inputs` experiment {exp_id!r}, variable {name!r} (fields "
                f"{time_col!r}, {value_col!r}): {e}"
            ) from e
    return out


_JUMP_DEFAULTS = {"add": 0.0, "scale": 1.0}


def _jump_rows(jumps: Any, exp_col: str, time_col: str, ids: list[str]) -> dict[str, list]:
    """Each experiment's `StateJump`s from a long table, in table order (ties keep it)."""
    if jumps is None:
        return {}
    df = _read(jumps, "jumps")
    _need(df, [exp_col, time_col, "state"], "jumps")
    if not any(c in df.columns for c in _JUMP_DEFAULTS):
        raise ValueError(
            f"{_WHERE}: `jumps` has neither an 'add' nor a 'scale' column, so no row would "
            f"change the state; it has {list(df.columns)}."
        )
    df = df.reset_index(drop=True).assign(**{exp_col: _exp_labels(df, exp_col, "jumps")})
    observed = set(ids)
    unknown = list(dict.fromkeys(i for i in df[exp_col] if i not in observed))
    if unknown:
        raise ValueError(
            f"{_WHERE}: `jumps` names experiment(s) {unknown} (field {exp_col!r}) that have no "
            "observations; their jumps would be lost. Drop those rows, or check the ids."
        )
    times = _numeric(df, time_col, "jumps", exp_col, None)
    states = _numeric(df, "state", "jumps", exp_col, None)
    bad = np.flatnonzero(~(np.isfinite(states) & (states >= 0) & (states == np.round(states))))
    if bad.size:
        shown = "empty" if np.isnan(states[bad[0]]) else repr(float(states[bad[0]]))
        raise ValueError(
            f"{_WHERE}: `jumps` experiment {df[exp_col].iloc[bad[0]]!r}, field 'state': "
            f"{shown} in {_rows(bad)}; the state must be the index of a state component, a "
            "whole number >= 0."
        )
    fields = {}
    for name, default in _JUMP_DEFAULTS.items():
        given = name in df.columns
        values = _numeric(df, name, "jumps", exp_col, None) if given else np.full(len(df), default)
        fields[name] = np.where(np.isnan(values), default, values)
    out: dict[str, list] = {}
    for i, exp_id in enumerate(df[exp_col]):
        where = f"{_WHERE}: `jumps` experiment {exp_id!r}, row {i} (data rows counted from 0)"
        if not np.isfinite(times[i]):
            raise ValueError(f"{where}, field {time_col!r}: {times[i]} is not a finite time.")
        try:
            jump = StateJump(
                float(times[i]), int(states[i]), float(fields["add"][i]), float(fields["scale"][i])
            )
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        out.setdefault(exp_id, []).append(jump)
    return out
