"""What the fresh-process benchmarks share: one worker per process, timed to the first step.

A first-step time includes imports, traces and compiles, so each measurement runs in a new
Python process (nothing cached), and several are taken in alternating or shuffled order so that
load drift hits every variant alike. A worker stamps the end of every training step through a
display (`Stamped`), turns the stamps into `timings`, and prints them as one JSON line, which
the driver reads back (`run_worker`). The driver reports medians over runs and their ratios to a
baseline (`ratio_table`). `nox -s bench` skips this module (its name starts with `_`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

# (key, header, scale): the four timings every worker reports, as the tables print them
COLUMNS = (
    ("first", "first step (s)", 1.0),
    ("first_cpu", "cpu (s)", 1.0),
    ("steady", "steady step (ms)", 1e3),
    ("cpu", "cpu (ms)", 1e3),
)


class Stamped:
    """A display that notes `(wall, process CPU)` at each step's end, then delegates to `inner`."""

    def __init__(self, inner, stamps: list[tuple[float, float]]) -> None:
        self._inner, self._stamps = inner, stamps

    def on_step_end(self, **kwargs) -> None:
        self._stamps.append((time.perf_counter(), time.process_time()))
        self._inner.on_step_end(**kwargs)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def warm_up(stamps: Sequence) -> int:
    """How many steps the steady statistics skip: a fifth of them, at least 2."""
    return max(len(stamps) // 5, 2)


def timings(stamps: Sequence[tuple[float, float]], start: tuple[float, float]) -> dict[str, float]:
    """`first`/`first_cpu`: seconds from `start` (wall, CPU) to the first step's end; `steady`:
    the median wall time per step after the warm-up; `cpu`: the process CPU seconds per step
    over the same steps (all threads; other processes' load disturbs it much less)."""
    warm = warm_up(stamps)
    wall = [s[0] for s in stamps[warm:]]
    cpu = [s[1] for s in stamps[warm:]]
    steady, per_step = math.nan, math.nan  # too few steps (a smoke run): NaN, not an error
    if len(wall) >= 2:
        steady = statistics.median(b - a for a, b in itertools.pairwise(wall))
        per_step = (cpu[-1] - cpu[0]) / (len(cpu) - 1)
    return {
        "first": stamps[0][0] - start[0],
        "first_cpu": stamps[0][1] - start[1],
        "steady": steady,
        "cpu": per_step,
    }


def run_worker(script: str, *args: str) -> dict:
    """Run `python script --worker ...` in a fresh process (CPU unless `JAX_PLATFORMS` says
    otherwise) and return the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, script, "--worker", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker {args[0]!r} of {script} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_worker(result: Mapping[str, float]) -> None:
    """The worker's side of `run_worker`."""
    print(json.dumps(dict(result)), flush=True)


def load_average(when: str) -> None:
    load = os.getloadavg()
    print(f"load average at {when}: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)


def run_line(run: int, runs: int, name: str, width: int, result: Mapping[str, float]) -> str:
    """One progress line of a measurement."""
    return (
        f"  run {run}/{runs} {name:{width}s} first step {result['first']:6.2f} s "
        f"(cpu {result['first_cpu']:6.2f} s)  steady {result['steady'] * 1e3:7.3f} ms "
        f"(cpu {result['cpu'] * 1e3:7.3f} ms)"
    )


def medians(rows: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Per variant, the median over runs of every reported key."""
    return {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rows.items()
    }


def ratio_table(
    title: str, medians_: Mapping[str, Mapping[str, float]], baseline: str, extra: str = ""
) -> None:
    """A Markdown table of the medians and their ratios to `baseline`'s; `extra` names one
    more reported key printed as is in a last column."""
    base = medians_[baseline]
    head = "".join(f" {header} | ratio |" for _, header, _ in COLUMNS)
    print(f"\n| {title} |{head}" + (f" {extra.replace('_', ' ')} |" if extra else ""))
    print("| --- |" + " --- | --- |" * len(COLUMNS) + (" --- |" if extra else ""))
    for name, m in medians_.items():
        r = ratios(m, base)
        cells = [f"{m[k] * scale:.3f} | {r[k]:.2f}x" for k, _, scale in COLUMNS]
        last = f" {m[extra]:.1f} |" if extra else ""
        print(f"| {name} | " + " | ".join(cells) + " |" + last)


def own_ratios(
    title: str, rows: Mapping[str, Sequence[Mapping[str, float]]], baseline: str
) -> None:
    """A Markdown table of the median over runs of each run's own ratio to the baseline's run
    (the variants of one run share its machine state)."""
    print(f"\n| {title} | first step | steady step |")
    print("| --- | --- | --- |")
    for name, runs in rows.items():
        own = [
            statistics.median(r[k] / b[k] for r, b in zip(runs, rows[baseline], strict=True))
            for k in ("first", "steady")
        ]
        print(f"| {name} | {own[0]:.2f}x | {own[1]:.2f}x |")


def ratios(m: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float]:
    """Each of the four timings of `m` (medians of one variant) over `base`'s."""
    return {key: m[key] / base[key] for key, _, _ in COLUMNS}


def verdict(ratios_: Mapping[str, float], first: float, steady: float) -> str:
    """`"meets"` when the wall-time ratios of the first and steady step are within the targets
    `first` and `steady`, else `"misses"`."""
    return "meets" if ratios_["first"] <= first and ratios_["steady"] <= steady else "misses"
