"""train_with_optax end to end: convergence, phases, recompiles, required arguments."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    OMEGA_TRUE,
    TRACES,
    flag_config,
    flag_start,
    flag_train,
    omega_start,
    osc_dataset,
    quiet,
    train,
)

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def data(oscillator):
    return osc_dataset(oscillator, noise=0.01, seed=1)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


def test_recovers_the_oscillator_frequency_within_two_percent(oscillator, data):
    history, trained = train(oscillator, data, quiet(steps=(80,), lr=(0.05,)))
    omega = float(trained[0].omega)
    assert abs(omega - OMEGA_TRUE) / OMEGA_TRUE < 0.02
    assert history[-1] < 1e-2
    assert len(history) == 80 and all(np.isfinite(history))


def test_history_is_the_raw_per_step_loss_and_starts_at_the_initial_loss(oscillator, clean):
    history, _ = train(oscillator, clean, quiet(steps=(10,), lr=(0.05,)))
    zero_lr, _ = train(oscillator, clean, quiet(steps=(2,), lr=(0.0,)))
    assert history[0] == zero_lr[0] == zero_lr[1]  # step 0 is measured at the start
    assert isinstance(history, list) and isinstance(history, hk.LossHistory)


def test_two_phases_beat_one_phase_of_the_same_length(oscillator, clean):
    one, _ = train(oscillator, clean, quiet(steps=(40,), lr=(0.2,)))
    two, _ = train(oscillator, clean, quiet(steps=(20, 20), lr=(0.2, 0.02)))
    assert len(one) == len(two) == 40
    # the slower second phase settles where the fast one keeps bouncing
    assert np.mean(two[-5:]) < 0.2 * np.mean(one[-5:])
    assert two.phase_starts == [0, 20]


def test_length_schedule_does_not_recompile(clean):
    seen = {}

    class Spy(hk.TrainingUI):
        def on_phase_start(self, *, phase_idx, **kw):
            seen[phase_idx] = TRACES["simulate"]

    before = TRACES["simulate"]
    config = flag_config(steps=(4, 4), length_schedule=(0.5, 1.0))
    history, _ = flag_train(clean, config, ui=Spy())
    assert len(history) == 8
    assert seen[0] - before <= 1  # at most the one compile of this bucket shape
    assert TRACES["simulate"] == seen[0] == seen[1]  # the phase change traced nothing


def test_weak_typed_scalar_leaf_trains_without_retracing(clean):
    start = flag_start()  # strong-typed: compiles the kernels first
    flag_train(clean, flag_config(steps=(2,)), start=start)
    before = TRACES["simulate"]
    weak = eqx.tree_at(lambda p: p[0].omega, start, jnp.asarray(1.0))
    assert weak[0].omega.weak_type
    history, _ = flag_train(clean, flag_config(steps=(5,)), start=weak)
    assert all(np.isfinite(history)) and history[-1] < history[0]
    assert TRACES["simulate"] == before


def test_key_is_required(oscillator, clean):
    with pytest.raises(TypeError, match="key"):
        hk.train_with_optax(
            omega_start(),
            clean,
            quiet(),
            simulate_fn=oscillator.simulate_fn,
            state_to_output=oscillator.state_to_output,
            solver=oscillator.solver,
        )


def test_key_must_be_a_random_key(oscillator, clean):
    with pytest.raises(TypeError, match="JAX random key"):
        train(oscillator, clean, quiet(), key=0)


def test_empty_dataset_raises(oscillator, clean):
    empty = eqx.tree_at(lambda d: d.bucket_payloads, clean, ())
    with pytest.raises(ValueError, match="dataset has no buckets"):
        train(oscillator, empty, quiet())


def test_config_must_be_an_optax_training_config(oscillator, clean):
    with pytest.raises(TypeError, match="OptaxTrainingConfig"):
        train(oscillator, clean, {"steps": (3,)})


def test_frozen_leaf_does_not_move(oscillator, clean):
    start = omega_start(1.0)
    frozen = hk.freeze_paths(hk.trainable_mask(start), ["0.omega"])
    _, trained = train(oscillator, clean, quiet(steps=(3,)), start=start, trainable=frozen)
    assert float(trained[0].omega) == 1.0


def test_filter_function_as_trainable_equals_the_default_mask(oscillator, clean):
    default, _ = train(oscillator, clean, quiet(steps=(4,)))
    filtered, _ = train(oscillator, clean, quiet(steps=(4,)), trainable=eqx.is_inexact_array)
    assert list(default) == list(filtered)


def test_optimizer_factory_and_raw_transformation_both_train(oscillator, clean):
    import optax

    for spec in (optax.adam, optax.adam(0.05)):
        history, _ = train(oscillator, clean, quiet(steps=(10,), optimizer=(spec,)))
        assert history[-1] < history[0]


def test_optimizer_switch_with_reset_trains_through_both_phases(oscillator, clean):
    config = quiet(
        steps=(10, 10),
        lr=(0.05, 0.01),
        optimizer=("adam", "sgd"),
        reset_optimiser_state=(False, True),
    )
    history, _ = train(oscillator, clean, config)
    assert len(history) == 20 and history[-1] < history[0]
