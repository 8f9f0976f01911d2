"""No accidental recompiles: traces of `simulate_fn` are counted, never timed."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk

TRACES = {"simulate": 0, "update": 0, "penalty": 0}
SOLVER = tiny_solver()


def counting_simulate(predictors, ts, covariates, y0, solver):
    TRACES["simulate"] += 1
    (rate,) = predictors
    return y0[None, :] * jnp.exp(-rate() * (ts - ts[0]))[:, None]


def identity(full):
    return full


def final_sq(full, bp):
    return jnp.mean(full[:, -1] ** 2)


def counting_l2(predictors, points):
    TRACES["penalty"] += 1
    return predictors[0].k ** 2 + sum(jnp.sum(p) for p in points)


def counting_sgd(lr):
    inner = optax.sgd(lr)

    def update(grads, state, params=None):
        TRACES["update"] += 1
        return inner.update(grads, state, params)

    return optax.GradientTransformation(inner.init, update)


def dataset(lengths):
    exps = [
        hk.make_experiment(
            covariates={},
            channels={
                "y": hk.ChannelObs(np.linspace(0, 1, L), np.exp(-0.5 * np.linspace(0, 1, L)))
            },
            y0_fn=lambda c, ch: jnp.array([1.0]),
            exp_id=f"e{i}",
        )
        for i, L in enumerate(lengths)
    ]
    return hk.make_dataset(exps, output_channel_names=["y"], bucket_policy="exact")


@pytest.fixture
def weak_predictors():
    p = (Rate(jnp.asarray(0.3)),)  # jnp.asarray of a Python float is weak-typed
    assert p[0].k.weak_type
    return p


@pytest.fixture
def kernels(weak_predictors):
    mask = hk.trainable_mask(weak_predictors)
    step = hk.build_bucket_step(
        counting_simulate, identity, SOLVER, hk.masked_mse, mask, final_sq, 0.0
    )
    score = hk.build_score_bucket(counting_simulate, identity, SOLVER, hk.masked_mse, final_sq)
    return step, score, mask


def reset():
    for k in TRACES:
        TRACES[k] = 0


def test_one_trace_per_bucket_shape_and_none_on_a_second_pass(kernels, weak_predictors):
    step, _, _ = kernels
    ds = dataset([3, 4, 4, 5])
    reset()
    for bp in ds.bucket_payloads:
        step(weak_predictors, bp, 1.0)
    assert TRACES["simulate"] == 3
    for bp in ds.bucket_payloads:
        step(weak_predictors, bp, 1.0)
    assert TRACES["simulate"] == 3


@pytest.mark.parametrize("penalty", [None, final_sq], ids=["no_penalty", "penalty"])
def test_bucket_step_solves_once_with_or_without_a_trajectory_penalty(penalty, weak_predictors):
    # One `simulate_fn` call per trace is one solve in the compiled program: no penalty adds
    # no solve, and a penalty reads the solve the loss already made.
    step = hk.build_bucket_step(
        counting_simulate, identity, SOLVER, hk.masked_mse, True, penalty, 0.0
    )
    (bp,) = dataset([13]).bucket_payloads  # a shape no other test compiles
    reset()
    step(weak_predictors, bp, 1.0)
    assert TRACES["simulate"] == 1


def test_new_parameter_values_do_not_retrace(kernels, weak_predictors):
    step, _, _ = kernels
    (bp,) = dataset([4]).bucket_payloads
    step(weak_predictors, bp, 1.0)
    reset()
    for k in (0.1, 0.2, 0.9):
        step((Rate(jnp.asarray(k)),), bp, 1.0)
    assert TRACES["simulate"] == 0


def test_changing_fractions_do_not_retrace_whatever_their_python_type(kernels, weak_predictors):
    step, score, _ = kernels
    (bp,) = dataset([4]).bucket_payloads
    step(weak_predictors, bp, 1.0)
    score(weak_predictors, bp, 1.0)
    reset()
    for fraction in (0.5, 1, np.float32(0.25), jnp.asarray(0.75), jnp.asarray(0.3, jnp.float32)):
        step(weak_predictors, bp, fraction)
        score(weak_predictors, bp, fraction)
    assert TRACES["simulate"] == 0


def test_changing_trajectory_penalty_weights_do_not_retrace(kernels, weak_predictors):
    step, score, _ = kernels
    (bp,) = dataset([4]).bucket_payloads
    step(weak_predictors, bp, 1.0)
    score(weak_predictors, bp, 1.0)
    reset()
    for w in (None, 0.0, 1.0, 2.5, jnp.asarray(3.0)):
        step(weak_predictors, bp, 1.0, w)
        score(weak_predictors, bp, 1.0, trajectory_penalty_weight=w)
    assert TRACES["simulate"] == 0


def test_an_update_of_a_weak_typed_scalar_leaf_retraces_nothing(kernels, weak_predictors):
    step, _, mask = kernels
    (bp,) = dataset([9]).bucket_payloads
    opt = counting_sgd(0.1)
    apply_update = hk.build_apply_update(opt, mask)
    state = opt.init(eqx.filter(weak_predictors, mask))
    reset()
    p = weak_predictors
    for _ in range(3):
        _, grads = step(p, bp, 1.0)
        p, state = apply_update(p, grads, state)
    assert TRACES["simulate"] == 1  # the first use of this shape, then never again
    assert TRACES["update"] == 1
    assert not p[0].k.weak_type


def test_penalty_weights_do_not_retrace_but_a_new_point_shape_retraces_only_the_penalty(
    weak_predictors,
):
    penalty_step = hk.build_penalty_step(counting_l2, True)
    reset()
    for w in (0.0, 1.0, jnp.asarray(2.0)):
        penalty_step(weak_predictors, w, (jnp.ones((2, 1)),))
    assert TRACES["penalty"] == 1
    penalty_step(weak_predictors, 1.0, (jnp.ones((5, 1)),))
    assert TRACES["penalty"] == 2 and TRACES["simulate"] == 0


def test_bucket_step_and_score_bucket_each_trace_their_own_copy(kernels, weak_predictors):
    step, score, _ = kernels
    (bp,) = dataset([6]).bucket_payloads
    reset()
    step(weak_predictors, bp, 1.0)
    score(weak_predictors, bp, 1.0)
    assert TRACES["simulate"] == 2


def test_rebuilding_a_kernel_from_equal_arguments_reuses_its_compiled_code(weak_predictors):
    (bp,) = dataset([7]).bucket_payloads
    reset()
    for _ in range(3):
        hk.build_score_bucket(counting_simulate, identity, SOLVER, hk.masked_mse)(
            weak_predictors, bp, 1.0
        )
    assert TRACES["simulate"] == 1


def test_a_different_solver_config_compiles_its_own_kernel(weak_predictors):
    (bp,) = dataset([8]).bucket_payloads
    reset()
    for rtol in (1e-6, 1e-5):
        hk.build_score_bucket(counting_simulate, identity, tiny_solver(rtol=rtol), hk.masked_mse)(
            weak_predictors, bp, 1.0
        )
    assert TRACES["simulate"] == 2


def test_lowering_for_warm_up_traces_once_and_the_call_reuses_the_trace(kernels, weak_predictors):
    step, _, _ = kernels
    (bp,) = dataset([11]).bucket_payloads
    reset()
    compiled = step.lower(weak_predictors, bp, 0.5).compile()
    loss, _ = step(weak_predictors, bp, 0.5)
    assert TRACES["simulate"] == 1
    assert compiled is not None and loss.shape == ()
