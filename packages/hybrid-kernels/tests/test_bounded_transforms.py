"""`BoundScaler` under jax transformations, its input violation and the public continuations."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Affine, rate_dataset, rate_train

import hybrid_kernels as hk

TRANSFORMS = ("sigmoid", "algebraic")
WARPS = ("linear", "log")
# Inside, on and beyond both bounds of the first box; inside the second.
X = np.array([[0.2, 3.0], [1.0, 5.0], [4.0, 40.0], [0.05, 99.0], [6.0, 2.0]])
Z = np.array([[-3.0, 0.1], [0.0, 2.0], [1.5, -0.5], [8.0, -8.0], [0.3, 0.7]])


def scaler(transform, warp):
    return hk.BoundScaler([(0.1, 5.0), (2.0, 50.0)], transform=transform, warp=warp)


def _apply(way, fn, arg):
    """`fn` over the rows of `arg` (one row at a time for vmap), the way named."""
    if way == "jit":
        return eqx.filter_jit(fn)(arg)
    if way == "vmap":
        return jax.vmap(fn)(arg)
    return fn(arg)


@pytest.mark.parametrize("way", ["jit", "vmap"])
@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("method", ["to_latent", "from_latent"])
def test_transformed_values_equal_eager_values(method, transform, warp, way):
    s = scaler(transform, warp)
    arg = X if method == "to_latent" else Z
    eager = np.asarray(getattr(s, method)(arg))
    got = np.asarray(_apply(way, getattr(s, method), arg))
    # Beyond the box the algebraic continuation is steep (slopes ~1e7): XLA's fused arithmetic
    # rounds differently from eager code by a few ulps, hence 1e-10 and not bit equality.
    np.testing.assert_allclose(got, eager, rtol=1e-10)
    assert np.all(np.isfinite(eager))


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("method", ["to_latent", "from_latent"])
def test_grad_matches_central_finite_differences(method, transform, warp):
    s = scaler(transform, warp)
    arg = X[:2] if method == "to_latent" else Z  # X[:2]: inside the box, where it is smooth

    def total(a):
        return jnp.sum(getattr(s, method)(a))

    grad = np.asarray(jax.grad(total)(jnp.asarray(arg)))
    h = 1e-6
    fd = np.zeros_like(arg)
    for idx in np.ndindex(arg.shape):
        step = np.zeros_like(arg)
        step[idx] = h
        fd[idx] = (float(total(arg + step)) - float(total(arg - step))) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_grad_through_jit_equals_eager_grad(transform, warp):
    s = scaler(transform, warp)

    def roundtrip(x):
        return jnp.sum(s.from_latent(s.to_latent(x) + 0.1))

    eager = jax.grad(roundtrip)(jnp.asarray(X[:2]))
    jitted = eqx.filter_jit(jax.grad(roundtrip))(jnp.asarray(X[:2]))
    np.testing.assert_allclose(jitted, eager, rtol=1e-12)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_a_log_warped_bounded_predictor_and_its_penalty_run_under_jit(transform):
    predictor = hk.BoundedPredictor(
        eqx.nn.Linear(1, 1, key=jax.random.key(0)),
        in_scaler=hk.BoundScaler([(0.5, 2.0)], warp="log", transform=transform),
        out_scaler=hk.BoundScaler([(0.01, 10.0)], warp="log", transform=transform),
    )
    x = jnp.asarray([1.3])
    np.testing.assert_allclose(eqx.filter_jit(predictor)(x), predictor(x), rtol=1e-12)
    points = (jnp.asarray([[0.6], [1.9]]),)
    pen, grads = hk.build_penalty_step(hk.bound_penalty, hk.trainable_mask((predictor,)))(
        (predictor,), 1.0, points
    )
    assert np.isfinite(float(pen)) and grads[0].inner.weight.shape == (1, 1)


def test_a_log_warped_bounded_predictor_trains_with_the_bound_penalty():
    start = (
        hk.BoundedPredictor(
            Affine(jnp.ones((1,)) * 0.1, jnp.zeros((1,))),
            in_scaler=hk.BoundScaler([(0.5, 2.0)], warp="log"),
            out_scaler=hk.BoundScaler([(0.05, 2.0)], warp="log"),
            input_keys=("scale",),
        ),
    )
    config = hk.OptaxTrainingConfig(steps=(3,), lr=(0.1,), penalty_weight=(1.0,), verbose=False)
    history, _ = rate_train(rate_dataset(), config, start=start)
    assert len(history) == 3 and np.all(np.isfinite(list(history)))
    assert history[-1] < history[0]


def test_a_scaler_can_be_built_inside_jit():
    knee = eqx.filter_jit(lambda t: hk.BoundScaler([(1.0, 2.0)], warp="log").z_knee * t)(2.0)
    assert float(knee) == pytest.approx(2 * np.log(0.95 / 0.05))


# --- input_violation ---------------------------------------------------------------------


def test_input_violation_is_zero_inside_the_box_and_on_its_bounds():
    s = hk.BoundScaler([(0.0, 2.0), (1.0, 3.0)])
    assert float(s.input_violation(jnp.asarray([[0.0, 3.0], [1.0, 2.0]]))) == 0.0


def test_input_violation_is_the_mean_squared_excess_in_box_widths():
    s = hk.BoundScaler([(0.0, 2.0), (1.0, 3.0)])
    # excesses: 1 below (0.5 widths) and 4 above (2 widths) -> (0.25 + 4) / 2
    assert float(s.input_violation(jnp.asarray([-1.0, 7.0]))) == pytest.approx(2.125)


@pytest.mark.parametrize("x, sign", [(-1.0, 1.0), (3.0, -1.0)])
def test_input_violation_gradient_points_back_into_the_box(x, sign):
    s = hk.BoundScaler([(0.0, 2.0)], warp="linear")
    grad = float(jax.grad(lambda v: s.input_violation(v[None]))(jnp.asarray(x)))
    assert sign * -grad > 0  # a descent step moves x towards the box


def test_input_violation_is_finite_for_a_log_warp_below_zero():
    s = hk.BoundScaler([(0.1, 1.0)], warp="log")
    value = eqx.filter_jit(s.input_violation)(jnp.asarray([[-0.9]]))
    assert float(value) == pytest.approx((1.0 / 0.9) ** 2)


def test_input_violation_rejects_a_wrong_number_of_columns():
    with pytest.raises(
        ValueError, match=r"input_violation: x has shape \(3,\); expected \(..., 2\)"
    ):
        hk.BoundScaler([(0.0, 1.0), (0.0, 1.0)]).input_violation(jnp.zeros(3))


# --- soft_logit, soft_clip, straight_through_clip -----------------------------------------


def test_soft_logit_is_the_logit_inside_the_edges():
    s = jnp.asarray([0.1, 0.5, 0.9])
    np.testing.assert_allclose(hk.soft_logit(s), np.log(s / (1 - s)), rtol=1e-12)


def test_soft_logit_is_finite_with_a_positive_slope_at_and_beyond_the_bounds():
    s = jnp.asarray([-0.5, 0.0, 1.0, 1.5])
    slopes = jax.vmap(jax.grad(hk.soft_logit))(s)
    assert np.all(np.isfinite(hk.soft_logit(s))) and np.all(slopes > 0)


def test_soft_logit_matches_the_sigmoid_scalers_latent():
    x = jnp.asarray([[-1.0], [0.5], [3.0]])
    s = hk.BoundScaler([(0.0, 2.0)])
    np.testing.assert_allclose(hk.soft_logit(x / 2.0), s.to_latent(x), rtol=1e-12)


def test_soft_logit_rejects_an_edge_outside_its_range():
    with pytest.raises(ValueError, match="edge must lie in"):
        hk.soft_logit(0.5, edge=0.5)


def test_soft_clip_stays_strictly_inside_with_unit_slope_at_the_centre():
    x = jnp.asarray([-5.0, 1.0, 5.0])
    y = hk.soft_clip(x, 0.0, 2.0)
    assert np.all((y > 0.0) & (y < 2.0)) and float(y[1]) == pytest.approx(1.0)
    assert float(jax.grad(lambda v: hk.soft_clip(v, 0.0, 2.0))(1.0)) == pytest.approx(1.0)


def test_soft_clip_is_strictly_increasing():
    y = np.asarray(hk.soft_clip(jnp.linspace(-5.0, 5.0, 11), -1.0, 1.0))
    assert np.all(np.diff(y) > 0)


def test_straight_through_clip_clips_the_value_and_passes_the_gradient():
    x = jnp.asarray([-1.0, 0.5, 3.0])
    np.testing.assert_array_equal(hk.straight_through_clip(x, 0.0, 1.0), [0.0, 0.5, 1.0])
    grads = jax.vmap(jax.grad(lambda v: hk.straight_through_clip(v, 0.0, 1.0)))(x)
    np.testing.assert_array_equal(grads, [1.0, 1.0, 1.0])
