"""Few host syncs: losses are read back once per `log_every` steps, never per bucket, and the
bucket gradients are combined inside compiled code."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import quiet, train
from jax._src.array import ArrayImpl

import hybrid_kernels as hk
from hybrid_kernels._training import _engine, _reads, _tail


@pytest.fixture(scope="module")
def two_buckets(oscillator):
    # two bucket shapes: a per-bucket read-back would double the count
    return oscillator.dataset((10, 10, 10, 14), t1=4.0, bucket_policy="exact")


def _concrete(x):
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


@pytest.fixture
def reads(monkeypatch):
    """Counts device-to-host reads: `n` through `_reads.read_back`, `stray` by any other path.

    The transfer guard never fires on CPU, so every way a `jax.Array` reaches the host is
    wrapped instead: `_value` (behind `float`, `int`, `bool`, `tolist`, `str`, `__array__`,
    `jax.device_get`), `item`, and numpy's converters, which on CPU read through the buffer
    protocol and so pass no Python hook on the array. Strays count only inside `window`.
    """
    count = {"n": 0, "stray": 0}
    state = {"inside": 0, "window": False}

    def stray():
        if state["window"] and not state["inside"]:
            count["stray"] += 1

    def counting(tree):
        count["n"] += 1
        state["inside"] += 1
        try:
            return original(tree)
        finally:
            state["inside"] -= 1

    original = _reads.read_back
    monkeypatch.setattr(_reads, "read_back", counting)

    value = ArrayImpl._value

    def _value(self):
        stray()
        return value.fget(self)

    monkeypatch.setattr(ArrayImpl, "_value", property(_value))
    item = ArrayImpl.item

    def _item(self, *args):
        stray()
        return item(self, *args)

    monkeypatch.setattr(ArrayImpl, "item", _item)
    for name in ("asarray", "array", "asanyarray", "ascontiguousarray"):
        convert = getattr(np, name)

        def converting(x, *args, _convert=convert, **kwargs):
            if any(_concrete(leaf) for leaf in jax.tree.leaves(x)):
                stray()
            return _convert(x, *args, **kwargs)

        monkeypatch.setattr(np, name, converting)

    @contextlib.contextmanager
    def window():
        state["window"] = True
        try:
            yield
        finally:
            state["window"] = False

    count["window"] = window
    return count


# Looked up at call time, as the library does: numpy's converters are patched on the module.
_READS = {
    "float": float,
    "int": int,
    "bool": bool,
    "format": lambda x: f"{x:.3f}",
    "item": lambda x: x.item(),
    "tolist": lambda x: x.tolist(),
    "np.asarray": lambda x: np.asarray(x),
    "np.array of a list": lambda x: np.array([x, x]),
    "device_get": jax.device_get,
}


@pytest.mark.parametrize("read", list(_READS.values()), ids=list(_READS))
def test_a_read_outside_read_back_is_counted_as_stray(reads, read):
    x = jnp.asarray(2.0) + 1  # a fresh array: nothing cached on the host yet
    with reads["window"]():
        read(x)
    assert reads["stray"] >= 1
    assert reads["n"] == 0


def test_reads_through_read_back_are_not_stray(reads):
    with reads["window"]():
        _reads.read_back((jnp.asarray(2.0) + 1, jnp.arange(3) + 1))
    assert (reads["n"], reads["stray"]) == (1, 0)


def test_one_read_per_step_with_log_every_one(oscillator, two_buckets, reads):
    assert len(two_buckets.bucket_payloads) == 2
    train(oscillator, two_buckets, quiet(steps=(12,)))  # compile first
    reads["n"] = 0
    train(oscillator, two_buckets, quiet(steps=(12,)))
    assert reads["n"] <= 12 + 1  # one per step, plus the final best-step read


def test_one_read_per_block_with_log_every_k(oscillator, two_buckets, reads):
    train(oscillator, two_buckets, quiet(steps=(12,), log_every=4))
    assert reads["n"] <= 12 // 4 + 1


def test_log_every_changes_nothing_but_the_read_pattern(oscillator, two_buckets):
    every_step, a = train(oscillator, two_buckets, quiet(steps=(10,)))
    ui = hk.RecordingUI()
    blocks, b = train(oscillator, two_buckets, quiet(steps=(10,), log_every=3), ui=ui)
    assert list(every_step) == list(blocks)
    assert float(a[0].omega) == float(b[0].omega)
    assert [e["step"] for e in ui.of("on_step_end")] == list(range(10))


def test_steady_state_runs_read_the_device_only_through_read_back(oscillator, two_buckets, reads):
    train(oscillator, two_buckets, quiet(steps=(3,)))  # first use: host-side shape checks
    reads["n"] = 0
    # The guard fires only where transfers are real (a GPU); the counts hold on every backend.
    with reads["window"](), jax.transfer_guard_device_to_host("disallow"):
        history, _ = train(oscillator, two_buckets, quiet(steps=(6,)))
    assert len(history) == 6
    assert reads["stray"] == 0
    assert 1 <= reads["n"] <= 6 + 1


def test_bucket_gradients_are_combined_only_inside_compiled_code(
    oscillator, two_buckets, monkeypatch
):
    calls = []
    original = _tail.combine_bucket_grads

    def spy(losses, grads, weights):
        calls.append(all(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(grads)))
        return original(losses, grads, weights)

    monkeypatch.setattr(_tail, "combine_bucket_grads", spy)
    _engine._OPTIMIZERS.clear()  # a fresh tail, traced with the spy in place
    train(oscillator, two_buckets, quiet(steps=(5,)))
    assert calls and all(calls)  # traced (once), never run eagerly per step
    assert len(calls) <= 2
