"""The probe's temporaries scenarios (issue 22, item 7): killed saves leave at most one
temporary, and no save ever deletes one that a running save is still writing.

The writers are real processes killed with SIGKILL mid-save. To keep this fast, most of them
are forked by one small driver process that loads only the writer (`_atomic` and `_paths`,
no JAX), and each runs the write every save goes through (`_write_here`, what process 0 of
`write_atomic` runs). One test kills a real `save_checkpoint` in a process with JAX.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import confluent_bank as cb
import confluent_bank._atomic as atomic

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or atomic.fcntl is None, reason="needs fork and flock (POSIX)"
)

SOURCE = str(Path(cb.__file__).parent)
TEMPORARY = re.compile(r"\.bank\.json\.[0-9a-f]{16}\.tmp")

# Loads the writer without the package's __init__ (no JAX), so forking is safe and cheap.
PRELUDE = f"""
import json, os, random, select, signal, sys, time, types
package = types.ModuleType("confluent_bank")
package.__path__ = [{SOURCE!r}]
sys.modules["confluent_bank"] = package
from confluent_bank import _atomic
from pathlib import Path
"""

# Forks `kills` writers one after the other and SIGKILLs each mid-save: either while it is
# blocked inside its fsync (its temporary certainly exists) or at a random moment of a loop
# of saves. After each kill it counts the temporaries of the target.
KILLER = """
target, kills, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
payload = os.urandom(1_500_000)  # about the size of the probe's banks
_atomic._write_here(target, b"first")
counts = []
for kill in range(kills):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        if mode == "in fsync":
            def hang(fd):
                os.write(write_end, b"x")
                time.sleep(60)
            _atomic.os.fsync = hang
            _atomic._write_here(target, payload)
        else:
            os.write(write_end, b"x")
            while True:
                _atomic._write_here(target, payload)
        os._exit(0)
    os.close(write_end)
    assert select.select([read_end], [], [], 30)[0], "the writer never started"
    os.read(read_end, 1)
    if mode == "at random":
        time.sleep(random.uniform(0, 0.02))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_end)
    counts.append(sum(name.endswith(".tmp") for name in os.listdir(target.parent)))
print(json.dumps(counts))
"""


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def _temporaries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if TEMPORARY.fullmatch(name))


@pytest.mark.parametrize("mode", ["in fsync", "at random"])
def test_forty_killed_saves_leave_at_most_one_temporary(tmp_path, mode):
    target = tmp_path / "bank.json"
    counts = json.loads(_run(KILLER, str(target), "40", mode).stdout)
    assert len(counts) == 40 and max(counts) <= 1
    if mode == "in fsync":
        assert counts == [1] * 40  # each kill left its own temporary; the next save took it
    # The target is whole: the first file or one complete payload, never a mixture.
    assert target.read_bytes() == b"first" or target.stat().st_size == 1_500_000
    atomic.write_atomic(target, b"last")
    assert _temporaries(tmp_path) == [] and target.read_bytes() == b"last"


HOLDER = """
target, real, held = Path(sys.argv[1]), os.fsync, []
def hold(fd):
    # Mid-save (the file's fsync, not the folder's): tell the test, wait until it says go on.
    if not held:
        held.append(fd)
        print("writing", flush=True)
        sys.stdin.readline()
    real(fd)
_atomic.os.fsync = hold
_atomic._write_here(target, b"from the other process")
print("done", flush=True)
"""


def test_a_save_never_deletes_the_temporary_another_process_is_writing(tmp_path):
    target = tmp_path / "bank.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(HOLDER), str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "writing\n"
        [live] = _temporaries(tmp_path)
        atomic.write_atomic(target, b"from this process")
        assert _temporaries(tmp_path) == [live]  # the running save's temporary survived
        assert target.read_bytes() == b"from this process"
        holder.stdin.write("go on\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "done\n"
    finally:
        holder.kill()
        holder.wait()
    assert target.read_bytes() == b"from the other process"  # its rename still worked
    assert _temporaries(tmp_path) == []


def test_a_save_never_deletes_the_temporary_another_thread_is_writing(tmp_path, monkeypatch):
    target = tmp_path / "bank.json"
    writing, go_on = threading.Event(), threading.Event()
    real = os.fsync
    holder_thread: list[threading.Thread] = []

    def hold(fd):
        if threading.current_thread() is holder_thread[0]:
            writing.set()
            go_on.wait(30)
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", hold)
    holder_thread.append(threading.Thread(target=atomic.write_atomic, args=(target, b"thread")))
    holder_thread[0].start()
    try:
        assert writing.wait(30)
        [live] = _temporaries(tmp_path)
        atomic.write_atomic(target, b"main")
        assert _temporaries(tmp_path) == [live]
    finally:
        go_on.set()
        holder_thread[0].join(30)
    assert target.read_bytes() == b"thread" and _temporaries(tmp_path) == []


@pytest.mark.parametrize(
    "name",
    [
        ".bank.json.tmp",  # no random part: not a name this writer makes
        ".bank.json.0123456789ABCDEF.tmp",  # upper-case hex
        ".bank.json.old.0123456789abcdef.tmp",  # the temporary of another target
        "bank.json.0123456789abcdef.tmp",  # not hidden
        ".bank.json.0123456789abcdef.tmp.keep",
    ],
)
def test_files_that_are_not_this_targets_temporaries_are_left_alone(tmp_path, name):
    (tmp_path / name).write_bytes(b"someone else's")
    atomic.write_atomic(tmp_path / "bank.json", b"{}")
    assert sorted(os.listdir(tmp_path)) == sorted(["bank.json", name])


CHECKPOINT_CHILD = """
import os, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import confluent_bank as cb
bank = cb.init_confluent_bank([cb.RefinedPack(0, 0.5, 1.0)], max_packs=20_000, max_order=8)
def hang(fd):
    print("writing", flush=True)
    time.sleep(60)
os.fsync = hang
cb.save_checkpoint(sys.argv[1], bank)
"""


def test_a_killed_save_checkpoint_is_cleaned_up_by_the_next_save(tmp_path, pair_bank):
    target = tmp_path / "bank.json"
    cb.save_checkpoint(target, pair_bank)
    before = target.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", CHECKPOINT_CHILD, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert child.stdout.readline() == "writing\n"
        [stale] = _temporaries(tmp_path)
        assert (tmp_path / stale).stat().st_size > 1_000_000  # a real bank, mid-save
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
        child.wait()
    assert target.read_bytes() == before  # the killed save changed nothing
    cb.save_checkpoint(target, pair_bank)
    assert sorted(os.listdir(tmp_path)) == ["bank.json"]
    assert cb.load_checkpoint(target).portable_snapshot() == pair_bank.portable_snapshot()
