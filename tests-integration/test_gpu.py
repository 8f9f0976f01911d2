"""The end-to-end problem on CUDA, compared with the CPU (runs only where a GPU is visible)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

import hybrid_problem as P

# float32 on two backends: the first loss agrees to float32 rounding of the solves; after 100
# steps of Adam the runs drift apart but must reach an equally good fit.
FIRST_LOSS_RTOL = 1e-4
FINAL_LOSS_RTOL = 0.25
G_TOLERANCE_F32 = 0.15


def _run_on(device):
    with jax.default_device(device):
        dataset = P.make_dataset(dtype=jnp.float32, mesh=hk.make_row_mesh([device]))
        hook = P.transition_hook(P.STANDARD_PLAN, P.data_range(dataset), error_budget=1e-3)
        history, bank = P.run_standard(dataset, dtype=jnp.float32, hooks=hook)
        return dataset, history, bank, hook


@pytest.fixture(scope="module")
def both_backends():
    return _run_on(jax.devices("gpu")[0]), _run_on(jax.devices("cpu")[0])


@pytest.mark.gpu
def test_gpu_run_trains_and_fits_the_true_term(both_backends):
    (dataset, history, bank, hook), _ = both_backends
    assert history[0] / min(history) >= 100.0
    assert P.g_error(bank, P.data_range(dataset)) < G_TOLERANCE_F32
    assert all(e.accepted for e in hook.events)


@pytest.mark.gpu
def test_gpu_and_cpu_agree_within_float32_tolerance(both_backends):
    (_, gpu_history, _, _), (_, cpu_history, _, _) = both_backends
    np.testing.assert_allclose(gpu_history[0], cpu_history[0], rtol=FIRST_LOSS_RTOL)
    np.testing.assert_allclose(min(gpu_history), min(cpu_history), rtol=FINAL_LOSS_RTOL)
