"""Every save goes through one atomic writer: unique temporaries, stale ones cleaned up."""

import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk
from hybrid_kernels import _atomic

N = 50_000  # large enough that concurrent writes overlap


def _state(value):
    value = float(value)
    return hk.TrainingState(
        predictors={"w": jnp.full(N, value)},
        opt_state=(jnp.zeros(N),),
        step=int(value),
        phase=0,
        phase_step=int(value),
        key=jax.random.key(0),
        best_predictors={"w": jnp.full(N, value)},
        best_loss=1.0,
        best_step=0,
        history=[float(value)],
        penalties=[0.0],
        val_history=[],
        bad_steps=[],
    )


def _load_state(path):
    template = {"w": jnp.zeros(N)}
    loaded = hk.load_training_state(path, predictors=template, opt_state=(jnp.zeros(N),))
    return loaded.predictors["w"]


SAVERS = {
    "training_state": (hk.save_training_state, _state, _load_state),
    "predictors": (
        hk.save_predictors,
        lambda v: {"w": jnp.full(N, float(v))},
        lambda path: hk.load_predictors(path, {"w": jnp.zeros(N)})["w"],
    ),
}


def _temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if "tmp" in p.name)


@pytest.mark.parametrize("kind", SAVERS)
def test_threads_saving_to_one_path_never_corrupt_it(tmp_path, kind):
    save, make, load = SAVERS[kind]
    path = tmp_path / "target"
    threads, rounds = 4, 5
    states = [make(t) for t in range(threads)]
    barrier = threading.Barrier(threads)
    errors = []

    def worker(t):
        try:
            barrier.wait()
            for _ in range(rounds):
                save(path, states[t])
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert errors == []
    values = np.asarray(load(path))
    assert values[0] in range(threads) and np.all(values == values[0])  # one whole save
    assert _temporaries(tmp_path) == []


def test_each_call_writes_its_own_temporary(tmp_path, monkeypatch):
    seen = []
    replace = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        replace(src, dst)

    monkeypatch.setattr(_atomic.os, "replace", spy)
    for value in (1.0, 2.0):
        hk.save_predictors(tmp_path / "p.eqx", {"w": jnp.asarray(value)})
    assert len(set(seen)) == 2
    assert all(re.fullmatch(r"\.p\.eqx\.[0-9a-f]{16}\.tmp", name) for name in seen)


@pytest.mark.parametrize("kind", SAVERS)
def test_next_save_removes_stale_temporaries_of_its_target(tmp_path, kind):
    save, make, _ = SAVERS[kind]
    path = tmp_path / "target"
    stale = tmp_path / ".target.0123456789abcdef.tmp"
    stale.write_bytes(b"partial write of a killed save")
    other = tmp_path / ".other.0123456789abcdef.tmp"
    other.write_bytes(b"belongs to another target")
    save(path, make(1))
    assert not stale.exists()
    assert other.exists()


@pytest.mark.skipif(_atomic.fcntl is None, reason="locks are flock-based on POSIX only")
def test_a_temporary_held_by_a_running_save_is_kept(tmp_path):
    live = tmp_path / ".p.eqx.0123456789abcdef.tmp"
    fd = os.open(live, os.O_RDWR | os.O_CREAT)
    try:
        _atomic.fcntl.flock(fd, _atomic.fcntl.LOCK_EX | _atomic.fcntl.LOCK_NB)
        hk.save_predictors(tmp_path / "p.eqx", {"w": jnp.ones(2)})
        assert live.exists()
    finally:
        os.close(fd)
    hk.save_predictors(tmp_path / "p.eqx", {"w": jnp.ones(2)})  # now its writer is gone
    assert not live.exists()


@pytest.mark.parametrize("kind", SAVERS)
def test_saving_into_a_missing_folder_names_the_target(tmp_path, kind):
    save, make, _ = SAVERS[kind]
    target = tmp_path / "missing" / "target"
    with pytest.raises(ValueError, match=re.escape(repr(str(target)))) as info:
        save(target, make(1))
    assert ".tmp" not in str(info.value)


def test_a_failed_write_removes_its_temporary(tmp_path, monkeypatch):
    def broken(fd):
        raise OSError("disk full")

    monkeypatch.setattr(_atomic.os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        _atomic.write_atomic(tmp_path / "f", b"data")
    assert list(tmp_path.iterdir()) == []
