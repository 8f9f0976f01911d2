"""Pre-flight validation: wrong shapes and bad arguments fail early, naming the bucket."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk

SOLVER = tiny_solver()
P = (Rate(jnp.asarray(0.5)),)


def simulate(predictors, ts, covariates, y0, solver):
    return y0[None, :] * jnp.exp(-predictors[0].k * (ts - ts[0]))[:, None]


def simulate_three_states(predictors, ts, covariates, y0, solver):
    return jnp.tile(simulate(predictors, ts, covariates, y0, solver), (1, 3))


def identity(full):
    return full


def two_channels(full):
    return jnp.concatenate([full, full], axis=-1)


def per_row_loss(pred, bp):
    return jnp.mean((pred - bp.y_observed) ** 2, axis=(1, 2))


def vector_penalty(full, bp):
    return full[:, -1, 0]


@pytest.fixture(scope="module")
def bp():
    exps = [
        hk.make_experiment(
            covariates={},
            channels={"y": hk.ChannelObs(np.linspace(0, 1, 4), np.ones(4))},
            y0_fn=lambda c, ch: np.array([1.0]),
        )
        for _ in range(2)
    ]
    return hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads[0]


def test_a_wrong_simulate_output_names_the_bucket_and_the_expected_shape(bp):
    step = hk.build_bucket_step(simulate_three_states, identity, SOLVER, hk.masked_mse, True)
    with pytest.raises(
        ValueError,
        match=r"simulate_fn returned shape \(4, 3\) for bucket N=2, T=4; "
        r"expected \(4, S\) with S = y0.shape\[-1\] = 1",
    ):
        step(P, bp, 1.0)


def test_a_wrong_number_of_output_channels_names_d(bp):
    score = hk.build_score_bucket(simulate, two_channels, SOLVER, hk.masked_mse)
    with pytest.raises(
        ValueError,
        match=r"state_to_output returned shape \(4, 2\) per experiment for bucket N=2, T=4; "
        r"expected \(4, D\) with D = number of output channels = 1",
    ):
        score(P, bp, 1.0)


def test_a_non_scalar_loss_is_rejected(bp):
    step = hk.build_bucket_step(simulate, identity, SOLVER, per_row_loss, True)
    with pytest.raises(ValueError, match=r"loss_fn returned shape \(2,\) for bucket N=2, T=4"):
        step(P, bp, 1.0)


def test_a_non_scalar_trajectory_penalty_is_rejected(bp):
    score = hk.build_score_bucket(simulate, identity, SOLVER, hk.masked_mse, vector_penalty)
    with pytest.raises(ValueError, match=r"trajectory_penalty_fn returned shape \(2,\)"):
        score(P, bp, 1.0)


def test_a_trainable_mask_of_another_structure_is_rejected(bp):
    mask = hk.trainable_mask((Rate(jnp.asarray(0.5)), Rate(jnp.asarray(1.0))))
    step = hk.build_bucket_step(simulate, identity, SOLVER, hk.masked_mse, mask)
    with pytest.raises(ValueError, match="`trainable` does not have the structure of `predictors`"):
        step(P, bp, 1.0)


def test_a_trainable_mask_with_non_bool_leaves_is_rejected(bp):
    step = hk.build_bucket_step(simulate, identity, SOLVER, hk.masked_mse, (Rate(1.0),))
    with pytest.raises(ValueError, match="mask leaves must be Python bools"):
        step(P, bp, 1.0)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan"), jnp.asarray(0.0)])
def test_a_fraction_outside_zero_one_is_rejected(bp, fraction):
    step = hk.build_score_bucket(simulate, identity, SOLVER, hk.masked_mse)
    with pytest.raises(ValueError, match=r"`length_mask_fraction` must be in \(0, 1\]"):
        step(P, bp, fraction)


def test_a_fraction_of_exactly_one_is_accepted(bp):
    score = hk.build_score_bucket(simulate, identity, SOLVER, hk.masked_mse)
    assert np.isfinite(float(score(P, bp, 1.0)))


def test_a_payload_of_the_wrong_type_is_rejected():
    score = hk.build_score_bucket(simulate, identity, SOLVER, hk.masked_mse)
    with pytest.raises(TypeError, match="`bp` must be a BucketPayload, got dict"):
        score(P, {"ts": jnp.zeros((1, 2))}, 1.0)


def test_non_callable_user_functions_are_rejected_at_build_time():
    with pytest.raises(TypeError, match="`state_to_output` must be callable"):
        hk.build_bucket_step(simulate, None, SOLVER, hk.masked_mse, True)
