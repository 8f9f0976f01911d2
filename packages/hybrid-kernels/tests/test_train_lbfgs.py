"""train_with_optax phases with optimisers that need the objective: Adam, then L-BFGS by name,
as an instance and as a factory, on a noise-free two-parameter fit (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import TIGHT, Decay, amplitude_dataset, amplitude_simulate, identity_output

import hybrid_kernels as hk

ADAM_STEPS, LBFGS_STEPS = 10, 25


@pytest.fixture(scope="module")
def dataset():
    return amplitude_dataset(k=0.7, a=2.0)


def fit(dataset, second, ui=None):
    config = hk.OptaxTrainingConfig(
        steps=(ADAM_STEPS, LBFGS_STEPS),
        lr=(0.05, 1.0),
        optimizer=("adam", second),
        verbose=False,
    )
    return hk.train_with_optax(
        (Decay(jnp.asarray(0.4), jnp.asarray(1.5)),),
        dataset,
        config,
        simulate_fn=amplitude_simulate,
        state_to_output=identity_output,
        solver=TIGHT,
        key=jax.random.key(0),
        ui=ui,
    )


# The factory form (`optax.lbfgs`) is not trained separately: the name resolves to that very
# factory (checked below) and then takes the same path; a factory's own path is trained in
# test_train_convergence. An instance skips the injected learning rate, so it is trained here.
@pytest.mark.parametrize("second", ["lbfgs", optax.lbfgs()], ids=["name", "instance"])
def test_adam_then_lbfgs_lands_on_the_truth(dataset, second):
    history, (fitted,) = fit(dataset, second)
    np.testing.assert_allclose(float(fitted.k), 0.7, rtol=1e-5)
    np.testing.assert_allclose(float(fitted.a), 2.0, rtol=1e-5)
    assert history[-1] < 1e-10 * history[ADAM_STEPS - 1]


def test_the_name_lbfgs_is_the_optax_lbfgs_factory():
    from hybrid_kernels._training.config import OPTIMIZER_REGISTRY

    assert OPTIMIZER_REGISTRY["lbfgs"] is optax.lbfgs
    config = hk.OptaxTrainingConfig(steps=(1,), lr=(1.0,), optimizer=(optax.lbfgs,))
    assert config.optimizer == (optax.lbfgs,)  # accepted as a factory, not rejected


def test_progress_counts_one_step_per_lbfgs_update(dataset):
    ui = hk.RecordingUI()
    history, _ = fit(dataset, "lbfgs", ui=ui)
    steps = [e["step"] for e in ui.of("on_step_end")]
    assert steps == list(range(ADAM_STEPS + LBFGS_STEPS))
    assert len(history) == ADAM_STEPS + LBFGS_STEPS
    assert history.phase_starts == [0, ADAM_STEPS]


def test_a_chain_ending_in_a_backtracking_line_search_descends_after_adam(dataset):
    line_search = optax.chain(
        optax.sgd(1.0), optax.scale_by_backtracking_linesearch(max_backtracking_steps=20)
    )
    history, _ = fit(dataset, line_search)
    assert len(history) == ADAM_STEPS + LBFGS_STEPS
    assert history[-1] < 0.1 * history[ADAM_STEPS - 1]


def test_lbfgs_steps_after_the_first_reuse_the_line_searchs_value(dataset, monkeypatch):
    from hybrid_kernels._training import _engine

    reused = []
    stored_step = _engine.Engine.stored_step

    def spy(self, *args):
        out = stored_step(self, *args)
        reused.append(out is not None)
        return out

    monkeypatch.setattr(_engine.Engine, "stored_step", spy)
    history, _ = fit(dataset, "lbfgs")
    # The compile step, the Adam steps and the first L-BFGS step run the bucket steps.
    assert reused.count(True) == LBFGS_STEPS - 1
    assert reused[-(LBFGS_STEPS - 1) :] == [True] * (LBFGS_STEPS - 1)
    assert all(np.isfinite(history[ADAM_STEPS:]))
