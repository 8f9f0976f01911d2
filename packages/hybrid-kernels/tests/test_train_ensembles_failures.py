"""A seed ensemble whose failed starts leave fewer than `k_best` members says so.

Starts are the tournament's re-initialisations, a standard normal omega each. The model here
returns NaN for a negative omega, so exactly the seeds that draw one fail their tournament
score; which ones is recomputed from the same named key folds.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import omega_start, osc_dataset, oscillator_simulate, quiet

import hybrid_kernels as hk

N_SEEDS = 6
KEY = jax.random.key(0)


def fragile_simulate(predictors, ts, covariates, y0, solver):
    """The oscillator, NaN for a negative omega (a start that cannot be scored)."""
    ys = oscillator_simulate(predictors, ts, covariates, y0, solver)
    return jnp.where(predictors[0].omega < 0, jnp.nan, ys)


def seed_omegas():
    """The omega each seed starts from: the tournament's named folds of the ensemble key."""
    start = omega_start()
    mask = hk.trainable_mask(start)
    key = hk.fold_key(KEY, "seed_ensemble")
    keys = [hk.fold_key(key, f"tournament_attempt_{a}") for a in range(N_SEEDS)]
    return [float(hk.reinitialise(start, mask, k)[0].omega) for k in keys]


@pytest.fixture(scope="module")
def failing(oscillator):
    expected = tuple(a for a, omega in enumerate(seed_omegas()) if omega < 0)
    assert 0 < len(expected) < N_SEEDS  # the key gives a mix, or the test proves nothing
    ui = hk.RecordingUI()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        members = hk.train_seed_ensemble(
            omega_start(1.0),
            osc_dataset(oscillator),
            quiet(steps=(2,), tournament_steps=0),
            simulate_fn=fragile_simulate,
            state_to_output=oscillator.state_to_output,
            solver=oscillator.solver,
            n_seeds=N_SEEDS,
            k_best=N_SEEDS,
            key=KEY,
            ui=ui,
        )
    return members, expected, caught, ui


def test_failed_seeds_leave_fewer_members_than_k_best(failing):
    members, expected, _, _ = failing
    assert len(members) == N_SEEDS - len(expected)
    assert all(np.isfinite(loss) for loss, _ in members)


def test_the_result_records_the_failed_seeds(failing):
    members, expected, _, _ = failing
    assert isinstance(members, hk.EnsembleMembers) and isinstance(members, list)
    assert members.failed_seeds == expected
    assert members.k_best == N_SEEDS


def test_a_warning_and_a_ui_message_name_the_failed_seeds(failing):
    _, expected, caught, ui = failing
    shortfall = [w for w in caught if "k_best" in str(w.message)]
    assert len(shortfall) == 1 and issubclass(shortfall[0].category, RuntimeWarning)
    assert str(list(expected)) in str(shortfall[0].message)
    assert any(str(list(expected)) in m["text"] for m in ui.of("on_message"))
