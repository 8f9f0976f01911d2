"""Each package's atomic writer: with several JAX processes only process 0 writes.

The others wait and return the path. One parametrised test over both packages, whose
writers are separate by design (neither package imports the other). The runtime is
simulated: `jax.process_count`/`process_index` and the broadcast that serves as the barrier
are replaced, so this runs in one process (the real multi-process run is in
`test_processes.py`).
"""

import importlib

import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils


@pytest.fixture(params=["confluent_bank", "hybrid_kernels"])
def write_atomic(request):
    return importlib.import_module(f"{request.param}._atomic").write_atomic


def _pretend(monkeypatch, index: int, process_0_wrote: bool = True) -> list:
    told = []

    def broadcast(value):
        told.append(int(value))
        return np.int32(value) if index == 0 else np.int32(process_0_wrote)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: index)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)
    return told


def test_process_0_writes_and_tells_the_others(write_atomic, tmp_path, monkeypatch):
    told = _pretend(monkeypatch, index=0)
    assert write_atomic(tmp_path / "f.bin", b"abc") == tmp_path / "f.bin"
    assert (tmp_path / "f.bin").read_bytes() == b"abc"
    assert told == [1]


def test_other_processes_wait_and_write_nothing(write_atomic, tmp_path, monkeypatch):
    told = _pretend(monkeypatch, index=1)
    assert write_atomic(tmp_path / "f.bin", b"abc") == tmp_path / "f.bin"
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert len(told) == 1  # it joined the barrier


def test_other_processes_raise_when_process_0_failed(write_atomic, tmp_path, monkeypatch):
    _pretend(monkeypatch, index=1, process_0_wrote=False)
    with pytest.raises(OSError, match="process 0 failed to write it"):
        write_atomic(tmp_path / "f.bin", b"abc")


def test_process_0_raises_its_own_error_after_telling_the_others(
    write_atomic, tmp_path, monkeypatch
):
    told = _pretend(monkeypatch, index=0)
    with pytest.raises((OSError, ValueError), match="missing"):
        write_atomic(tmp_path / "missing" / "f.bin", b"abc")
    assert told == [0]


def test_saves_nested_in_a_single_writer_section_write_directly(tmp_path, monkeypatch):
    # hybrid_kernels only: its save_run writes a folder of several files as one unit.
    from hybrid_kernels._atomic import _single_writer, write_atomic

    told = _pretend(monkeypatch, index=0)

    def write_two():
        write_atomic(tmp_path / "a.bin", b"a")
        write_atomic(tmp_path / "b.bin", b"b")
        return tmp_path

    assert _single_writer(tmp_path, write_two) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]
    assert told == [1]  # one barrier for the whole section
