"""Child of test_probe_temporaries.py: saves killed with SIGKILL, over and over.

`python kill_saves_child.py FOLDER KILLS` forks, KILLS times for each kind of save (a
predictors file, then a whole run folder), a writer that saves once completely and then
stops inside its next save, at a random one of its fsyncs and renames, where it is killed
with SIGKILL. It prints one JSON line: per kind, the temporaries beside the target after
each kill, and whether the target loads at the end.

The import (seconds) is paid once here and each writer is a fork (milliseconds). The forks
never start a JAX backend: the trees are NumPy arrays and the multi-process gate of
`_atomic` is bypassed (it is tested in tests-integration/test_single_writer.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import diffrax
import numpy as np

import hybrid_kernels as hk
from hybrid_kernels import _atomic

_atomic._single_writer = lambda target, write: write()  # one process; see the docstring

TREE = {"w": np.arange(100_000, dtype=np.float64)}
SOLVER = hk.SolverConfig(solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=64, dt0=None)
CONFIG = hk.OptaxTrainingConfig(steps=(1,), lr=(1e-3,), verbose=False)


def save_file(target: Path) -> None:
    hk.save_predictors(target, TREE)


def save_run(target: Path) -> None:
    hk.save_run(target, TREE, solver=SOLVER, config=CONFIG, overwrite=True)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _stop_at(point: int, ready: int) -> None:
    """Make the writer stop for good at its `point`-th fsync or rename from now on."""
    calls = [0]

    def hooked(real):
        def call(*args):
            calls[0] += 1
            if calls[0] == point:
                os.write(ready, b"1")  # the parent kills us here, mid-save
                time.sleep(60)
            return real(*args)

        return call

    os.fsync = hooked(os.fsync)
    os.replace = hooked(os.replace)


def kill_loop(save, target: Path, kills: int, points: int, rng: random.Random) -> list:
    """Kill `kills` writers, each at a random one of the `points` fsyncs/renames of a save."""
    found = []
    for _ in range(kills):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer: one complete save, then one it does not finish
            try:
                os.close(ready_r)
                save(target)
                _stop_at(rng.randint(1, points), ready_w)
                save(target)
            finally:
                os._exit(1)
        os.close(ready_w)
        if os.read(ready_r, 1) != b"1":
            raise RuntimeError("the writer finished or failed instead of stopping mid-save")
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        rng.random()  # the fork used the same state; move on
        found.append(temporaries(target.parent))
    return found


def main() -> None:
    folder, kills = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(0)
    (folder / "file").mkdir()
    (folder / "run").mkdir()
    file_target = folder / "file" / "p.eqx"
    run_target = folder / "run" / "run"
    report = {
        # a file save: fsync temporary, rename, fsync folder
        "file": kill_loop(save_file, file_target, kills, 3, rng),
        # a run save: two files (3 each), then (after the swap, one exchange) fsync folder
        "run": kill_loop(save_run, run_target, kills, 7, rng),
    }
    loaded = hk.load_predictors(file_target, TREE)
    report["file_loads"] = bool(np.array_equal(loaded["w"], TREE["w"]))
    run = hk.load_run(run_target, TREE)
    report["run_loads"] = bool(np.array_equal(run.predictors["w"], TREE["w"]))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
