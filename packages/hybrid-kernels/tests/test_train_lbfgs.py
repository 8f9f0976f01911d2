"""train_with_optax phases with optimisers that need the objective: Adam, then L-BFGS by name,
as an instance and as a factory, on a noise-free two-parameter fit (float64)."""

import equinox as eqx
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


def fit(dataset, second, ui=None, hooks=None, **config):
    config = hk.OptaxTrainingConfig(
        steps=(ADAM_STEPS, LBFGS_STEPS),
        lr=(0.05, 1.0),
        optimizer=("adam", second),
        verbose=False,
        **config,
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
        hooks=hooks,
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


def test_a_stored_lbfgs_step_reads_the_line_search_state_and_holds_no_solve(dataset, monkeypatch):
    # optax.value_and_grad_from_state would put the whole gradient program in a cond branch
    # that never runs here but compiles at the first stored step (seconds per model).
    from hybrid_kernels._training import _engine

    programs = []
    read = _engine.stored_value_and_grad

    def spy(*args):
        programs.append(str(eqx.filter_make_jaxpr(read)(*args)[0]))
        return read(*args)

    monkeypatch.setattr(_engine, "stored_value_and_grad", spy)
    history, _ = fit(dataset, "lbfgs")
    assert len(programs) == LBFGS_STEPS - 1
    assert not any("while" in p or "cond" in p for p in programs)
    assert history[-1] < 1e-10 * history[ADAM_STEPS - 1]


class _Parameters:
    """A hook keeping the parameters after every step (the next step's starting point)."""

    def __init__(self):
        self.after, self.events = [], []

    def between_steps(self, step, predictors, opt_state):
        self.after.append(predictors)
        return predictors, opt_state


@pytest.mark.slow
def test_stored_lbfgs_steps_split_the_penalty_from_the_loss(dataset):
    def pull(predictors, points):
        (m,) = predictors
        return (m.k - 0.5) ** 2

    kept = _Parameters()
    history, _ = fit(dataset, "lbfgs", hooks=kept, penalty_fn=pull, penalty_weight=(0.0, 0.3))
    data_loss = hk.build_objective(
        dataset, simulate_fn=amplitude_simulate, state_to_output=identity_output, solver=TIGHT
    )
    # Stored steps are every L-BFGS step after the first; each reports at the parameters the
    # step before ended with.
    for step in range(ADAM_STEPS + 1, ADAM_STEPS + LBFGS_STEPS):
        start = kept.after[step - 1]
        np.testing.assert_allclose(history.penalties[step], float(pull(start, ())), rtol=1e-12)
        np.testing.assert_allclose(history[step], float(data_loss(start)), rtol=1e-9)
