"""State jumps on several devices: a bucket with jumps sharded over 4 forced CPU devices.

Runs in a subprocess because the device count is fixed when jax starts.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import hybrid_kernels as hk
    from helpers import Rate, decay_simulate, identity_output, tiny_solver

    assert jax.device_count() == 4
    exps = []
    for i in range(6):
        ts = np.linspace(0, 2, 7)
        jumps = [hk.StateJump(0.3 * (j + 1) + 0.05 * i, 0, add=0.5) for j in range(i % 3 + 1)]
        exps.append(hk.make_experiment(
            covariates={{"scale": 1.0}},
            channels={{"y": hk.ChannelObs(ts, np.exp(-0.7 * ts))}},
            y0_fn=lambda c, ch: np.array([1.0]),
            exp_id=f"e{{i}}",
            jumps=jumps,
        ))
    four = hk.make_dataset(exps, output_channel_names=["y"])
    mesh1 = hk.make_row_mesh(jax.devices()[:1])
    one = hk.make_dataset(exps, output_channel_names=["y"], mesh=mesh1)
    (bp4,), (bp1,) = four.bucket_payloads, one.bucket_payloads
    step = hk.build_bucket_step(decay_simulate, identity_output, tiny_solver(), hk.bal_mse, True)
    p = (Rate(jnp.asarray(0.5)),)
    l4, g4 = step(p, bp4, 1.0)
    l1, g1 = step(p, bp1, 1.0)
    print(json.dumps({{
        "jump_shards": [s.data.shape[0] for s in bp4.jumps.ts.addressable_shards],
        "loss": [float(l4), float(l1)],
        "grad": [float(g4[0].k), float(g1[0].k)],
    }}))
    """
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    script = tmp_path_factory.mktemp("jumps_sharding") / "run.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_jump_arrays_are_split_across_the_devices_with_the_rows(result):
    assert result["jump_shards"] == [2, 2, 2, 2]


def test_sharded_loss_and_gradient_with_jumps_equal_the_single_device_ones(result):
    l4, l1 = result["loss"]
    g4, g1 = result["grad"]
    assert l4 == pytest.approx(l1, rel=1e-12)
    assert g4 == pytest.approx(g1, rel=1e-10)
