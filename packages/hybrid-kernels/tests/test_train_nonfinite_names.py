"""Under SolverConfig(throw=True), a non-finite step names its cause: the experiments whose
predictions were non-finite, or an optimiser update that overflowed (issue 22, item 4)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, decay_simulate, identity_output, tiny_solver

import hybrid_kernels as hk

SOLVER = tiny_solver(throw=True, max_steps=64)
TIMES = np.linspace(0.0, 2.0, 6)


def experiment(exp_id, scale=1.0, amplitude=1.0):
    return hk.make_experiment(
        covariates={"scale": scale},
        channels={"y": hk.ChannelObs(TIMES, amplitude * np.exp(-0.7 * TIMES))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=exp_id,
    )


def poisoned_simulate(predictors, ts, covariates, y0, solver):
    # A model that gives NaN for the experiments it cannot handle (scale < 0), solve intact.
    ys = decay_simulate(predictors, ts, {"scale": jnp.abs(covariates["scale"])}, y0, solver)
    return jnp.where(covariates["scale"] < 0, jnp.nan, 1.0) * ys


def train(dataset, simulate_fn=decay_simulate, **config):
    config.setdefault("verbose", False)
    return hk.train_with_optax(
        (Rate(jnp.asarray(0.5)),),
        dataset,
        hk.OptaxTrainingConfig(**config),
        simulate_fn=simulate_fn,
        state_to_output=identity_output,
        solver=SOLVER,
        key=jax.random.key(0),
    )


def test_non_finite_predictions_under_throw_name_their_experiments():
    data = hk.make_dataset(
        [experiment("e0"), experiment("poisoned", -1.0)], output_channel_names=["y"]
    )
    with pytest.raises(hk.NonFiniteTrainingError, match=r"\['poisoned'\]") as info:
        train(data, poisoned_simulate, steps=(4,), lr=(0.01,), max_bad_steps=2)
    assert info.value.exp_ids == ("poisoned",)
    assert info.value.history.failed == {0: ("poisoned",), 1: ("poisoned",)}


def test_an_overflowing_update_is_named_an_update_problem_and_not_applied():
    # Observations 1e3 times the model's: the gradient is large, so sgd at 1e308 overflows.
    data = hk.make_dataset(
        [experiment("e0", amplitude=1e3), experiment("e1", 1.2, amplitude=1e3)],
        output_channel_names=["y"],
    )
    with pytest.raises(
        hk.NonFiniteTrainingError,
        match=r"at step 0: the optimiser update \(optimizer 'sgd', learning rate 1e\+308\) "
        r"made trainable parameter\(s\) \['\[0\]\.k'\] non-finite.*update problem",
    ) as info:
        train(data, steps=(3,), lr=(1e308,), optimizer=("sgd",))
    assert info.value.leaves == ("[0].k",)
    assert float(info.value.predictors[0].k) == 0.5  # the overflowed update was never applied


def test_a_huge_finite_update_that_breaks_the_solve_names_the_experiments():
    # k jumps to about 1e308: finite, but no solve can finish. The fused step's callback
    # error must surface as the named solve failure, not as "INTERNAL: CpuCallback error".
    data = hk.make_dataset([experiment("e0"), experiment("e1", 1.2)], output_channel_names=["y"])
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"solve failed for experiment") as info:
        train(data, steps=(3,), lr=(1e308,), optimizer=("sgd",))
    assert info.value.exp_ids == ("e0", "e1")
