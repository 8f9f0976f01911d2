"""`make_dataset(process_local=True)` in a single process is the ordinary dataset.

The several-process behaviour is tested in tests-integration/test_processes.py.
"""

import numpy as np
import pytest

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
