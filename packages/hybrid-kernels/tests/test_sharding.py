"""Several devices: each bucket's experiment axis sharded over 4 forced CPU devices.

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
    from jax.sharding import NamedSharding
    from helpers import Rate, decay_simulate, identity_output, tiny_solver

    assert jax.device_count() == 4
    rng = np.random.default_rng(0)
    exps = []
    for i in range(6):
        ts = np.linspace(0, 2, 7)
        rate = 0.7 * (1 + 0.1 * (i % 3))
        ys = (1 + 0.1 * i) * np.exp(-rate * ts) + 0.01 * rng.standard_normal(7)
        exps.append(hk.make_experiment(
            covariates={{"scale": 1 + 0.1 * (i % 3)}},
            channels={{"y": hk.ChannelObs(ts, ys)}},
            y0_fn=lambda c, ch, i=i: np.array([1 + 0.1 * i]),
            exp_id=f"e{{i}}",
        ))
    auto = hk.make_dataset(exps, output_channel_names=["y"])
    one, two = hk.make_row_mesh(jax.devices()[:1]), hk.make_row_mesh(jax.devices()[:2])
    single = hk.make_dataset(exps, output_channel_names=["y"], mesh=one)
    pair = hk.make_dataset(exps, output_channel_names=["y"], mesh=two)
    (bp4,), (bp1,), (bp2,) = auto.bucket_payloads, single.bucket_payloads, pair.bucket_payloads

    step = hk.build_bucket_step(decay_simulate, identity_output, tiny_solver(), hk.bal_mse, True)
    p = (Rate(jnp.asarray(0.5)),)
    l4, g4 = step(p, bp4, 0.8)
    l1, g1 = step(p, bp1, 0.8)
    print(json.dumps({{
        "n_rows": [bp4.ts.shape[0], bp1.ts.shape[0], bp2.ts.shape[0]],
        "exp_ids": list(auto.exp_ids[0]),
        "row_weights": np.asarray(bp4.row_weights).tolist(),
        "sharded": isinstance(bp4.ts.sharding, NamedSharding)
        and len(bp4.ts.sharding.device_set) == 4,
        "shard_rows": [s.data.shape[0] for s in bp4.ts.addressable_shards],
        "grads_replicated": g4[0].k.sharding.is_fully_replicated,
        "loss": [float(l4), float(l1)],
        "grad": [float(g4[0].k), float(g1[0].k)],
    }}))
    """
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    script = tmp_path_factory.mktemp("sharding") / "run.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_rows_are_padded_to_a_multiple_of_the_device_count(result):
    assert result["n_rows"] == [8, 6, 6]


def test_padding_rows_weigh_zero_and_have_no_id(result):
    assert result["row_weights"] == [1.0] * 6 + [0.0] * 2
    assert result["exp_ids"] == [f"e{i}" for i in range(6)] + ["", ""]


def test_the_experiment_axis_is_split_across_all_four_devices(result):
    assert result["sharded"] and result["shard_rows"] == [2, 2, 2, 2]


def test_gradients_come_back_replicated(result):
    assert result["grads_replicated"]


def test_sharded_loss_and_gradient_equal_the_single_device_ones(result):
    l4, l1 = result["loss"]
    g4, g1 = result["grad"]
    assert l4 == pytest.approx(l1, rel=1e-13, abs=1e-15)
    assert abs(g4 - g1) <= 1e-12
