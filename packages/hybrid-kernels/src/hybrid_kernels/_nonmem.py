"""NONMEM-style record tables: one row per event (observation, dose, reset) per subject.

A pharmacometrics dataset has the columns `ID, TIME, DV, AMT, RATE, EVID, MDV, CMT` (and
often `II, ADDL, SS` and covariates such as `WT`). Each row is an event, in the order the
events happened. [`hybrid_kernels.experiments_from_nonmem`][] reads it into experiments:
observations on one output channel, bolus doses and resets as
[`hybrid_kernels.StateJump`][]s, infusions as piecewise-constant inputs. What it cannot
reproduce exactly it refuses, naming the row (counted from 0 at the first data row).
pandas is an optional dependency (`pip install hybrid-kernels[table]`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hybrid_kernels._experiments import ChannelObs, Experiment, make_experiment
from hybrid_kernels._ids import id_column, id_text
from hybrid_kernels._inputs import InputTable, piecewise_constant
from hybrid_kernels._jumps import StateJump
from hybrid_kernels._tables import _pandas, _read

_WHERE = "experiments_from_nonmem"
# Optional columns and the value an absent column means.
_DEFAULTS = {"AMT": 0.0, "RATE": 0.0, "MDV": 0.0, "II": 0.0, "ADDL": 0.0, "SS": 0.0}


@dataclasses.dataclass
class _Dose:
    time: float
    cmt: int
    amt: float
    rate: float  # 0 for a bolus
    row: int
    implied: bool  # an additional dose (ADDL), not a record of its own


@dataclasses.dataclass
class _Subject:
    """One subject's events, parsed; `events` are in record order: `(kind, time, row, dose)`."""

    exp_id: str
    t_first: float
    obs_ts: np.ndarray
    obs_values: np.ndarray
    events: list[tuple[str, float, int, _Dose | None]]
    covariates: dict[str, float]
    varying: dict[str, InputTable]


def _where(df: Any, row: int, id_col: str) -> str:
    cells = [df[c].iloc[row] for c in (id_col, "TIME")]
    ident, time = (c.item() if isinstance(c, np.generic) else c for c in cells)
    return f"row {row} ({id_col} {ident!r}, TIME {time!r})"


def _numbers(df: Any, col: str, id_col: str, default: float | None) -> np.ndarray:
    """A column as floats; `.` and empty cells (NONMEM's missing) are NaN."""
    if col not in df.columns:
        if default is None:
            raise ValueError(f"{_WHERE}: `table` has no column {col!r}; it has {list(df.columns)}.")
        return np.full(len(df), default)
    pd = _pandas()
    cells = df[col]
    text = cells.astype(str).str.strip()
    missing = cells.isna().to_numpy() | text.isin([".", ""]).to_numpy()
    values = pd.to_numeric(cells.where(~missing), errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(np.isnan(values) & ~missing)
    if bad.size:
        raise ValueError(
            f"{_WHERE}: {_where(df, bad[0], id_col)}, column {col!r}: {cells.iloc[bad[0]]!r} is "
            "not a number."
        )
    return values


def _subjects(
    df: Any, cmt_to_state: Mapping[int, int], covariates: Sequence[str], id_col: str
) -> list[_Subject]:
    """Each subject's observations, events and covariates, after checking every row."""
    df = df.reset_index(drop=True)
    if id_col not in df.columns:
        raise ValueError(f"{_WHERE}: `table` has no column {id_col!r}; it has {list(df.columns)}.")
    cells = df[id_col]
    blank = np.flatnonzero(cells.isna() | cells.astype(str).str.strip().isin(["", "."]))
    if blank.size:
        raise ValueError(f"{_WHERE}: row {blank[0]} has no {id_col!r}; every row needs one.")
    ids = id_column(df[id_col], f"{_WHERE}: column {id_col!r}").to_numpy()
    time = _numbers(df, "TIME", id_col, None)
    cols = {c: _numbers(df, c, id_col, d) for c, d in _DEFAULTS.items()}
    dv = _numbers(df, "DV", id_col, None)
    amt = cols["AMT"]
    if "EVID" in df.columns:
        evid = _numbers(df, "EVID", id_col, None)
    else:  # NM-TRAN's rule: a row with an amount is a dose, MDV=1 without one another event
        evid = np.where(np.nan_to_num(amt) > 0, 1.0, np.where(cols["MDV"] == 1, 2.0, 0.0))
    cmt = _numbers(df, "CMT", id_col, np.nan)
    for name in covariates:
        if name not in df.columns:
            raise ValueError(
                f"{_WHERE}: covariate {name!r} (argument `covariates`) is not a column of "
                f"`table`; it has {list(df.columns)}."
            )
    cov = {name: _numbers(df, name, id_col, None) for name in covariates}
    # A cheap vectorised pass finds the rows that need a closer look (and a message).
    dose = np.isin(evid, (1, 4))
    suspect = ~np.isfinite(time) | ~np.isin(evid, (0, 1, 2, 3, 4))
    suspect |= np.nan_to_num(cols["SS"]) != 0
    suspect |= np.any([np.isnan(v) for v in cov.values()], axis=0) if cov else False
    suspect |= dose & ~np.isin(np.nan_to_num(cols["RATE"]), 0) & ~(np.nan_to_num(cols["RATE"]) > 0)
    suspect |= dose & ~(np.isfinite(amt) & (amt > 0))
    suspect |= dose & ~np.isin(cmt, [float(c) for c in cmt_to_state])
    addl, ii = np.nan_to_num(cols["ADDL"]), np.nan_to_num(cols["II"])
    suspect |= dose & ((addl < 0) | (addl != np.round(addl)) | ((addl > 0) & ~(ii > 0)))
    for i in np.flatnonzero(suspect):
        _check_row(df, i, id_col, time[i], evid[i], cols, amt[i], cmt[i], cmt_to_state, cov)

    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    seen: dict[str, int] = {}
    for s in starts:
        if ids[s] in seen:
            raise ValueError(
                f"{_WHERE}: {_where(df, s, id_col)} starts subject {ids[s]!r} again after other "
                f"subjects' rows (its records began at row {seen[ids[s]]}); NONMEM reads that "
                "as a new individual. Give each subject one run of rows, or a new ID."
            )
        seen[ids[s]] = s
    varies = [n for n in covariates if _varies_within(cov[n], starts, len(df))]
    is_obs = (evid == 0) & (cols["MDV"] != 1)
    out = []
    for s, e in zip(starts, [*starts[1:], len(df)], strict=True):
        rows = np.arange(s, e)
        back = np.flatnonzero(np.diff(time[rows]) < 0)
        if back.size:
            r = rows[back[0] + 1]
            raise ValueError(
                f"{_WHERE}: {_where(df, r, id_col)}: TIME goes back (from {float(time[r - 1]):g}); "
                "records must be in time order within a subject (a restart of time after a "
                "reset is not supported: give the later period its own ID)."
            )
        observed = rows[is_obs[rows]]
        missing = observed[np.isnan(dv[observed])]
        if missing.size:
            raise ValueError(
                f"{_WHERE}: {_where(df, missing[0], id_col)}: an observation (EVID 0, MDV 0) "
                "with no DV; set MDV=1 on rows that are not observations."
            )
        events = []
        for r in rows:
            if evid[r] in (3, 4):
                events.append(("reset", float(time[r]), int(r), None))
            if evid[r] in (1, 4):
                for dose in _expand(r, time[r], cmt[r], amt[r], cols):
                    events.append(("dose", dose.time, int(r), dose))
            if is_obs[r]:
                events.append(("obs", float(time[r]), int(r), None))
        out.append(
            _Subject(
                exp_id=str(ids[s]),
                t_first=float(time[s]),
                obs_ts=time[observed],
                obs_values=dv[observed],
                events=events,
                covariates={n: float(cov[n][s]) for n in covariates if n not in varies},
                varying={n: _carried(time[rows], cov[n][rows]) for n in varies},
            )
        )
    return out


def _check_row(df, i, id_col, time, evid, cols, amt, cmt, cmt_to_state, cov) -> None:
    where = f"{_WHERE}: {_where(df, i, id_col)}"
    time, evid, amt, cmt, ss = (float(x) for x in (time, evid, amt, cmt, cols["SS"][i]))
    if not np.isfinite(time):
        raise ValueError(f"{where}: TIME must be a finite number.")
    if evid not in (0, 1, 2, 3, 4):
        raise ValueError(
            f"{where}: EVID {evid:g} is not supported (0 observation, 1 dose, 2 other event, "
            "3 reset, 4 reset and dose)."
        )
    if ss != 0 and not np.isnan(ss):
        raise ValueError(f"{where}: SS={ss:g}; steady-state doses are not supported.")
    for name, values in cov.items():
        if np.isnan(values[i]):
            raise ValueError(f"{where}, covariate {name!r}: the cell is missing.")
    if evid not in (1, 4):
        return
    rate, ii, addl = (float(np.nan_to_num(cols[c][i])) for c in ("RATE", "II", "ADDL"))
    if rate in (-1, -2):
        raise ValueError(
            f"{where}: RATE={rate:g} (a rate or duration modelled in $PK) is not supported; "
            "give the infusion's RATE in the table."
        )
    if rate < 0:
        raise ValueError(f"{where}: RATE={rate:g} is not supported; it must be 0 or > 0.")
    if not (np.isfinite(amt) and amt > 0):
        raise ValueError(f"{where}: a dose (EVID {evid:g}) needs AMT > 0, got {amt:g}.")
    if np.isnan(cmt) or cmt != int(cmt) or int(cmt) not in cmt_to_state:
        raise ValueError(
            f"{where}: a dose into CMT {cmt:g}, which `cmt_to_state` does not map (it maps "
            f"{sorted(cmt_to_state)})."
        )
    if addl < 0 or addl != int(addl) or (addl > 0 and not ii > 0):
        raise ValueError(
            f"{where}: ADDL={addl:g} with II={ii:g}; additional doses need a whole ADDL >= 0 "
            "and II > 0."
        )


def _carried(ts: np.ndarray, values: np.ndarray) -> InputTable:
    """Each record's value from its time on, with records that change nothing left out."""
    table = piecewise_constant(ts, values)
    keep = np.r_[True, table.values[1:] != table.values[:-1]]
    return piecewise_constant(table.ts[keep], table.values[keep])


def _varies_within(values: np.ndarray, starts: np.ndarray, n: int) -> bool:
    ends = [*starts[1:], n]
    return any(np.any(values[s:e] != values[s]) for s, e in zip(starts, ends, strict=True))


def _expand(row: int, time: float, cmt: float, amt: float, cols: dict) -> list[_Dose]:
    """The dose of `row` and its additional doses (`ADDL` more, every `II`)."""
    rate, ii, addl = (float(np.nan_to_num(cols[c][row])) for c in ("RATE", "II", "ADDL"))
    return [
        _Dose(float(time + k * ii), int(cmt), float(amt), rate, int(row), k > 0)
        for k in range(int(addl) + 1)
    ]


def _check_order(subject: _Subject, df: Any, id_col: str) -> None:
    """Refuse what right-continuous jumps cannot reproduce (see `experiments_from_nonmem`)."""
    doses = [d for kind, _, _, d in subject.events if kind == "dose"]
    for kind, t_reset, r_reset, _ in subject.events:
        if kind != "reset":
            continue
        for d in doses:
            running = d.rate > 0 and d.time + d.amt / d.rate > t_reset
            if d.row < r_reset and (running or (d.implied and d.time >= t_reset)):
                what = "additional (ADDL) doses" if d.implied else "an infusion"
                raise ValueError(
                    f"{_WHERE}: {what} of {_where(df, d.row, id_col)} still run at the reset of "
                    f"{_where(df, r_reset, id_col)}; NONMEM ends them there, which is not "
                    "reproduced. End the dosing before the reset."
                )
    implied = {}  # time of an additional bolus -> its row
    last_jump = {}  # time -> the last record with a bolus or reset at that time
    for kind, t, r, d in subject.events:
        if kind == "reset" or (kind == "dose" and d.rate == 0 and not d.implied):
            last_jump[t] = r
        elif kind == "dose" and d.rate == 0:
            implied.setdefault(t, r)
    for kind, t, r, _ in subject.events:
        if kind != "obs":
            continue
        if t in implied or last_jump.get(t, -1) > r:
            row = implied[t] if t in implied else last_jump[t]
            cause = "an additional (ADDL) dose of" if t in implied else "the dose or reset of"
            raise ValueError(
                f"{_WHERE}: the observation at {_where(df, r, id_col)} is at the time of "
                f"{cause} {_where(df, row, id_col)} and would see the state before it, which a "
                "jump cannot give (at a jump's time the state is the one after it). Record the "
                "sample after the dose if it was taken after, or move its TIME just before."
            )


def _infusions(doses: list[_Dose], cmts: list[int], start: float) -> dict[str, InputTable]:
    """`rate{CMT}`: at each time, the sum of the rates of the infusions running into CMT."""
    out = {}
    for c in cmts:
        mine = [d for d in doses if d.cmt == c and d.rate > 0]
        begin = np.array([d.time for d in mine])
        end = np.array([d.time + d.amt / d.rate for d in mine])
        rate = np.array([d.rate for d in mine])
        ts = np.unique(np.concatenate([[start], begin, end]))
        # Summed afresh at each time (not accumulated), so a finished infusion leaves exactly 0.
        running = (begin[None, :] <= ts[:, None]) & (end[None, :] > ts[:, None])
        out[f"rate{c}"] = piecewise_constant(ts, running.astype(float) @ rate)
    return out


def experiments_from_nonmem(
    table: Any,
    *,
    y0_fn: Callable[..., Any],
    cmt_to_state: Mapping[int, int],
    channel: str = "DV",
    covariates: Sequence[str] = (),
    t0: float | Mapping[Any, float] | None = None,
    id_col: str = "ID",
) -> list[Experiment]:
    """Experiments from a NONMEM-style record table (one row per event, in event order).

    **Arguments:**

    - `table`: a pandas DataFrame or a path pandas reads (CSV, Parquet, Excel). Columns
        `ID` (`id_col`), `TIME`, `DV` are required; `EVID`, `MDV`, `AMT`, `RATE`, `CMT`,
        `II`, `ADDL`, `SS` are read when present (absent: 0; without `EVID`, a row with
        `AMT > 0` is a dose, one with `MDV=1` another event, the rest observations). A `.` or
        empty cell is missing.
    - `y0_fn`: `(covariates, channels) -> [S]`, the state at `t0` and after a reset, as for
        [`hybrid_kernels.make_experiment`][].
    - `cmt_to_state`: compartment number (`CMT`) → state index, for every compartment dosed.
    - `channel`: the name of the output channel that `DV` fills.
    - `covariates`: the columns to read as covariates. A column with one value per subject
        becomes a covariate; one that changes within any subject becomes, for every subject,
        a piecewise-constant input named after the column: the value of each record holds
        from its `TIME` until the next record's (last value carried forward; of several
        records at one time the last holds). Missing cells are refused.
    - `t0`: the start time, one float or ID → float; default (and for a subject missing from
        the mapping) the subject's first `TIME`.
    - `id_col`: the subject column. Integer and text ids are both read as text (`1` → `"1"`),
        as by [`hybrid_kernels.split_dataset_by_ids`][].

    **Rows.** `EVID 0` rows are observations of `channel` unless `MDV=1`; dose rows are never
    observations, whatever their `DV`. `EVID 1` with `RATE 0` is a bolus:
    `StateJump(TIME, cmt_to_state[CMT], add=AMT)`. With `RATE > 0` it is an infusion of `AMT`
    at `RATE` for `AMT/RATE`; the input `"rate{CMT}"` is the sum of the infusions running into
    that compartment (overlaps add, back-to-back infusions join), 0 when none runs, and every
    subject gets every such input. `II`/`ADDL` add `ADDL` doses every `II`. `EVID 3` resets
    every state to `y0` (`StateJump(scale=0, add=y0[s])` for each state `s`); `EVID 4` resets
    and then doses. `EVID 2` rows only carry covariate values.

    **Same-time records.** Jumps are right-continuous: a sample at a bolus's or a reset's
    time, recorded after it, sees the state after it, as in NONMEM. A sample recorded before
    it (a trough taken just before the dose) would need the state before it, so it raises,
    naming both rows; so does a sample at the time of an additional (ADDL) dose.

    **Returns:** one experiment per subject, in order of first appearance.

    **Raises:** `ValueError` naming the row for `SS != 0`, `RATE` -1/-2 or negative, an
    `EVID` other than 0-4, a dose with `AMT <= 0` or into a compartment not in `cmt_to_state`,
    an `ADDL` without `II > 0`, an observation without `DV`, a non-numeric cell, `TIME` going
    back within a subject, a subject whose rows are split by another's, an infusion or
    additional doses still running at a reset, and the same-time samples above.
    """
    df = _read(table, "table", _WHERE).reset_index(drop=True)
    subjects = _subjects(df, cmt_to_state, covariates, id_col)
    cmts = sorted(
        {e[3].cmt for s in subjects for e in s.events if e[0] == "dose" and e[3].rate > 0}
    )
    starts = (
        {id_text(k, f"{_WHERE}: `t0`"): float(v) for k, v in t0.items()}
        if isinstance(t0, Mapping)
        else {}
    )
    clash = {f"rate{c}" for c in cmts} & set(covariates)
    if clash:
        raise ValueError(f"{_WHERE}: covariate(s) {sorted(clash)} are named like infusion inputs.")
    out = []
    for subject in subjects:
        _check_order(subject, df, id_col)
        start = starts.get(subject.exp_id, subject.t_first) if isinstance(t0, Mapping) else t0
        start = subject.t_first if start is None else float(start)
        doses = [e[3] for e in subject.events if e[0] == "dose"]
        inputs = {**_infusions(doses, cmts, start), **subject.varying}
        obs = {channel: ChannelObs(subject.obs_ts, subject.obs_values)}
        try:
            exp = make_experiment(
                covariates=subject.covariates,
                channels=obs,
                y0_fn=y0_fn,
                exp_id=subject.exp_id,
                t0=start,
                inputs=inputs,
                jumps=_jumps(subject, cmt_to_state, None),
            )
            if any(e[0] == "reset" for e in subject.events):
                y0 = np.asarray(exp.y0, dtype=np.float64)
                exp = make_experiment(
                    covariates=subject.covariates,
                    channels=obs,
                    y0_fn=y0_fn,
                    exp_id=subject.exp_id,
                    t0=start,
                    inputs=inputs,
                    jumps=_jumps(subject, cmt_to_state, y0),
                )
        except ValueError as e:
            raise ValueError(f"{_WHERE}: {e}") from e
        out.append(exp)
    return out


def _jumps(subject: _Subject, cmt_to_state: Mapping[int, int], y0: Any) -> list[StateJump]:
    """Boluses and resets in record order (jumps at one time apply in the order listed)."""
    jumps = []
    for kind, t, _, dose in subject.events:
        if kind == "reset" and y0 is not None:
            jumps.extend(StateJump(t, s, add=float(v), scale=0.0) for s, v in enumerate(y0))
        elif kind == "dose" and dose.rate == 0:
            jumps.append(StateJump(t, int(cmt_to_state[dose.cmt]), add=dose.amt))
    return jumps
