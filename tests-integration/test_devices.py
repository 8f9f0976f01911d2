"""Several devices: the same training on 4 forced CPU devices gives the same loss history."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "examples"
N_DEVICES = 4
RELATIVE_TOLERANCE = 1e-10  # float64; reductions over sharded rows may reorder additions


@pytest.fixture(scope="module")
def four_device_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("devices") / "result.json"
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEVICES}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "devices_child.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_child_saw_four_devices_and_sharded_the_buckets(four_device_run):
    assert four_device_run["devices"] == N_DEVICES
    assert all("NamedSharding" in s for s in four_device_run["shardings"])


def test_four_device_loss_history_matches_one_device(four_device_run, standard_run):
    many = np.asarray(four_device_run["history"])
    one = np.asarray([float(x) for x in standard_run.history])
    assert many.shape == one.shape
    np.testing.assert_allclose(many, one, rtol=RELATIVE_TOLERANCE, atol=0.0)


def test_transitions_commit_on_several_devices(four_device_run, standard_run):
    expected = [[e.step, e.kind, e.accepted] for e in standard_run.hook.events]
    assert four_device_run["events"] == expected
