"""`make_dataset(process_local=True)` in a single process is the ordinary dataset, and the
host-side readers gather arrays spread over several processes.

The spread arrays are simulated: a stand-in that refuses to be read directly, as a global
array over other processes' devices does, and a `process_allgather` that hands back its
rows. The several-process behaviour is tested in tests-integration/test_processes.py.
"""

import dataclasses
from types import SimpleNamespace

import diffrax
import jax
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
        experiments=dataset.experiments,
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


def _simulate(predictors, ts, covariates, y0, solver):
    return y0[None, :] + predictors * ts[:, None]


def _identity(state):
    return state


def test_predict_dense_gathers_spread_buckets(dataset, gathered):
    solver = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-6, atol=1e-8, max_steps=64, dt0=0.1)
    spread = dataclasses.replace(
        dataset,
        bucket_payloads=tuple(
            bp._replace(ts=_Spread(bp.ts), y0=_Spread(bp.y0)) for bp in dataset.bucket_payloads
        ),
    )
    slope = np.asarray(0.5)
    got = hk.predict_dense(slope, spread, _simulate, _identity, solver, n_points=7)
    want = hk.predict_dense(slope, dataset, _simulate, _identity, solver, n_points=7)
    assert len(gathered) == 2 * len(dataset.bucket_payloads)  # ts and y0 of every bucket
    for (ts, pred), (ts_want, pred_want) in zip(got, want, strict=True):
        np.testing.assert_array_equal(ts, ts_want)
        np.testing.assert_array_equal(pred, pred_want)


def test_predict_dense_reads_a_whole_dataset_without_gathering(dataset, gathered):
    solver = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-6, atol=1e-8, max_steps=64, dt0=0.1)
    hk.predict_dense(np.asarray(0.5), dataset, _simulate, _identity, solver, n_points=3)
    assert gathered == []


@pytest.mark.parametrize(
    "where, call",
    [
        ("split_dataset", lambda d: hk.split_dataset(d, key=jax.random.key(0))),
        ("split_dataset_by_ids", lambda d: hk.split_dataset_by_ids(d, ["e3"])),
        ("make_bootstrap_dataset", lambda d: hk.make_bootstrap_dataset(d, key=jax.random.key(0))),
    ],
)
def test_subsets_of_a_process_local_dataset_are_refused(dataset, where, call):
    local = dataclasses.replace(dataset, process_local=True)
    with pytest.raises(ValueError, match=rf"^{where}: .*process_local=True.*Split the experiment"):
        call(local)


def test_a_single_process_dataset_is_not_marked_process_local():
    local = hk.make_dataset(_experiments(), output_channel_names=["y"], process_local=True)
    assert local.process_local is False
    assert len(hk.split_dataset_by_ids(local, ["e3"])[1].experiments) == 1
