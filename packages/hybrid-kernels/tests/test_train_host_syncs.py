"""Few host syncs: losses are read back once per `log_every` steps, never per bucket, and the
bucket gradients are combined inside compiled code."""

import jax
import pytest
from helpers import quiet, train

import hybrid_kernels as hk
from hybrid_kernels._training import _engine, _loop, _step


@pytest.fixture(scope="module")
def two_buckets(oscillator):
    # two bucket shapes: a per-bucket read-back would double the count
    return oscillator.dataset((10, 10, 10, 14), t1=4.0, bucket_policy="exact")


@pytest.fixture
def reads(monkeypatch):
    count = {"n": 0}
    original = _loop._read_back

    def counting(tree):
        count["n"] += 1
        return original(tree)

    monkeypatch.setattr(_loop, "_read_back", counting)
    return count


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


def test_steady_state_steps_make_no_implicit_device_to_host_transfers(oscillator, two_buckets):
    train(oscillator, two_buckets, quiet(steps=(3,)))  # first use: host-side shape checks
    with jax.transfer_guard_device_to_host("disallow"):
        history, _ = train(oscillator, two_buckets, quiet(steps=(6,)))
    assert len(history) == 6


def test_bucket_gradients_are_combined_only_inside_compiled_code(
    oscillator, two_buckets, monkeypatch
):
    calls = []
    original = _step.combine_bucket_grads

    def spy(losses, grads, weights):
        calls.append(all(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(grads)))
        return original(losses, grads, weights)

    monkeypatch.setattr(_step, "combine_bucket_grads", spy)
    _engine._OPTIMIZERS.clear()  # a fresh tail, traced with the spy in place
    train(oscillator, two_buckets, quiet(steps=(5,)))
    assert calls and all(calls)  # traced (once), never run eagerly per step
    assert len(calls) <= 2
