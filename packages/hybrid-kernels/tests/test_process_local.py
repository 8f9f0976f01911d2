"""`make_dataset(process_local=True)` in a single process is the ordinary dataset, and the
host-side readers gather arrays spread over several processes.

The spread arrays are simulated: a stand-in that refuses to be read directly, as a global
array over other processes' devices does, and a `process_allgather` that hands back its
rows. The several-process behaviour is tested in tests-integration/test_processes.py.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from jax.experimental import multihost_utils

import hybrid_kernels as hk


def _experiments():
    return [
        hk.make_experiment(
            covariates={},
            channels={"y": hk.ChannelObs(np.linspace(0.0, 1.0, n), np.ones(n))},
            y0_fn=lambda cov, ch: np.zeros(1),
            exp_id=f"e{n}",
        )
        for n in (3, 5, 6)
    ]


def test_process_local_alone_builds_the_same_dataset():
    plain = hk.make_dataset(_experiments(), output_channel_names=["y"], dtype="float32")
    local = hk.make_dataset(
        _experiments(), output_channel_names=["y"], dtype="float32", process_local=True
    )
    assert local.exp_ids == plain.exp_ids
    for a, b in zip(local.bucket_payloads, plain.bucket_payloads, strict=True):
        np.testing.assert_array_equal(a.y_observed, b.y_observed)


def test_process_local_must_be_a_bool():
    with pytest.raises(TypeError, match="`process_local` must be a bool"):
        hk.make_dataset(_experiments(), output_channel_names=["y"], process_local="yes")


class _Spread:
    """An array whose rows live partly on other processes' devices."""

    is_fully_addressable = False

    def __init__(self, value):
        self.value = np.asarray(value)
        self.shape = self.value.shape

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("spans non-addressable devices")


@pytest.fixture
def gathered(monkeypatch) -> list:
    calls = []

    def allgather(x, tiled=False):
        assert tiled
        calls.append(x)
        return x.value

    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    return calls


@pytest.fixture(scope="module")
def dataset():
    return hk.make_dataset(_experiments(), output_channel_names=["y"], dtype="float64")


def _predictions(dataset):
    return [
        np.asarray(bp.y_observed) + 0.1 * np.arange(bp.y_observed.shape[1])[:, None]
        for bp in dataset.bucket_payloads
    ]


def _spread(dataset):
    payloads = tuple(
        bp._replace(**{f: _Spread(getattr(bp, f)) for f in ("ts", "y_observed", "mask")})
        for bp in dataset.bucket_payloads
    )
    return SimpleNamespace(
        bucket_payloads=payloads,
        exp_ids=dataset.exp_ids,
        output_channel_names=dataset.output_channel_names,
    )


def test_compute_metrics_gathers_spread_arrays(dataset, gathered):
    predictions = _predictions(dataset)
    spread = hk.compute_metrics([_Spread(p) for p in predictions], _spread(dataset))
    np.testing.assert_equal(spread, hk.compute_metrics(predictions, dataset))  # NaN == NaN
    assert gathered


def test_predictions_table_gathers_spread_arrays(dataset, gathered):
    pytest.importorskip("pandas")
    predictions = _predictions(dataset)
    spread = hk.predictions_table(_spread(dataset), [_Spread(p) for p in predictions])
    assert spread.equals(hk.predictions_table(dataset, predictions))
    assert sorted(set(spread["experiment"])) == ["e3", "e5", "e6"]


def test_failed_exp_ids_gathers_spread_flags(dataset, gathered):
    flags = [np.ones(len(ids), bool) for ids in dataset.exp_ids]
    assert hk.failed_exp_ids(dataset, [_Spread(f) for f in flags]) == ("e3", "e5", "e6")
    assert len(gathered) == len(flags)
