"""Several devices: the trainer runs on the sharded dataset with replicated parameters."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

CHILD = """
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_enable_x64", True)
    from helpers import oscillator_model, quiet, train
    import hybrid_kernels as hk

    assert jax.device_count() == 4
    osc = oscillator_model()
    exps = osc.experiments((10, 10, 10), t1=4.0, noise=0.01, seed=1)
    sharded = hk.make_dataset(exps, output_channel_names=["x"])  # every visible device
    single = hk.make_dataset(
        exps, output_channel_names=["x"], mesh=hk.make_row_mesh(jax.devices()[:1])
    )
    config = quiet(steps=(2, 4), lr=(0.05, 0.02), length_schedule=(0.5, 1.0))
    h4, p4 = train(osc, sharded, config)
    h1, p1 = train(osc, single, config)
    bp = sharded.bucket_payloads[0]
    print(json.dumps({
        "rows": int(bp.ts.shape[0]),
        "bucket_devices": len(bp.ts.sharding.device_set),
        "param_devices": len(p4[0].omega.sharding.device_set),
        "h4": list(h4), "h1": list(h1),
        "omega4": float(p4[0].omega), "omega1": float(p1[0].omega),
    }))
"""


@pytest.mark.slow
def test_training_on_four_devices_matches_one_device(tmp_path):
    script = tmp_path / "devices.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    env.pop("XLA_FLAGS", None)
    child = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["rows"] == 4  # three experiments padded to a multiple of the device count
    assert out["bucket_devices"] == 4 and out["param_devices"] == 4
    assert len(out["h4"]) == len(out["h1"]) == 6
    for a, b in zip(out["h4"], out["h1"], strict=True):
        assert a == pytest.approx(b, rel=1e-10)
    assert out["omega4"] == pytest.approx(out["omega1"], rel=1e-10)
