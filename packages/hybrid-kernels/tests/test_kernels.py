"""The six public kernels on a tiny diffrax model (exponential decay, N=3, T=8)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Rate, decay_simulate, identity_output

import hybrid_kernels as hk

K_TRUE, K_START = 0.7, 0.5

# One compiled prediction per bucket shape, shared by the tests (eager diffrax is slow).
predict = eqx.filter_jit(hk.predict_bucket_obs)


def sq_final_state(full, bp):
    """A trajectory penalty: mean squared final state over real rows (weighted by row_weights)."""
    w = bp.row_weights
    return jnp.sum(w * full[:, -1, 0] ** 2) / jnp.sum(w)


@pytest.fixture(scope="module")
def setup(decay):
    ds = decay.dataset([8, 8, 8], bucket_policy="exact")
    (bp,) = ds.bucket_payloads
    start = (Rate(jnp.asarray(K_START)),)
    mask = hk.trainable_mask(start)
    step = hk.build_bucket_step(
        decay.simulate_fn,
        decay.state_to_output,
        decay.solver,
        hk.masked_mse,
        mask,
        sq_final_state,
        0.0,
    )
    score = hk.build_score_bucket(
        simulate_fn=decay.simulate_fn,
        state_to_output=decay.state_to_output,
        solver=decay.solver,
        loss_fn=hk.masked_mse,
        trajectory_penalty_fn=sq_final_state,
    )
    return dict(ds=ds, bp=bp, start=start, mask=mask, step=step, score=score, model=decay)


def rate(k):
    return (Rate(jnp.asarray(k)),)


def test_bucket_step_loss_vanishes_at_the_true_parameters(setup):
    loss, _ = setup["step"](rate(K_TRUE), setup["bp"], 1.0)
    assert float(loss) < 1e-10


def test_bucket_step_gradient_matches_central_finite_differences(setup):
    loss, grads = setup["step"](setup["start"], setup["bp"], 1.0)
    h = 1e-5
    up = setup["score"](rate(K_START + h), setup["bp"], 1.0)
    down = setup["score"](rate(K_START - h), setup["bp"], 1.0)
    fd = (float(up) - float(down)) / (2 * h)
    assert float(grads[0].k) == pytest.approx(fd, rel=1e-4)
    assert float(loss) > 0


def test_gradient_has_the_structure_of_the_trainable_part(setup):
    _, grads = setup["step"](setup["start"], setup["bp"], 1.0)
    expected = jax.tree.structure(eqx.filter(setup["start"], setup["mask"]))
    assert jax.tree.structure(grads) == expected


def test_score_bucket_equals_the_bucket_step_loss(setup):
    loss, _ = setup["step"](setup["start"], setup["bp"], 0.6)
    assert float(setup["score"](setup["start"], setup["bp"], 0.6)) == pytest.approx(
        float(loss), rel=1e-12
    )


def test_length_fraction_scores_only_the_prefix(setup):
    bp, start = setup["bp"], setup["start"]
    pred = predict(start, bp, decay_simulate, identity_output, setup["model"].solver)
    keep = 4  # ceil(8 * 0.5)
    expected = np.mean(((np.asarray(pred) - np.asarray(bp.y_observed))[:, :keep]) ** 2)
    assert float(setup["score"](start, bp, 0.5)) == pytest.approx(expected, rel=1e-8)


def test_length_mask_narrows_the_loss_but_never_the_integration(setup):
    # The trajectory penalty reads the final state, far past the cutoff at a quarter of the
    # series: it sees the full-horizon solve, so only the loss was narrowed.
    bp, start = setup["bp"], setup["start"]
    full = predict(start, bp, decay_simulate, identity_output, setup["model"].solver)
    cut = predict(
        start,
        bp._replace(ts=bp.ts[:, :2], y_observed=bp.y_observed[:, :2], mask=bp.mask[:, :2]),
        decay_simulate,
        identity_output,
        setup["model"].solver,
    )
    horizon, truncated = float(sq_final_state(full, bp)), float(sq_final_state(cut, bp))
    assert horizon < 0.5 * truncated  # the two readings are far apart: the test can tell
    charged = setup["score"](start, bp, 0.25, trajectory_penalty_weight=1.0) - setup["score"](
        start, bp, 0.25
    )
    assert float(charged) == pytest.approx(horizon, rel=1e-10)


def test_trajectory_penalty_weight_is_a_call_time_override(setup):
    bp, start = setup["bp"], setup["start"]
    plain = setup["score"](start, bp, 1.0)
    full = predict(start, bp, decay_simulate, identity_output, setup["model"].solver)
    pen = float(sq_final_state(full, bp))
    weighted = setup["score"](start, bp, 1.0, trajectory_penalty_weight=3.0)
    assert float(weighted) == pytest.approx(float(plain) + 3.0 * pen, rel=1e-10)
    loss, _ = setup["step"](start, bp, 1.0, trajectory_penalty_weight=3.0)
    assert float(loss) == pytest.approx(float(weighted), rel=1e-12)


def test_trajectory_penalty_gradient_has_the_sign_that_reduces_it(setup):
    # A larger decay rate shrinks the final state, so the penalty's gradient in k is negative.
    _, g0 = setup["step"](setup["start"], setup["bp"], 1.0, trajectory_penalty_weight=0.0)
    _, g1 = setup["step"](setup["start"], setup["bp"], 1.0, trajectory_penalty_weight=10.0)
    assert float(g1[0].k) < float(g0[0].k)


def test_probe_bucket_has_zero_data_loss_but_a_positive_penalised_loss(setup):
    bp = setup["bp"]
    probe = bp._replace(mask=jnp.zeros_like(bp.mask), n_obs=jnp.asarray(0, jnp.int32))
    assert float(setup["score"](setup["start"], probe, 1.0)) == 0.0
    assert float(setup["score"](setup["start"], probe, 1.0, trajectory_penalty_weight=1.0)) > 0


def test_a_non_zero_weight_without_a_penalty_function_is_rejected(decay):
    with pytest.raises(ValueError, match="`trajectory_penalty_fn` is None"):
        hk.build_bucket_step(
            decay.simulate_fn,
            decay.state_to_output,
            decay.solver,
            hk.masked_mse,
            True,
            trajectory_penalty_weight=1.0,
        )


@pytest.mark.parametrize("weight", [-1.0, float("nan")])
def test_a_negative_or_non_finite_penalty_weight_is_rejected(setup, weight):
    with pytest.raises(ValueError, match="`trajectory_penalty_weight` must be finite and >= 0"):
        setup["score"](setup["start"], setup["bp"], 1.0, trajectory_penalty_weight=weight)


def test_kernels_reject_a_solver_that_is_not_a_solver_config(decay):
    with pytest.raises(TypeError, match="`solver` must be a SolverConfig"):
        hk.build_score_bucket(decay.simulate_fn, decay.state_to_output, "Tsit5", hk.masked_mse)


def test_predict_bucket_obs_returns_n_t_d_and_reproduces_generating_data(setup):
    bp = setup["bp"]
    pred = predict(rate(K_TRUE), bp, decay_simulate, identity_output, setup["model"].solver)
    assert pred.shape == bp.y_observed.shape
    np.testing.assert_allclose(pred, bp.y_observed, atol=1e-6)


def test_padded_times_leave_the_solve_unchanged(decay):
    exps = decay.experiments([5, 8, 8])  # padded to one (3, 8) bucket: the fixture's shape
    exact = hk.make_dataset(exps[:1], output_channel_names=["y"], bucket_policy="exact")
    padded = hk.make_dataset(exps, output_channel_names=["y"], max_shapes=1)
    short = predict(
        rate(K_TRUE), exact.bucket_payloads[0], decay_simulate, identity_output, decay.solver
    )
    both = predict(
        rate(K_TRUE), padded.bucket_payloads[0], decay_simulate, identity_output, decay.solver
    )
    np.testing.assert_allclose(both[0, :5], short[0], rtol=1e-12)
    np.testing.assert_allclose(both[0, 5:], jnp.broadcast_to(short[0, -1], (3, 1)), rtol=1e-12)


# --- penalty_step and apply_update ----------------------------------------------------------


def l2(predictors, points):
    return jnp.sum(
        jnp.asarray(
            [jnp.sum(x**2) for x in jax.tree.leaves(eqx.filter(predictors, eqx.is_inexact_array))]
        )
    )


def test_penalty_step_returns_the_unweighted_penalty_and_weighted_grads():
    step = hk.build_penalty_step(l2, True)
    pen, grads = step(rate(0.5), 2.0)
    assert float(pen) == pytest.approx(0.25)
    assert float(grads[0].k) == pytest.approx(2.0 * 2 * 0.5)


def test_penalty_step_with_zero_weight_reports_the_unweighted_penalty():
    pen, _ = hk.build_penalty_step(l2, True)(rate(0.5), 0.0)
    assert float(pen) == pytest.approx(0.25)


def test_penalty_step_with_zero_weight_has_zero_grads():
    _, grads = hk.build_penalty_step(l2, True)(rate(0.5), 0.0)
    assert float(grads[0].k) == 0.0


def test_penalty_step_passes_points_through_to_the_penalty():
    def at_points(predictors, points):
        return jnp.sum(points[0]) * predictors[0].k

    pen, grads = hk.build_penalty_step(at_points, True)(rate(2.0), 1.0, (jnp.ones((3, 2)),))
    assert float(pen) == pytest.approx(12.0) and float(grads[0].k) == pytest.approx(6.0)


def test_penalty_step_gives_none_gradients_at_frozen_leaves():
    predictors = (Rate(jnp.asarray(1.0)), Rate(jnp.asarray(2.0)))
    mask = hk.freeze_paths(hk.trainable_mask(predictors), ["1"])
    _, grads = hk.build_penalty_step(l2, mask)(predictors, 1.0)
    assert float(grads[0].k) == pytest.approx(2.0) and grads[1].k is None


def test_penalty_fn_must_return_a_scalar():
    step = hk.build_penalty_step(lambda p, pts: jnp.ones(2) * p[0].k, True)
    with pytest.raises(ValueError, match=r"penalty_fn returned shape \(2,\); expected a scalar"):
        step(rate(1.0), 1.0)


def test_apply_update_applies_one_optimiser_step_and_keeps_frozen_leaves():
    predictors = (Rate(jnp.asarray(1.0)), Rate(jnp.asarray(2.0)))
    mask = hk.freeze_paths(hk.trainable_mask(predictors), ["1"])
    opt = optax.sgd(0.1)
    state = opt.init(eqx.filter(predictors, mask))
    grads = (Rate(jnp.asarray(0.5)), Rate(None))
    new, _ = hk.build_apply_update(opt, mask)(predictors, grads, state)
    assert float(new[0].k) == pytest.approx(1.0 - 0.1 * 0.5)
    assert float(new[1].k) == 2.0


def test_custom_loop_step_reduces_the_loss(setup):
    step, bp = setup["step"], setup["bp"]
    opt = optax.adam(0.05)
    apply_update = hk.build_apply_update(opt, setup["mask"])
    p = setup["start"]
    state = opt.init(eqx.filter(p, setup["mask"]))
    first, _ = step(p, bp, 1.0)
    for _ in range(5):
        _, grads = step(p, bp, 1.0)
        p, state = apply_update(p, grads, state)
    assert float(step(p, bp, 1.0)[0]) < float(first)


# --- apply_length_mask --------------------------------------------------------------------


def test_length_mask_keeps_n_obs_consistent_with_the_mask(setup):
    for fraction in (1.0, 0.5, 0.3, 0.01):
        out = hk.apply_length_mask(setup["bp"], fraction)
        assert int(out.n_obs) == int(out.mask.sum())
        assert out.n_obs.dtype == setup["bp"].n_obs.dtype


def test_length_mask_keeps_the_ceiling_prefix_and_at_least_one_row(setup):
    bp = setup["bp"]  # T = 8, fully observed
    assert (
        np.asarray(hk.apply_length_mask(bp, 0.5).mask[0, :, 0]).tolist() == [True] * 4 + [False] * 4
    )
    tiny = hk.apply_length_mask(bp, 0.01).mask
    assert np.asarray(tiny[:, 0]).all() and not np.asarray(tiny[:, 1:]).any()


def test_length_mask_takes_each_rows_prefix_of_its_own_length(decay):
    (bp,) = decay.dataset([4, 8], max_shapes=1).bucket_payloads  # row 0 padded from 4 to 8
    mask = np.asarray(hk.apply_length_mask(bp, 0.5).mask[..., 0])
    assert mask[0].tolist() == [True, True] + [False] * 6
    assert mask[1].tolist() == [True] * 4 + [False] * 4


def test_length_mask_never_unmasks_unobserved_cells(setup):
    bp = setup["bp"]
    holes = bp._replace(mask=bp.mask.at[:, 1].set(False))
    assert not np.asarray(hk.apply_length_mask(holes, 1.0).mask[:, 1]).any()


def test_length_mask_fraction_may_be_traced(setup):
    out = jax.jit(lambda f: hk.apply_length_mask(setup["bp"], f).n_obs)(jnp.asarray(0.25))
    assert int(out) == 3 * 2
