"""build_objective: the whole training objective as one function, equal to what the trainer
reports and descends (every bucket, the reduction, the penalty), usable by optax's L-BFGS."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    RATE_SOLVER,
    TIGHT,
    Decay,
    Rate,
    amplitude_dataset,
    amplitude_simulate,
    bounded_rate,
    identity_output,
    lbfgs_loop,
    rate_dataset,
    rate_mask,
    rate_simulate,
    rate_train,
)

import hybrid_kernels as hk


def anchored(predictors, points):
    """A penalty that is not the bound penalty: pulls k towards 0.5."""
    (rate,) = predictors
    return (rate.k - 0.5) ** 2


@pytest.fixture(scope="module")
def two_buckets(decay):
    ds = decay.dataset((4, 10, 10), bucket_policy="exact")
    assert len(ds.bucket_payloads) == 2
    return ds


def decay_objective(decay, dataset, **kwargs):
    return hk.build_objective(
        dataset,
        simulate_fn=decay.simulate_fn,
        state_to_output=decay.state_to_output,
        solver=decay.solver,
        **kwargs,
    )


def start(k=0.4):
    return (Rate(jnp.asarray(k)),)


def first_step(decay, dataset, **config):
    """The trainer's reported loss and penalty at `start()` (one step at rate 0)."""
    c = hk.OptaxTrainingConfig(steps=(1,), lr=(0.0,), verbose=False, **config)
    history, _ = hk.train_with_optax(
        start(),
        dataset,
        c,
        simulate_fn=decay.simulate_fn,
        state_to_output=decay.state_to_output,
        solver=decay.solver,
        key=jax.random.key(0),
    )
    return history[0], history.penalties[0]


@pytest.mark.parametrize("reduction", ["per_bucket", "per_observation"])
def test_objective_equals_the_trainers_loss_plus_weighted_penalty_over_every_bucket(
    decay, two_buckets, reduction
):
    loss, penalty = first_step(
        decay, two_buckets, reduction=reduction, penalty_fn=anchored, penalty_weight=(0.3,)
    )
    objective = decay_objective(
        decay, two_buckets, reduction=reduction, penalty_fn=anchored, penalty_weight=0.3
    )
    assert penalty > 0
    np.testing.assert_allclose(float(objective(start())), loss + 0.3 * penalty, rtol=1e-12)


def test_objective_with_the_bound_penalty_equals_the_trainers_at_its_data_points():
    ds = rate_dataset()
    predictors = (bounded_rate(4.0),)
    c = hk.OptaxTrainingConfig(steps=(1,), lr=(0.0,), penalty_weight=(0.5,), verbose=False)
    history, _ = rate_train(ds, c, start=predictors)
    points = hk.select_penalty_points(hk.data_penalty_points(predictors, ds))
    objective = hk.build_objective(
        ds,
        simulate_fn=rate_simulate,
        state_to_output=identity_output,
        solver=RATE_SOLVER,
        trainable=rate_mask(predictors),
        penalty_weight=0.5,
        penalty_points=points,
    )
    assert history.penalties[0] > 0
    expected = history[0] + 0.5 * history.penalties[0]
    np.testing.assert_allclose(float(objective(predictors)), expected, rtol=1e-12)


def test_objective_gradient_matches_central_differences(decay, two_buckets):
    objective = decay_objective(decay, two_buckets, penalty_fn=anchored, penalty_weight=0.3)
    value, grads = jax.value_and_grad(objective)(start())
    h = 1e-5
    fd = (objective(start(0.4 + h)) - objective(start(0.4 - h))) / (2 * h)
    assert float(value) == float(objective(start()))
    np.testing.assert_allclose(float(grads[0].k), float(fd), rtol=1e-6)


def test_frozen_leaves_get_no_gradient(decay, two_buckets):
    objective = decay_objective(
        decay, two_buckets, trainable=(Rate(False),), penalty_fn=anchored, penalty_weight=0.3
    )
    grads = jax.grad(objective)(start())
    assert float(grads[0].k) == 0.0


def test_objective_is_jittable_and_compiles_once(decay, two_buckets):
    objective = decay_objective(decay, two_buckets)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def value(predictors):
        return objective(predictors)

    for k in (0.3, 0.5, 0.7):
        value(start(k))
    assert float(value(start(0.7))) < 1e-10


def test_build_objective_refuses_an_unknown_reduction(decay, two_buckets):
    with pytest.raises(ValueError, match=r"reduction='mean'.*per_bucket"):
        decay_objective(decay, two_buckets, reduction="mean")


# --- a custom loop with L-BFGS (as in docs/hybrid-kernels/custom-loop.md) ----------------


@pytest.mark.slow
def test_custom_loop_lbfgs_on_build_objective_lands_on_the_truth():
    ds = amplitude_dataset()
    objective = hk.build_objective(
        ds, simulate_fn=amplitude_simulate, state_to_output=identity_output, solver=TIGHT
    )
    predictors = (Decay(jnp.asarray(0.4), jnp.asarray(1.5)),)
    params, frozen = eqx.partition(predictors, hk.trainable_mask(predictors))

    def value_fn(params):
        return objective(eqx.combine(params, frozen))

    params, _ = lbfgs_loop(value_fn, params, 40)
    (fitted,) = eqx.combine(params, frozen)
    np.testing.assert_allclose(float(fitted.k), 0.7, rtol=1e-6)
    np.testing.assert_allclose(float(fitted.a), 2.0, rtol=1e-6)


def test_apply_update_gives_lbfgs_the_objective_on_the_trainable_leaves():
    ds = amplitude_dataset()
    mask = (Decay(True, False),)  # the amplitude is frozen at its true value
    objective = hk.build_objective(
        ds, simulate_fn=amplitude_simulate, state_to_output=identity_output, solver=TIGHT
    )
    params = (Decay(jnp.asarray(0.4), jnp.asarray(2.0)),)
    opt = optax.lbfgs()
    apply_update = hk.build_apply_update(opt, mask)
    state = opt.init(eqx.filter(params, mask))
    for _ in range(20):
        value, grads = jax.value_and_grad(objective)(params)
        grads = eqx.filter(grads, mask)
        params, state = apply_update(params, grads, state, value=value, value_fn=objective)
    np.testing.assert_allclose(float(params[0].k), 0.7, rtol=1e-6)
    assert float(params[0].a) == 2.0


def test_apply_update_refuses_value_fn_without_value():
    opt = optax.lbfgs()
    params = (Decay(jnp.asarray(0.4), jnp.asarray(2.0)),)
    apply_update = hk.build_apply_update(opt, (Decay(True, True),))
    with pytest.raises(TypeError, match="value_fn needs value"):
        apply_update(params, params, opt.init(params), value_fn=lambda p: jnp.asarray(1.0))


def test_apply_update_gives_value_alone_to_reduce_on_plateau():
    opt = optax.chain(optax.sgd(1.0), optax.contrib.reduce_on_plateau(factor=0.5, patience=1))
    params = (Decay(jnp.asarray(0.4), jnp.asarray(2.0)),)
    apply_update = hk.build_apply_update(opt, (Decay(True, True),))
    state, grads = opt.init(params), jax.tree.map(jnp.ones_like, params)
    scales = []
    for value in (3.0, 2.0, 2.0, 2.0):  # two improvements, then no progress for two updates
        _, state = apply_update(params, grads, state, value=jnp.asarray(value))
        scales.append(float(state[1].scale))
    assert scales == [1.0, 1.0, 0.5, 0.25]  # patience 1: each update without progress halves
