"""Explicit reductions: bucket weights per rule, and combine_bucket_grads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate

import hybrid_kernels as hk


def experiment(i, L, probe=False):
    ts = np.linspace(0, 1, L)
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(ts, [] if probe else np.sin(ts + i) + 2.0)},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=f"e{i}",
    )


@pytest.fixture(scope="module")
def ds():
    # buckets: T=3 (2 rows), T=5 (1 row + 1 probe), T=10 (1 row)
    exps = [
        experiment(0, 3),
        experiment(1, 3),
        experiment(2, 5),
        experiment(3, 5, probe=True),
        experiment(4, 10),
    ]
    return hk.make_dataset(exps, output_channel_names=["y"], bucket_policy="exact")


def test_per_bucket_weighs_every_bucket_the_same(ds):
    np.testing.assert_allclose(hk.bucket_weights(ds, "per_bucket"), [1 / 3] * 3)


def test_per_observation_weighs_buckets_by_their_observed_cells(ds):
    np.testing.assert_allclose(hk.bucket_weights(ds, "per_observation"), np.array([6, 5, 10]) / 21)


def test_per_observation_counts_only_cells_inside_the_length_mask(ds):
    # cutoffs at 0.5: ceil(1.5)=2, ceil(2.5)=3, ceil(5)=5
    np.testing.assert_allclose(
        hk.bucket_weights(ds, "per_observation", 0.5), np.array([4, 3, 5]) / 12
    )


def test_per_experiment_counts_observed_experiments_not_probes(ds):
    np.testing.assert_allclose(hk.bucket_weights(ds, "per_experiment"), np.array([2, 1, 1]) / 4)


def test_per_experiment_ignores_padding_rows(ds):
    def pad(bp):  # one extra row as the sharding layout adds it: masked, weight 0
        extra = jax.tree.map(lambda a: jnp.concatenate([a, a[:1]]) if a.ndim else a, bp)
        return extra._replace(
            mask=extra.mask.at[-1].set(False), row_weights=extra.row_weights.at[-1].set(0.0)
        )

    class Padded:
        bucket_payloads = tuple(pad(bp) for bp in ds.bucket_payloads)

    np.testing.assert_allclose(
        hk.bucket_weights(Padded, "per_experiment"), hk.bucket_weights(ds, "per_experiment")
    )


def test_per_observation_with_masked_mse_is_the_global_mean(ds):
    losses = [hk.masked_mse(jnp.zeros_like(bp.y_observed), bp) for bp in ds.bucket_payloads]
    grads = [(Rate(jnp.asarray(1.0)),)] * 3
    loss, _ = hk.combine_bucket_grads(losses, grads, hk.bucket_weights(ds, "per_observation"))
    cells = np.concatenate(
        [np.asarray(bp.y_observed)[np.asarray(bp.mask)] for bp in ds.bucket_payloads]
    )
    assert float(loss) == pytest.approx(np.mean(cells**2), rel=1e-12)


def test_combine_bucket_grads_is_the_weighted_sum_and_keeps_none_leaves():
    grads = [(Rate(jnp.asarray(float(b))), Rate(None)) for b in (1, 2, 3)]
    losses = [jnp.asarray(10.0), jnp.asarray(20.0), jnp.asarray(30.0)]
    loss, g = hk.combine_bucket_grads(losses, grads, [0.5, 0.25, 0.25])
    assert float(loss) == pytest.approx(5 + 5 + 7.5)
    assert float(g[0].k) == pytest.approx(0.5 + 0.5 + 0.75)
    assert g[1].k is None


def test_combine_bucket_grads_rejects_weights_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"`weights` has shape \(2,\); expected \(1,\)"):
        hk.combine_bucket_grads([jnp.asarray(1.0)], [(Rate(jnp.asarray(1.0)),)], [0.5, 0.5])


def test_combine_bucket_grads_rejects_mismatched_losses_and_grads():
    with pytest.raises(ValueError, match="got 2 losses but 1 gradient trees"):
        hk.combine_bucket_grads([jnp.asarray(1.0)] * 2, [(Rate(jnp.asarray(1.0)),)], [1.0, 1.0])


def test_an_unknown_reduction_is_rejected(ds):
    with pytest.raises(ValueError, match="`reduction` must be one of"):
        hk.bucket_weights(ds, "per_cell")


def test_a_fraction_outside_zero_one_is_rejected(ds):
    with pytest.raises(ValueError, match=r"`length_mask_fraction` must be in \(0, 1\]"):
        hk.bucket_weights(ds, "per_observation", 0.0)


def test_a_dataset_without_observations_cannot_be_averaged_per_observation():
    ds = hk.make_dataset([experiment(0, 3, probe=True)], output_channel_names=["y"])
    with pytest.raises(ValueError, match="no observed cells"):
        hk.bucket_weights(ds, "per_observation")
