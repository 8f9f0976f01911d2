"""Kernels without host callbacks enter JAX's persistent compilation cache; a second process
loads them: throw=False bucket kernels, and the trainer's one-bucket step under throw=True
(traced without callbacks, `_quiet`).

Each run is a fresh subprocess sharing one cache directory. We read JAX's own log line
("Persistent compilation cache hit for '<module>'"), never timings.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    sys.path.insert(0, {tests!r})
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_compilation_cache_dir", {cache!r})
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    log = logging.getLogger("jax._src.compiler")
    log.setLevel(logging.DEBUG)
    log.addHandler(Collect())

    import jax.numpy as jnp
    import hybrid_kernels as hk
    from helpers import Rate, decay_simulate, identity_output, tiny_solver
    import numpy as np

    exps = [
        hk.make_experiment(
            covariates={{"scale": 1.0}},
            channels={{"y": hk.ChannelObs(np.linspace(0, 1, 5), np.exp(-np.linspace(0, 1, 5)))}},
            y0_fn=lambda c, ch: np.array([1.0]),
        )
        for _ in range(2)
    ]
    (bp,) = hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads
    step = hk.build_bucket_step(
        decay_simulate, identity_output, tiny_solver(throw=False, max_steps=64),
        hk.masked_mse, True,
    )
    loss, grads = step((Rate(jnp.asarray(0.5)),), bp, 1.0)
    hits = [m for m in messages if "cache hit" in m and "bucket_step" in m]
    print(json.dumps({{"loss": float(loss), "grad": float(grads[0].k), "hits": hits}}))
    """
)


# The same process preamble, then a two-step training run on one bucket under throw=True.
TRAIN = SCRIPT[: SCRIPT.index("(bp,) =")] + textwrap.dedent(
    """\
        data = hk.make_dataset(exps[:1], output_channel_names=["y"])
        history, (fit,) = hk.train_with_optax(
            (Rate(jnp.asarray(0.5)),), data,
            hk.OptaxTrainingConfig(steps=(2,), lr=(0.05,), verbose=False),
            simulate_fn=decay_simulate, state_to_output=identity_output,
            solver=tiny_solver(throw=True, max_steps=64), key=jax.random.key(0),
        )
        hits = [m for m in messages if "cache hit" in m and "_traced" in m]
        print(json.dumps({{"loss": list(history), "grad": float(fit.k), "hits": hits}}))
    """
)


def run(tmp_path: Path, cache: Path, script_text: str = SCRIPT) -> dict:
    script = tmp_path / "run.py"
    script.write_text(script_text.format(tests=str(Path(__file__).parent), cache=str(cache)))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_loads_the_throw_false_bucket_step_from_the_cache(tmp_path):
    cache = tmp_path / "jax-cache"
    first = run(tmp_path, cache)
    assert first["hits"] == []
    assert any(cache.iterdir()), "the first process wrote no cache entry"
    second = run(tmp_path, cache)
    assert second["hits"], "the second process compiled bucket_step instead of loading it"
    assert second["loss"] == first["loss"] and second["grad"] == first["grad"]


@pytest.mark.slow
def test_a_second_process_loads_the_throwing_one_bucket_training_step_from_the_cache(tmp_path):
    cache = tmp_path / "jax-cache"
    first = run(tmp_path, cache, TRAIN)
    assert first["hits"] == []
    second = run(tmp_path, cache, TRAIN)
    assert second["hits"], "the second process compiled the training step instead of loading it"
    assert second["loss"] == first["loss"] and second["grad"] == first["grad"]
