"""float32 trains too: the same problem with a float32 bank, data and solver tolerances."""

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
