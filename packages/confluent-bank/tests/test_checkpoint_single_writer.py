"""With several JAX processes only process 0 writes; the others wait and return the path.

The runtime is simulated: `jax.process_count`/`process_index` and the broadcast that
serves as the barrier are replaced, so this runs in one process (the real multi-process
run is in tests-integration/test_processes.py).
"""

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from confluent_bank._atomic import write_atomic


def _pretend(monkeypatch, index: int, process_0_wrote: bool = True) -> list:
    told = []

    def broadcast(value):
        told.append(int(value))
        return np.int32(value) if index == 0 else np.int32(process_0_wrote)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: index)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)
    return told


def test_process_0_writes_and_tells_the_others(tmp_path, monkeypatch):
    told = _pretend(monkeypatch, index=0)
    assert write_atomic(tmp_path / "f.bin", b"abc") == tmp_path / "f.bin"
    assert (tmp_path / "f.bin").read_bytes() == b"abc"
    assert told == [1]


def test_other_processes_wait_and_write_nothing(tmp_path, monkeypatch):
    told = _pretend(monkeypatch, index=1)
    assert write_atomic(tmp_path / "f.bin", b"abc") == tmp_path / "f.bin"
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert len(told) == 1  # it joined the barrier


def test_other_processes_raise_when_process_0_failed(tmp_path, monkeypatch):
    _pretend(monkeypatch, index=1, process_0_wrote=False)
    with pytest.raises(OSError, match="process 0 failed to write it"):
        write_atomic(tmp_path / "f.bin", b"abc")


def test_process_0_raises_its_own_error_after_telling_the_others(tmp_path, monkeypatch):
    told = _pretend(monkeypatch, index=0)
    with pytest.raises((OSError, ValueError), match="missing"):
        write_atomic(tmp_path / "missing" / "f.bin", b"abc")
    assert told == [0]
