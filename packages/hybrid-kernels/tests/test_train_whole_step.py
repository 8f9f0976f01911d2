"""One bucket and no penalty: a training step is one compiled program (the bucket's
`bucket_step` body and the update tail), and it trains exactly as the two-dispatch step does."""

import pytest
from helpers import osc_dataset, quiet, train

from hybrid_kernels import _dispatch
from hybrid_kernels._training import _loop, _setup


@pytest.fixture(scope="module")
def one_bucket(oscillator):
    dataset = osc_dataset(oscillator)
    assert len(dataset.bucket_payloads) == 1
    return dataset


@pytest.fixture
def two_dispatches(monkeypatch):
    """Every phase of the next run takes the composed path: `bucket_step`, then the tail."""
    original = _setup.phase_inputs

    def unfused(setup, p):
        return original(setup, p)._replace(fused=False)

    monkeypatch.setattr(_setup, "phase_inputs", unfused)
    monkeypatch.setattr(_loop, "phase_inputs", unfused)


def test_a_one_bucket_step_never_dispatches_bucket_step_on_its_own(
    oscillator, one_bucket, monkeypatch
):
    calls = []
    original = _dispatch._BucketKernel.__call__

    def counting(self, *args, **kwargs):
        calls.append(self._where)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_dispatch._BucketKernel, "__call__", counting)
    history, _ = train(oscillator, one_bucket, quiet(steps=(4,)))
    assert len(history) == 4
    assert calls == []


def test_the_one_program_step_trains_bit_identically_to_the_two_dispatch_step(
    oscillator, one_bucket, request
):
    fused, a = train(oscillator, one_bucket, quiet(steps=(8,)))
    request.getfixturevalue("two_dispatches")
    composed, b = train(oscillator, one_bucket, quiet(steps=(8,)))
    assert list(fused) == list(composed)
    assert float(a[0].omega) == float(b[0].omega)
    assert fused.best_step == composed.best_step
