"""The tournament of re-initialised candidates, and its fallback."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import omega_start, osc_dataset, quiet, train

import hybrid_kernels as hk

BUDGET = dict(steps=(12,), lr=(0.05,))
TOURNAMENT = dict(tournament_attempts=6, tournament_steps=3, tournament_lr=0.05)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


def scores(ui):
    found = [re.search(r"attempt (\d+): score (\S+)", m["text"]) for m in ui.of("on_message")]
    return {int(m.group(1)): float(m.group(2)) for m in found if m}


def test_tournament_beats_a_bad_fixed_start_on_median_and_most_seeds(oscillator, clean):
    bad = omega_start(3.5)  # far from ω = 1.3: a plain run stalls in a poor basin
    fixed, _ = train(oscillator, clean, quiet(**BUDGET), start=bad)
    won = [
        train(oscillator, clean, quiet(**BUDGET, **TOURNAMENT), start=bad, key=jax.random.key(s))[
            0
        ][-1]
        for s in range(5)
    ]
    assert np.median(won) < fixed[-1]
    assert sum(w < fixed[-1] for w in won) >= 3


def test_more_attempts_never_give_a_worse_winner(oscillator, clean):
    def winner(n):
        ui = hk.RecordingUI()
        config = quiet(steps=(1,), lr=(0.0,), **{**TOURNAMENT, "tournament_attempts": n})
        train(oscillator, clean, config, key=jax.random.key(7), ui=ui)
        return min(scores(ui).values())

    assert winner(6) <= winner(2)


def test_attempt_pool_is_not_degenerate(oscillator, clean):
    ui = hk.RecordingUI()
    train(oscillator, clean, quiet(steps=(1,), **TOURNAMENT), ui=ui)
    found = scores(ui)
    assert sorted(found) == list(range(6))
    assert len(set(found.values())) == 6  # every attempt started somewhere else


def test_tournament_is_deterministic_in_the_key(oscillator, clean):
    config = quiet(**BUDGET, **TOURNAMENT)
    a, pa = train(oscillator, clean, config, key=jax.random.key(3))
    b, pb = train(oscillator, clean, config, key=jax.random.key(3))
    c, _ = train(oscillator, clean, config, key=jax.random.key(4))
    assert list(a) == list(b) and float(pa[0].omega) == float(pb[0].omega)
    assert list(a) != list(c)


def test_winner_starts_the_phases(oscillator, clean):
    ui = hk.RecordingUI()
    history, _ = train(oscillator, clean, quiet(steps=(1,), lr=(0.0,), **TOURNAMENT), ui=ui)
    assert history[0] == pytest.approx(min(scores(ui).values()), rel=1e-5)  # printed to 6 digits


def test_every_attempt_failing_falls_back_to_the_start_with_a_warning(oscillator, clean):
    # a NaN observation in a measured cell makes every candidate's score NaN
    bp = clean.bucket_payloads[0]
    poisoned = eqx.tree_at(
        lambda d: d.bucket_payloads,
        clean,
        (bp._replace(y_observed=bp.y_observed.at[0, 1, 0].set(jnp.nan)),),
    )
    start = omega_start(1.1)
    with pytest.warns(RuntimeWarning, match="every attempt failed"):
        history, trained = train(
            oscillator, poisoned, quiet(steps=(2,), max_bad_steps=5, **TOURNAMENT), start=start
        )
    assert float(trained[0].omega) == 1.1  # the start, untouched by the skipped steps
    assert history.bad_steps == [0, 1]


def test_reinitialise_redraws_trainable_leaves_only():
    tree = (hk.BoundScaler([(0.0, 1.0)]), eqx.nn.Linear(3, 2, key=jax.random.key(0)))
    mask = hk.freeze_modules_of_type(hk.trainable_mask(tree), tree, hk.BoundScaler)
    fresh = hk.reinitialise(tree, mask, jax.random.key(1))
    assert float(fresh[0].temperature) == float(tree[0].temperature)
    assert not np.allclose(fresh[1].weight, tree[1].weight)
    assert np.all(np.abs(fresh[1].weight) <= 1 / np.sqrt(3))
    assert fresh[1].weight.shape == (2, 3)


def test_reinitialise_uses_a_module_s_own_method():
    class Own(eqx.Module):
        w: jax.Array

        def reinitialise(self, key):
            return Own(jnp.full_like(self.w, 42.0))

    tree = (Own(jnp.zeros(2)),)
    fresh = hk.reinitialise(tree, hk.trainable_mask(tree), jax.random.key(0))
    assert np.all(fresh[0].w == 42.0)


def test_named_key_folds_are_stable_and_distinct():
    key = jax.random.key(0)
    a, b = hk.fold_key(key, "tournament"), hk.fold_key(key, "tournament")
    c = hk.fold_key(key, "bootstrap_0")
    assert np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(c))
