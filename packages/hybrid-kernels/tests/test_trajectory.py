"""Trajectory-penalty helpers: widening the state, integrating rates, reading them back."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_kernels import (
    BoundedPredictor,
    BoundScaler,
    ChannelObs,
    SolverConfig,
    attach_penalty_state,
    build_bucket_step,
    make_dataset,
    make_experiment,
    masked_mse,
    penalty_integral,
    penalty_vector_field,
    strip_penalty_state,
    trainable_mask,
    trajectory_saturation_penalty,
)


def decay(t, y, args):
    return -y


def test_attach_then_strip_round_trips_the_physical_state():
    y0 = jnp.array([1.0, 2.0])
    widened = attach_penalty_state(y0, 3)
    np.testing.assert_array_equal(widened, [1.0, 2.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(strip_penalty_state(widened, 3), y0)
    assert attach_penalty_state(y0.astype(jnp.float32)).dtype == jnp.float32


def test_penalty_integral_is_the_time_integral_of_the_rate():
    # x' = -x from x(0) = 1, penalty rate x^2: integral over [0, 2] is (1 - e^-4) / 2.
    vf = penalty_vector_field(decay, lambda t, y, args: y[:1] ** 2)
    ts = jnp.linspace(0.0, 2.0, 5)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        diffrax.Tsit5(),
        0.0,
        2.0,
        0.01,
        attach_penalty_state(jnp.array([1.0])),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12),
    )
    np.testing.assert_allclose(penalty_integral(sol.ys, 1), [(1 - np.exp(-4.0)) / 2], rtol=1e-8)
    np.testing.assert_allclose(strip_penalty_state(sol.ys)[:, 0], np.exp(-ts), rtol=1e-8)
    batched = jnp.stack([sol.ys, 2 * sol.ys])  # [N, T, S]
    assert penalty_integral(batched, 1).shape == (2, 1)


def test_penalty_vector_field_gives_physics_only_the_physical_components():
    seen = {}

    def physics(t, y, args):
        seen["shape"] = y.shape
        return -y

    vf = penalty_vector_field(physics, lambda t, y, args: jnp.array([1.0, 2.0]))
    out = vf(0.0, jnp.array([3.0, 0.0, 0.0]), None)
    assert seen["shape"] == (1,)
    np.testing.assert_array_equal(out, [-3.0, 1.0, 2.0])


@pytest.mark.parametrize(
    ("penalty_rhs", "state", "match"),
    [
        (lambda t, y, a: jnp.float64(1.0), jnp.ones(3), "rank-1 array of at least one rate"),
        (lambda t, y, a: jnp.zeros((0,)), jnp.ones(3), "rank-1 array of at least one rate"),
        (lambda t, y, a: jnp.ones(3), jnp.ones(3), "no physical component"),
    ],
)
def test_penalty_vector_field_rejects_bad_rates(penalty_rhs, state, match):
    with pytest.raises(ValueError, match=match):
        penalty_vector_field(decay, penalty_rhs)(0.0, state, None)


def test_penalty_vector_field_checks_the_physics_shape():
    vf = penalty_vector_field(lambda t, y, a: jnp.ones(5), lambda t, y, a: jnp.ones(1))
    with pytest.raises(ValueError, match=r"base_rhs returned shape \(5,\); expected \(2,\)"):
        vf(0.0, jnp.ones(3), None)


@pytest.mark.parametrize("n", [0, -1])
def test_accumulator_count_must_be_at_least_one(n):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        attach_penalty_state(jnp.ones(2), n)


@pytest.mark.parametrize("n", [1.5, True])
def test_accumulator_count_must_be_an_int(n):
    with pytest.raises(TypeError, match="must be an int, got"):
        attach_penalty_state(jnp.ones(2), n)


def test_strip_and_integral_need_a_physical_component():
    with pytest.raises(ValueError, match="more than 2 entries"):
        strip_penalty_state(jnp.ones((4, 2)), 2)
    with pytest.raises(ValueError, match="time axis"):
        penalty_integral(jnp.ones(3), 1)


def test_trajectory_saturation_penalty_sums_over_time_and_is_zero_inside_the_knee():
    scaler = BoundScaler([(0.0, 1.0)])
    calm = jnp.full((2, 4, 1), 0.5)
    assert trajectory_saturation_penalty(calm, scaler) == 0.0
    # One experiment sits at 0.999 for two time rows: logit(0.999) exceeds the knee.
    excess = (np.log(0.999 / 0.001) - scaler.z_knee) ** 2
    saturated = calm.at[0, 1:3, 0].set(0.999)
    # Per time row, the mean over the 2 experiments; summed over the 2 saturated rows.
    np.testing.assert_allclose(
        trajectory_saturation_penalty(saturated, scaler), 2 * excess / 2, rtol=1e-6
    )


def test_trajectory_saturation_penalty_gradient_pushes_away_from_the_bound():
    scaler = BoundScaler([(0.0, 1.0)])
    grad = jax.grad(lambda v: trajectory_saturation_penalty(v, scaler))(jnp.full((3, 1), 0.999))
    assert jnp.all(grad > 0)  # descending lowers the value, away from the upper bound


def test_trajectory_saturation_penalty_checks_the_output_columns():
    with pytest.raises(ValueError, match=r"expected \(\.\.\., T, 1\)"):
        trajectory_saturation_penalty(jnp.ones((4, 2)), BoundScaler([(0.0, 2.0)]))


# --- the recipe end to end, through a training kernel --------------------------------------


class Shift(eqx.Module):
    offset: jax.Array

    def __call__(self, z):
        return z + self.offset


def _embedded_rate(offset):
    return (
        BoundedPredictor(
            Shift(jnp.asarray([offset])),
            in_scaler=BoundScaler([(0.0, 2.0)]),
            out_scaler=BoundScaler([(0.0, 1.0)]),
        ),
    )


def _simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors

    def physics(t, y, args):
        return -rate(y) * y

    def saturation(t, y, args):  # the embedded predictor's latent, at the current state
        return rate.out_scaler.saturation(rate.latent(y[:-1]))[None]

    term = diffrax.ODETerm(penalty_vector_field(physics, saturation))
    return solver.diffeqsolve(term, ts, y0).ys


def _observe(state):
    return strip_penalty_state(state, 1)


def _integrated_penalty(full, bp):
    return jnp.sum(bp.row_weights * penalty_integral(full, 1)[:, 0])


@pytest.fixture(scope="module")
def embedded():
    experiment = make_experiment(
        covariates={},
        channels={"y": ChannelObs([0.0, 0.5, 1.0], [1.0, 0.8, 0.6])},
        y0_fn=lambda cov, ch: attach_penalty_state(jnp.array([1.0]), 1),
    )
    (bp,) = make_dataset([experiment], output_channel_names=("y",)).bucket_payloads
    solver = SolverConfig(
        diffrax.Tsit5(),
        rtol=1e-6,
        atol=1e-8,
        max_steps=64,
        dt0=0.1,
        adjoint=diffrax.DirectAdjoint(),
    )
    step = build_bucket_step(
        _simulate,
        _observe,
        solver,
        masked_mse,
        trainable_mask(_embedded_rate(0.0)),
        _integrated_penalty,
        1.0,
    )
    return step, bp


def test_trajectory_penalty_charges_only_a_saturated_embedded_predictor(embedded):
    step, bp = embedded
    calm, saturated = _embedded_rate(0.0), _embedded_rate(6.0)
    assert step(calm, bp, 1.0, 1.0)[0] == step(calm, bp, 1.0, 0.0)[0]
    assert step(saturated, bp, 1.0, 1.0)[0] > step(saturated, bp, 1.0, 0.0)[0]


def test_trajectory_penalty_gradient_moves_the_latent_out_of_saturation(embedded):
    step, bp = embedded
    saturated = _embedded_rate(6.0)
    with_penalty = step(saturated, bp, 1.0, 1.0)[1][0].inner.offset
    without = step(saturated, bp, 1.0, 0.0)[1][0].inner.offset
    assert float((with_penalty - without)[0]) > 0  # descent lowers the saturated latent
