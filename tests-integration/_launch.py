"""Launch N local JAX processes joined by `jax.distributed`, for the multi-process tests.

Each child runs `script` with `--coordinator 127.0.0.1:<free port> --processes N
--process-id i` followed by `args`, with `devices_per_process` forced CPU devices and the
interpreter running the tests (`sys.executable`), so it imports the packages the same way.
Every child is bounded by `timeout`; when it runs out, or when a child fails and
`kill_on_failure` is set, the remaining children are killed, so a hung collective can never
hang the test session.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "examples"


@dataclasses.dataclass
class Child:
    """One finished child: its exit status, its output, and when it ended."""

    process_id: int
    returncode: int | None  # None: killed by the harness (timeout or a failed peer)
    stdout: str
    stderr: str
    ended: float  # time.monotonic() when the harness saw it end

    def check(self) -> Child:
        assert self.returncode == 0, (
            f"process {self.process_id} exited with {self.returncode}:\n{self.stderr[-4000:]}"
        )
        return self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(devices_per_process: int, cache_dir: Path | None = None) -> dict[str, str]:
    """The environment of a child: CPU only, forced devices, the examples importable.

    With `cache_dir`, compiled kernels go to JAX's persistent cache there, so later launches
    of the same program skip most of the compile (it dominates these tests on a small CPU).
    """
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    if cache_dir is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(cache_dir),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


@dataclasses.dataclass
class Running:
    """A started child and the files its output goes to."""

    popen: subprocess.Popen
    stdout: Any
    stderr: Any


def start(
    script: Path,
    n_processes: int,
    devices_per_process: int,
    args: list[str],
    *,
    cache_dir: Path | None = None,
) -> list[Running]:
    """Start the children (not waiting); see `launch`."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = child_env(devices_per_process, cache_dir)
    running = []
    for i in range(n_processes):
        # Files, not pipes: a child never blocks on a full pipe while the harness polls.
        out, err = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
        command = [
            sys.executable,
            str(script),
            *("--coordinator", coordinator, "--processes", str(n_processes)),
            *("--process-id", str(i)),
            *args,
        ]
        running.append(
            Running(subprocess.Popen(command, env=env, stdout=out, stderr=err), out, err)
        )
    return running


def wait(running: list[Running], *, timeout: float, kill_on_failure: bool = True) -> list[Child]:
    """Wait for every child, at most `timeout` seconds in all; kill what is left after that.

    With `kill_on_failure`, the first child to exit non-zero gets its peers killed too (they
    would otherwise wait for it in a collective until the runtime's own timeouts).
    """
    procs = [r.popen for r in running]
    deadline = time.monotonic() + timeout
    ended: dict[int, float] = {}
    killed: set[int] = set()
    try:
        while len(ended) < len(procs):
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic()
            failed = any(procs[i].returncode != 0 for i in ended)
            if time.monotonic() > deadline or (kill_on_failure and failed):
                break
            time.sleep(0.05)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
                killed.add(i)
    children = []
    for i, r in enumerate(running):
        r.popen.wait()
        returncode = None if i in killed else r.popen.returncode
        now = time.monotonic()
        children.append(Child(i, returncode, _read(r.stdout), _read(r.stderr), ended.get(i, now)))
    return children


def _read(handle: Any) -> str:
    handle.seek(0)
    text = handle.read()
    handle.close()
    return text


def launch(
    script: Path,
    n_processes: int,
    devices_per_process: int,
    args: list[str],
    *,
    timeout: float = 120.0,
    cache_dir: Path | None = None,
) -> list[Child]:
    """Run `script` as `n_processes` joined processes and return them once all have ended."""
    running = start(script, n_processes, devices_per_process, args, cache_dir=cache_dir)
    return wait(running, timeout=timeout)
