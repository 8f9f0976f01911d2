"""Ensemble ranking when a member diverges: non-finite losses rank last and are reported.

The members' training is replaced by a stub that returns scripted final losses, so these tests
check the ranking alone and compile nothing.
"""

import math

import jax
import jax.numpy as jnp
import pytest
from helpers import omega_start, osc_dataset, quiet

import hybrid_kernels as hk
from hybrid_kernels._training import ensembles
from hybrid_kernels._training._loop import RunResult
from hybrid_kernels._training.history import LossHistory

NAN, INF = math.nan, math.inf


@pytest.fixture(scope="module")
def data(oscillator):
    return osc_dataset(oscillator, noise=0.02, seed=5)


@pytest.fixture
def scripted(monkeypatch):
    """Members train to the given final losses, in order; each member's omega is its index."""

    def script(losses):
        calls = iter(range(len(losses)))

        def fake_train(setup, start, **kwargs):
            i = next(calls)
            return RunResult(LossHistory(), (type(start[0])(jnp.asarray(float(i))),), losses[i])

        def fake_tournament(setup, predictors, *, top_k=1, **kwargs):
            return [(0.0, predictors)] * top_k

        monkeypatch.setattr(ensembles, "train", fake_train)
        monkeypatch.setattr(ensembles, "run_tournament", fake_tournament)

    return script


def run(kind, oscillator, data, **kwargs):
    fn = hk.train_seed_ensemble if kind == "seed" else hk.train_bootstrap_ensemble
    return fn(
        omega_start(1.0),
        data,
        quiet(steps=(1,)),
        simulate_fn=oscillator.simulate_fn,
        state_to_output=oscillator.state_to_output,
        solver=oscillator.solver,
        key=jax.random.key(0),
        **kwargs,
    )


def order(members):
    return [int(p[0].omega) for _, p in members]


@pytest.mark.parametrize("kind", ["seed", "boot"])
def test_non_finite_members_rank_after_every_finite_one(kind, scripted, oscillator, data):
    scripted([NAN, 0.5, INF, 0.2])
    count = dict(n_seeds=4) if kind == "seed" else dict(n_bootstraps=4)
    with pytest.warns(RuntimeWarning):
        members = run(kind, oscillator, data, **count)
    assert order(members) == [3, 1, 0, 2]  # finite ascending, then the rest in training order


def test_bootstrap_k_best_never_keeps_a_nan_member_while_a_finite_one_is_left(
    scripted, oscillator, data
):
    scripted([NAN, 0.5, 0.7])
    with pytest.warns(RuntimeWarning):
        members = run("boot", oscillator, data, n_bootstraps=3, k_best=2)
    assert [loss for loss, _ in members] == [0.5, 0.7]


def test_non_finite_members_are_reported_by_warning_and_ui(scripted, oscillator, data):
    scripted([0.1, NAN])
    ui = hk.RecordingUI()
    with pytest.warns(RuntimeWarning, match=r"1 of 2 members ended with a non-finite loss"):
        run("boot", oscillator, data, n_bootstraps=2, ui=ui)
    texts = [e["text"] for e in ui.of("on_message")]
    assert any("bootstrap member 1" in t and "rank last" in t for t in texts)


def test_finite_members_raise_no_warning(scripted, oscillator, data, recwarn):
    scripted([0.3, 0.1])
    members = run("boot", oscillator, data, n_bootstraps=2)
    assert order(members) == [1, 0]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
