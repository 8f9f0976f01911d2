"""float32 trains too: the same problem with a float32 bank, data and solver tolerances."""

import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_problem as P

G_TOLERANCE_F32 = 0.15  # looser than float64: solver tolerances are 1e-5 / 1e-6


@pytest.fixture(scope="module")
def float32_run():
    dataset = P.make_dataset(dtype=jnp.float32)
    hook = P.transition_hook(P.STANDARD_PLAN, P.data_range(dataset), error_budget=1e-3)
    history, bank = P.run_standard(dataset, dtype=jnp.float32, hooks=hook)
    return dataset, history, bank, hook


def test_float32_run_keeps_float32_everywhere(float32_run):
    dataset, _, bank, _ = float32_run
    assert bank.centers.dtype == jnp.float32
    assert all(bp.y_observed.dtype == jnp.float32 for bp in dataset.bucket_payloads)


def test_float32_loss_falls_at_least_100x(float32_run):
    _, history, _, _ = float32_run
    assert np.all(np.isfinite(list(history)))
    assert history[0] / min(history) >= 100.0


def test_float32_learned_term_matches_the_true_term(float32_run):
    dataset, _, bank, _ = float32_run
    assert P.g_error(bank, P.data_range(dataset)) < G_TOLERANCE_F32


def test_float32_exact_commits_change_the_function_by_rounding_only(float32_run):
    _, _, _, hook = float32_run
    for event in hook.events:
        if event.kind in (P.PLAN_KINDS["pair"], P.PLAN_KINDS["birth"]):
            assert event.accepted and event.max_change <= 1e-6, event


_NO_X64_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jax
import hybrid_problem as P
assert not jax.config.jax_enable_x64
size = P.ProblemSize(n_experiments=3, lengths=(8,))
print(json.dumps([e.channels["y"].values.tolist() for e in P.make_experiments(size)]))
"""


def test_the_example_data_build_without_x64():
    # JAX's default, what a new user has: the true solution cannot meet float64 tolerances
    # in float32 (it ran out of solver steps before), so it solves to float32's.
    env = {**os.environ, "JAX_ENABLE_X64": "0", "JAX_PLATFORMS": "cpu"}
    examples = str(pathlib.Path(P.__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", _NO_X64_CHILD, examples],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    values = np.asarray(json.loads(done.stdout.strip().splitlines()[-1]))
    size = P.ProblemSize(n_experiments=3, lengths=(8,))
    exact = np.asarray([e.channels["y"].values for e in P.make_experiments(size)])
    np.testing.assert_allclose(values, exact, rtol=1e-5, atol=1e-6)
