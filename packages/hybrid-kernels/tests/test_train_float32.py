"""float32: with x64 off (jax's default) the trainer converges and keeps float32 throughout;
with x64 on, a float32 model stays float32 through L-BFGS.

x64 is process-global and other test modules switch it on, so the x64-off run is a
subprocess.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import LENGTHS, Omega, train

import hybrid_kernels as hk

TESTS = Path(__file__).parent

CHILD = """
    import json
    import jax
    assert not jax.config.read("jax_enable_x64")
    from helpers import omega_start, osc_dataset, oscillator_model, quiet, train

    osc = oscillator_model()
    data = osc_dataset(osc, noise=0.01, seed=1)
    history, trained = train(osc, data, quiet(steps=(80,), lr=(0.05,)), start=omega_start(1.0))
    print(json.dumps({
        "omega": float(trained[0].omega),
        "dtype": str(trained[0].omega.dtype),
        "final": history[-1],
        "bad": history.bad_steps,
    }))
"""


@pytest.mark.slow
def test_float32_training_converges_with_x64_off(tmp_path):
    script = tmp_path / "f32.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "JAX_ENABLE_X64": "0"}
    child = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "float32"
    assert abs(out["omega"] - 1.3) / 1.3 < 0.02
    assert out["final"] < 1e-2 and out["bad"] == []


def test_adam_then_lbfgs_keep_a_float32_model_float32_with_x64_on(oscillator):
    # With x64 on (conftest), optax's line search steps in float64: its trial points and
    # updates must come back to the model's float32, or the solves mix dtypes (diffrax refuses).
    assert jax.config.read("jax_enable_x64")
    experiments = oscillator.experiments(LENGTHS, t1=4.0)
    data = hk.make_dataset(experiments, output_channel_names=[oscillator.channel], dtype="float32")
    config = hk.OptaxTrainingConfig(
        steps=(3, 4), lr=(0.05, 1.0), optimizer=("adam", "lbfgs"), verbose=False
    )
    history, (trained,) = train(oscillator, data, config, start=(Omega(jnp.float32(1.0)),))
    assert trained.omega.dtype == jnp.float32
    assert np.all(np.isfinite(history)) and history[-1] < 1e-3 * history[0]
