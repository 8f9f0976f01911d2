"""Built-in losses: formulas, NaN-safety in masked cells, channel options, the registry."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk
from hybrid_kernels._losses import LOSS_REGISTRY


def payload(y, mask, var=None):
    y = jnp.asarray(y, jnp.float64)
    mask = jnp.asarray(mask, bool)
    var = jnp.ones_like(y) if var is None else jnp.asarray(var, jnp.float64)
    N, T, _ = y.shape
    return hk.BucketPayload(
        ts=jnp.tile(jnp.arange(T, dtype=jnp.float64), (N, 1)),
        y_observed=y,
        yvar=var,
        mask=mask,
        covariates={},
        y0=jnp.zeros((N, 1)),
        n_obs=mask.sum().astype(jnp.int32),
        row_weights=jnp.ones((N,)),
        row_lengths=jnp.full((N,), T, jnp.int32),
    )


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(3, 4, 2))
    pred = rng.normal(size=(3, 4, 2))
    mask = rng.random((3, 4, 2)) < 0.6
    mask[2] = False  # a probe experiment: nothing observed
    var = rng.uniform(0.5, 2.0, size=(3, 4, 2))
    return jnp.asarray(pred), payload(y, mask, var), pred, y, mask, var


@pytest.mark.parametrize("name", sorted(LOSS_REGISTRY))
def test_every_loss_returns_a_scalar(data, name):
    pred, bp, *_ = data
    assert LOSS_REGISTRY[name](pred, bp).shape == ()


def test_registry_names_are_the_four_builtins():
    assert set(LOSS_REGISTRY) == {"mse", "mle", "bal_mse", "bal_mle"}


def test_masked_mse_is_the_mean_over_observed_cells(data):
    pred, bp, p, y, m, _ = data
    expected = ((p - y) ** 2)[m].sum() / m.sum()
    assert float(hk.masked_mse(pred, bp)) == pytest.approx(expected, rel=1e-12)


def test_masked_mle_is_the_unnormalised_gaussian_nll_sum(data):
    pred, bp, p, y, m, v = data
    nll = 0.5 * np.log(2 * math.pi * v) + 0.5 * (p - y) ** 2 / v
    assert float(hk.masked_mle(pred, bp)) == pytest.approx(nll[m].sum(), rel=1e-12)


def test_bal_mse_averages_experiments_and_excludes_probes(data):
    pred, bp, p, y, m, _ = data
    per = []
    for n in range(2):  # experiment 2 is a probe and must not count
        e = 0.0
        for d in range(2):
            cells = m[n, :, d]
            e += ((p[n, :, d] - y[n, :, d]) ** 2)[cells].sum() / max(cells.sum(), 1)
        per.append(e)
    assert float(hk.bal_mse(pred, bp)) == pytest.approx(np.mean(per), rel=1e-12)


@pytest.mark.parametrize("name", ["bal_mse", "bal_mle"])
def test_balanced_losses_are_invariant_to_duplicating_experiments(data, name):
    pred, bp, *_ = data
    twice = jax.tree.map(lambda a: jnp.concatenate([a, a]) if a.ndim else a, bp)
    fn = LOSS_REGISTRY[name]
    assert float(fn(jnp.concatenate([pred, pred]), twice)) == pytest.approx(
        float(fn(pred, bp)), rel=1e-12
    )


@pytest.mark.parametrize("name", sorted(LOSS_REGISTRY))
def test_nan_and_inf_in_masked_cells_reach_neither_value_nor_gradient(data, name):
    pred, bp, *_ = data
    fn = LOSS_REGISTRY[name]
    poisoned_pred = jnp.where(bp.mask, pred, jnp.nan)
    poisoned_bp = bp._replace(
        y_observed=jnp.where(bp.mask, bp.y_observed, jnp.inf),
        yvar=jnp.where(bp.mask, bp.yvar, -jnp.inf),
    )
    value, grad = jax.value_and_grad(fn)(poisoned_pred, poisoned_bp)
    assert float(value) == pytest.approx(float(fn(pred, bp)), rel=1e-12)
    assert bool(jnp.all(jnp.isfinite(grad)))
    assert bool(jnp.all(jnp.where(bp.mask, True, grad == 0.0)))


def test_channel_idx_keeps_only_the_selected_channel(data):
    pred, bp, p, y, m, _ = data
    expected = ((p - y) ** 2)[..., 1][m[..., 1]].mean()
    assert float(hk.masked_mse(pred, bp, channel_idx=[1])) == pytest.approx(expected)


def test_channel_weights_scale_their_channel_linearly(data):
    pred, bp, *_ = data
    base0 = hk.masked_mse(pred, bp, channel_weights=[1.0, 0.0])
    base1 = hk.masked_mse(pred, bp, channel_weights=[0.0, 1.0])
    combined = hk.masked_mse(pred, bp, channel_weights=[2.0, 3.0])
    assert float(combined) == pytest.approx(float(2 * base0 + 3 * base1), rel=1e-12)


def test_unit_channel_weights_equal_no_weights(data):
    pred, bp, *_ = data
    for fn in LOSS_REGISTRY.values():
        assert float(fn(pred, bp, channel_weights=[1.0, 1.0])) == pytest.approx(
            float(fn(pred, bp)), rel=1e-12
        )


def test_out_of_range_channel_idx_raises(data):
    pred, bp, *_ = data
    with pytest.raises(ValueError, match=r"channel_idx \[2\] out of range for D = 2"):
        hk.masked_mse(pred, bp, channel_idx=[2])


def test_channel_weights_of_the_wrong_length_raise(data):
    pred, bp, *_ = data
    with pytest.raises(ValueError, match="channel_weights has shape"):
        hk.masked_mse(pred, bp, channel_idx=[0], channel_weights=[1.0, 2.0])


def test_mle_gradient_matches_the_variance_relationship(data):
    # d nll / d pred = r / v on observed cells
    pred, bp, p, y, m, v = data
    grad = np.asarray(jax.grad(hk.masked_mle)(pred, bp))
    np.testing.assert_allclose(grad[m], ((p - y) / v)[m], rtol=1e-12)


def test_resolve_loss_fn_matches_names_case_and_space_insensitively():
    assert hk.resolve_loss_fn(" BAL_MSE ") is hk.bal_mse


def test_resolve_loss_fn_rejects_unknown_names_listing_the_available_ones():
    with pytest.raises(ValueError, match="Unknown loss 'huber'; available"):
        hk.resolve_loss_fn("huber")


def test_resolve_loss_fn_without_channel_options_returns_the_callable_unchanged():
    def custom(pred, bp):
        return jnp.sum(pred)

    assert hk.resolve_loss_fn(custom) is custom


def test_resolve_loss_fn_binds_channel_options_to_a_builtin(data):
    pred, bp, *_ = data
    fn = hk.resolve_loss_fn("mse", channel_idx=[0], channel_weights=[2.0])
    assert float(fn(pred, bp)) == pytest.approx(
        float(hk.masked_mse(pred, bp, channel_idx=[0], channel_weights=[2.0]))
    )
    assert fn == hk.resolve_loss_fn("mse", channel_idx=[0], channel_weights=[2.0])


def test_resolve_loss_fn_projects_a_plain_callable_onto_the_selected_channels(data):
    pred, bp, *_ = data
    seen = {}

    def plain(p, b):
        seen["shapes"] = (p.shape, b.y_observed.shape, b.mask.shape)
        return hk.masked_mse(p, b)

    fn = hk.resolve_loss_fn(plain, channel_idx=[1])
    assert float(fn(pred, bp)) == pytest.approx(float(hk.masked_mse(pred, bp, channel_idx=[1])))
    assert seen["shapes"] == ((3, 4, 1), (3, 4, 1), (3, 4, 1))


def test_resolve_loss_fn_refuses_weights_for_a_plain_callable():
    with pytest.raises(ValueError, match="channel_weights` needs a loss"):
        hk.resolve_loss_fn(lambda p, b: jnp.sum(p), channel_weights=[1.0])
