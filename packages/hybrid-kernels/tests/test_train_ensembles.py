"""Seed and bootstrap ensembles."""

import jax
import numpy as np
import pytest
from helpers import omega_start, osc_dataset, quiet

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def data(oscillator):
    return osc_dataset(oscillator, noise=0.02, seed=5)


def run(kind, oscillator, data, config, **kwargs):
    fn = hk.train_seed_ensemble if kind == "seed" else hk.train_bootstrap_ensemble
    return fn(
        omega_start(1.0),
        data,
        config,
        simulate_fn=oscillator.simulate_fn,
        state_to_output=oscillator.state_to_output,
        solver=oscillator.solver,
        key=kwargs.pop("key", jax.random.key(0)),
        **kwargs,
    )


def test_seed_ensemble_trains_the_best_k_of_n_starts_ranked_ascending(oscillator, data):
    config = quiet(steps=(8,), tournament_steps=2, tournament_lr=0.05)
    members = run("seed", oscillator, data, config, n_seeds=4, k_best=2)
    assert len(members) == 2
    losses = [loss for loss, _ in members]
    assert losses == sorted(losses) and all(np.isfinite(losses))
    omegas = [float(p[0].omega) for _, p in members]
    assert omegas[0] != omegas[1]  # different starts, different members


def test_seed_ensemble_is_deterministic_in_the_key(oscillator, data):
    config = quiet(steps=(4,), tournament_steps=1)
    a = run("seed", oscillator, data, config, n_seeds=3, k_best=1)
    b = run("seed", oscillator, data, config, n_seeds=3, k_best=1)
    assert a[0][0] == b[0][0] and float(a[0][1][0].omega) == float(b[0][1][0].omega)


def test_bootstrap_ensemble_one_member_per_resample(oscillator, data):
    members = run("boot", oscillator, data, quiet(steps=(10,)), n_bootstraps=3)
    assert len(members) == 3
    losses = [loss for loss, _ in members]
    assert losses == sorted(losses)
    omegas = {float(p[0].omega) for _, p in members}
    assert len(omegas) > 1  # resampled data, different fits
    assert all(abs(w - 1.3) < 0.1 for w in omegas)


@pytest.mark.slow
def test_bootstrap_ensemble_keeps_the_best_k_overall(oscillator, data):
    every = run("boot", oscillator, data, quiet(steps=(6,)), n_bootstraps=3)
    best = run("boot", oscillator, data, quiet(steps=(6,)), n_bootstraps=3, k_best=2)
    assert [loss for loss, _ in best] == [loss for loss, _ in every[:2]]


def test_bootstrap_with_seed_selection_runs(oscillator, data):
    config = quiet(steps=(4,), tournament_steps=1, tournament_lr=0.05)
    members = run("boot", oscillator, data, config, n_bootstraps=2, n_seeds=2)
    assert len(members) == 2


@pytest.mark.parametrize(
    "kind, kwargs, words",
    [
        ("seed", {"n_seeds": 0}, "`n_seeds` must be an int >= 1"),
        ("seed", {"n_seeds": 2, "k_best": 3}, "k_best=3 must not exceed n_seeds=2"),
        ("boot", {"n_bootstraps": 0}, "`n_bootstraps` must be an int >= 1"),
        ("boot", {"n_bootstraps": 2, "n_seeds": 0}, "`n_seeds` must be an int >= 1"),
        ("boot", {"n_bootstraps": 2, "k_best": 3}, "k_best=3 must not exceed n_bootstraps=2"),
    ],
)
def test_bad_ensemble_sizes_raise(oscillator, data, kind, kwargs, words):
    with pytest.raises(ValueError, match=words):
        run(kind, oscillator, data, quiet(), **kwargs)


@pytest.mark.parametrize(
    "kind, kwargs", [("seed", {}), ("boot", {"n_bootstraps": 2})], ids=["seed", "boot"]
)
def test_ensemble_sizes_must_be_ints_not_floats(oscillator, data, kind, kwargs):
    with pytest.raises(TypeError, match=r"`n_seeds` must be an int, got 2\.0"):
        run(kind, oscillator, data, quiet(), n_seeds=2.0, **kwargs)
