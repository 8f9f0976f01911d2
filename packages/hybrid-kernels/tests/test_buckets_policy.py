"""Bucket policies: exact grouping, bounded padded bins, padding semantics, compile counts."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels._bucketing import choose_bins

TRACES = {"n": 0}


def analytic_decay(predictors, ts, covariates, y0, solver):
    """Closed-form decay: compiles in milliseconds, so many shapes stay cheap to test."""
    TRACES["n"] += 1
    (rate,) = predictors
    return y0[None, :] * jnp.exp(-rate() * covariates["scale"] * (ts - ts[0]))[:, None]


def identity(full):
    return full


def experiments(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, L in enumerate(lengths):
        ts = np.sort(rng.uniform(0, 3, L))
        ys = 1.5 * np.exp(-0.4 * ts) + 0.05 * rng.standard_normal(L)
        out.append(
            hk.make_experiment(
                covariates={"scale": 1.0 + 0.1 * (i % 3)},
                channels={"y": hk.ChannelObs(ts, ys)},
                y0_fn=lambda c, ch: jnp.array([1.5]),
                exp_id=f"e{i}",
                t0=float(ts[0]),
            )
        )
    return out


SOLVER = tiny_solver()  # unused by the closed-form model, required by the kernels
LENGTHS_40 = list(range(41, 1, -1))  # 40 distinct lengths, given in descending order


@pytest.fixture(scope="module")
def forty():
    exps = experiments(LENGTHS_40)
    return (
        hk.make_dataset(exps, output_channel_names=["y"], bucket_policy="exact"),
        hk.make_dataset(exps, output_channel_names=["y"], max_shapes=5),
    )


def test_exact_policy_groups_by_union_length_in_ascending_order():
    ds = hk.make_dataset(
        experiments([4, 3, 4, 5]), output_channel_names=["y"], bucket_policy="exact"
    )
    assert [bp.ts.shape for bp in ds.bucket_payloads] == [(1, 3), (2, 4), (1, 5)]
    assert ds.exp_ids == (("e1",), ("e0", "e2"), ("e3",))


def test_padded_policy_keeps_distinct_lengths_when_they_fit_in_max_shapes():
    ds = hk.make_dataset(experiments([4, 3, 4, 5]), output_channel_names=["y"], max_shapes=3)
    assert [bp.ts.shape for bp in ds.bucket_payloads] == [(1, 3), (2, 4), (1, 5)]


def test_padded_policy_produces_at_most_max_shapes_buckets(forty):
    exact, padded = forty
    assert len(exact.bucket_payloads) == 40
    assert len(padded.bucket_payloads) == 5
    assert sum(int(np.sum(bp.row_weights)) for bp in padded.bucket_payloads) == 40


def test_padded_bins_minimise_padded_cells():
    rng = np.random.default_rng(1)
    for _ in range(30):
        lengths = rng.integers(1, 25, size=rng.integers(4, 12))
        k = int(rng.integers(1, 4))
        bins = choose_bins(lengths, "padded", k)
        distinct = np.unique(lengths)
        best = 0
        if distinct.size > k:
            best = min(
                int((edges[np.searchsorted(edges, lengths)] - lengths).sum())
                for cut in itertools.combinations(distinct[:-1], k - 1)
                for edges in [np.array([*cut, distinct[-1]])]
            )
        assert len(set(bins.tolist())) <= k and np.all(bins >= lengths)
        assert int((bins - lengths).sum()) == best


def test_padded_times_repeat_the_last_time_and_padded_cells_are_masked():
    ds = hk.make_dataset(experiments([2, 3, 5]), output_channel_names=["y"], max_shapes=1)
    (bp,) = ds.bucket_payloads
    row = 0  # length 2, padded to 5
    ts = np.asarray(bp.ts[row])
    assert np.all(ts[2:] == ts[1])
    assert not np.asarray(bp.mask[row, 2:]).any()
    assert np.all(np.asarray(bp.y_observed[row, 2:]) == 0) and np.all(
        np.asarray(bp.yvar[row, 2:]) == 1
    )
    np.testing.assert_array_equal(bp.row_lengths, [2, 3, 5])
    assert int(bp.n_obs) == 10


def test_padded_policy_keeps_input_order_inside_a_bin():
    ds = hk.make_dataset(experiments([5, 2, 3]), output_channel_names=["y"], max_shapes=1)
    assert ds.exp_ids == (("e0", "e1", "e2"),)


def test_max_shapes_must_be_a_positive_int():
    with pytest.raises(ValueError, match="`max_shapes` must be an int >= 1, got 0"):
        hk.make_dataset(experiments([3]), output_channel_names=["y"], max_shapes=0)


def test_max_shapes_must_be_an_int_not_a_float():
    with pytest.raises(TypeError, match=r"`max_shapes` must be an int, got 2\.0"):
        hk.make_dataset(experiments([3]), output_channel_names=["y"], max_shapes=2.0)


def test_forty_lengths_compile_bucket_step_at_most_max_shapes_times(forty):
    _, padded = forty
    predictors = (Rate(jnp.asarray(0.3)),)
    step = hk.build_bucket_step(
        analytic_decay, identity, SOLVER, hk.masked_mse, hk.trainable_mask(predictors)
    )
    TRACES["n"] = 0
    for _ in range(2):
        for bp in padded.bucket_payloads:
            step(predictors, bp, 1.0)
    assert TRACES["n"] <= padded.max_shapes


@pytest.fixture(scope="module")
def eight():
    """Eight distinct lengths, binned into three padded shapes (and eight exact ones)."""
    exps = experiments([9, 3, 7, 4, 12, 5, 10, 6], seed=2)
    return (
        hk.make_dataset(exps, output_channel_names=["y"], bucket_policy="exact"),
        hk.make_dataset(exps, output_channel_names=["y"], max_shapes=3),
    )


@pytest.fixture(scope="module")
def steps():
    """One kernel per loss, shared by every fraction (fractions are traced)."""
    mask = hk.trainable_mask((Rate(jnp.asarray(0.3)),))
    return {
        loss: hk.build_bucket_step(analytic_decay, identity, SOLVER, loss, mask)
        for loss in (hk.masked_mse, hk.bal_mse)
    }


@pytest.mark.parametrize(
    ("loss", "reduction", "fraction"),
    [
        (hk.masked_mse, "per_observation", 1.0),
        (hk.masked_mse, "per_observation", 0.37),
        (hk.bal_mse, "per_experiment", 0.6),
    ],
)
def test_padded_loss_and_grads_equal_the_exact_policy(eight, steps, loss, reduction, fraction):
    predictors = (Rate(jnp.asarray(0.3)),)
    step = steps[loss]

    def objective(ds):
        outs = [step(predictors, bp, fraction) for bp in ds.bucket_payloads]
        w = hk.bucket_weights(ds, reduction, fraction)
        return hk.combine_bucket_grads([o[0] for o in outs], [o[1] for o in outs], w)

    exact, padded = eight
    assert len(padded.bucket_payloads) == 3
    (l_exact, g_exact), (l_pad, g_pad) = objective(exact), objective(padded)
    assert float(l_pad) == pytest.approx(float(l_exact), rel=1e-12)
    assert float(g_pad[0].k) == pytest.approx(float(g_exact[0].k), rel=1e-10)


# --- the default: a cost model picks the number of shapes ------------------------------------


def test_default_policy_gives_a_small_dataset_one_shape():
    ds = hk.make_dataset(experiments([20 + i for i in range(20)]), output_channel_names=["y"])
    assert len(ds.bucket_payloads) == 1 and ds.max_shapes is None


def test_default_policy_splits_very_different_lengths_when_many_steps_are_planned():
    exps = experiments([5] * 30 + [400] * 2)
    few = hk.make_dataset(exps, output_channel_names=["y"], planned_steps=10)
    many = hk.make_dataset(exps, output_channel_names=["y"], planned_steps=100_000)
    assert len(few.bucket_payloads) == 1 and len(many.bucket_payloads) == 2


def test_default_policy_never_exceeds_four_shapes():
    bins = choose_bins(np.arange(10, 2000, 10), "padded", None, planned_steps=10**9)
    assert np.unique(bins).size == 4


def test_planned_steps_must_be_a_positive_int():
    with pytest.raises(ValueError, match="`planned_steps` must be an int"):
        hk.make_dataset(experiments([3]), output_channel_names=["y"], planned_steps=0)
