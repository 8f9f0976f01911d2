"""Data model: ChannelObs, make_experiment, make_dataset scatter and validation, subsets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk


def exp(exp_id="e", channels=None, covariates=None, y0=(1.0, 0.0), t0=None):
    channels = channels or {"a": hk.ChannelObs([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])}
    return hk.make_experiment(
        covariates={"c": 1.0} if covariates is None else covariates,
        channels=channels,
        y0_fn=lambda cov, ch: jnp.asarray(y0),
        exp_id=exp_id,
        t0=t0,
    )


# --- ChannelObs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(ts=[[0.0]], values=[[1.0]]), "`ts` must be rank-1"),
        (dict(ts=[0.0, 1.0], values=[1.0]), "`values` has shape"),
        (dict(ts=[0.0, np.inf], values=[1.0, 2.0]), "`ts` must be finite"),
        (dict(ts=[0.0, 1.0], values=[1.0, np.nan]), "`values` must be finite"),
        (dict(ts=[0.0, 1.0], values=[1.0, 2.0], variance=0.0), "strictly positive"),
        (dict(ts=[0.0, 1.0], values=[1.0, 2.0], variance=[1.0]), "`variance` must be a scalar"),
    ],
)
def test_channel_obs_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hk.ChannelObs(**kwargs)


def test_replicates_at_one_time_get_one_row_each_and_all_count():
    e = exp(
        channels={
            "a": hk.ChannelObs([0.0, 1.0, 1.0, 1.0], [1.0, 2.0, 2.2, 1.8]),
            "b": hk.ChannelObs([1.0, 1.0, 2.0], [5.0, 6.0, 7.0]),
        }
    )
    bp = hk.make_dataset([e], output_channel_names=["a", "b"]).bucket_payloads[0]
    np.testing.assert_array_equal(bp.ts[0], [0.0, 1.0, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(bp.y_observed[0, :, 0], [1.0, 2.0, 2.2, 1.8, 0.0])
    np.testing.assert_array_equal(bp.mask[0, :, 1], [False, True, True, False, True])
    assert int(bp.n_obs) == 7


def test_channel_obs_broadcasts_a_scalar_variance():
    ch = hk.ChannelObs([0.0, 1.0], [1.0, 2.0], 0.5)
    np.testing.assert_array_equal(ch.variance, [0.5, 0.5])


def test_empty_values_make_a_probe_channel():
    assert hk.ChannelObs([0.0, 1.0], []).is_probe


# --- make_experiment ----------------------------------------------------------------------


def test_make_experiment_rejects_a_matrix_covariate():
    with pytest.raises(ValueError, match=r"'bad'.*covariate 'c' must be rank 0 or 1"):
        exp("bad", covariates={"c": np.ones((2, 2))})


def test_make_experiment_requires_a_rank_1_y0():
    with pytest.raises(ValueError, match=r"'bad'.*rank-1 state"):
        exp("bad", y0=1.0)


def test_make_experiment_passes_jax_covariates_to_y0_fn():
    seen = {}

    def y0_fn(cov, ch):
        seen["type"] = type(cov["c"])
        return jnp.stack([cov["c"], 0.0])

    e = hk.make_experiment(covariates={"c": 2.0}, channels={}, y0_fn=y0_fn)
    assert issubclass(seen["type"], jax.Array)
    np.testing.assert_array_equal(e.y0, [2.0, 0.0])


# --- make_dataset validation ------------------------------------------------------------------


def test_make_dataset_rejects_an_empty_experiment_list():
    with pytest.raises(ValueError, match="`experiments` is empty"):
        hk.make_dataset([], output_channel_names=["a"])


@pytest.mark.parametrize(("names", "match"), [([], "is empty"), (["a", "a"], "repeats a name")])
def test_make_dataset_validates_channel_names(names, match):
    with pytest.raises(ValueError, match=match):
        hk.make_dataset([exp()], output_channel_names=names)


def test_make_dataset_names_the_experiment_missing_a_channel():
    with pytest.raises(ValueError, match=r"experiment 'e2' has no channel\(s\) \['b'\]"):
        hk.make_dataset(
            [
                exp("e1", {"a": hk.ChannelObs([0.0], [1.0]), "b": hk.ChannelObs([0.0], [1.0])}),
                exp("e2"),
            ],
            output_channel_names=["a", "b"],
        )


def test_make_dataset_names_the_experiment_with_other_covariates():
    with pytest.raises(ValueError, match=r"experiment 'e2' has covariates \['d'\]"):
        hk.make_dataset([exp("e1"), exp("e2", covariates={"d": 1.0})], output_channel_names=["a"])


def test_make_dataset_names_the_experiment_with_a_covariate_of_another_shape():
    with pytest.raises(ValueError, match=r"experiment 'e2' covariate 'c' has shape \(2,\)"):
        hk.make_dataset(
            [exp("e1"), exp("e2", covariates={"c": [1.0, 2.0]})], output_channel_names=["a"]
        )


def test_make_dataset_rejects_an_experiment_without_timestamps():
    with pytest.raises(ValueError, match="'e' has no timestamps"):
        hk.make_dataset([exp(channels={"a": hk.ChannelObs([], [])})], output_channel_names=["a"])


def test_make_dataset_rejects_an_unknown_bucket_policy():
    with pytest.raises(ValueError, match="`bucket_policy` must be one of"):
        hk.make_dataset([exp()], output_channel_names=["a"], bucket_policy="magic")


# --- scatter ----------------------------------------------------------------------------------


@pytest.fixture
def two_channel():
    return exp(
        "two",
        {
            "a": hk.ChannelObs([2.0, 0.0], [20.0, 0.5], [0.2, 0.1]),
            "b": hk.ChannelObs([1.0, 2.0], [10.0, 21.0], 3.0),
            "probe": hk.ChannelObs([3.0], []),
            "ignored": hk.ChannelObs([9.0], [9.0]),
        },
    )


def test_union_axis_is_the_sorted_union_of_requested_channels(two_channel):
    ds = hk.make_dataset([two_channel], output_channel_names=["a", "b", "probe"])
    np.testing.assert_array_equal(ds.bucket_payloads[0].ts[0], [0.0, 1.0, 2.0, 3.0])


def test_observations_scatter_to_their_rows_and_channels(two_channel):
    bp = hk.make_dataset([two_channel], output_channel_names=["a", "b", "probe"]).bucket_payloads[0]
    np.testing.assert_array_equal(
        bp.y_observed[0], [[0.5, 0, 0], [0, 10.0, 0], [20.0, 21.0, 0], [0, 0, 0]]
    )
    np.testing.assert_array_equal(bp.mask[0], [[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    assert int(bp.n_obs) == 4


def test_variance_is_scattered_and_unobserved_cells_hold_one(two_channel):
    bp = hk.make_dataset([two_channel], output_channel_names=["a", "b"]).bucket_payloads[0]
    np.testing.assert_allclose(bp.yvar[0], [[0.1, 1.0], [1.0, 3.0], [0.2, 3.0]])


def test_channel_order_controls_the_output_axis(two_channel):
    ab = hk.make_dataset([two_channel], output_channel_names=["a", "b"]).bucket_payloads[0]
    ba = hk.make_dataset([two_channel], output_channel_names=["b", "a"]).bucket_payloads[0]
    np.testing.assert_array_equal(ab.y_observed[..., ::-1], ba.y_observed)


def test_same_decimal_time_in_float32_and_float64_is_one_row():
    e = exp(
        channels={
            "a": hk.ChannelObs(np.array([0.1, 0.3], np.float32), np.array([1.0, 2.0], np.float32)),
            "b": hk.ChannelObs(np.array([0.1, 0.3]), np.array([3.0, 4.0])),
        },
        t0=0.1,
    )
    bp = hk.make_dataset([e], output_channel_names=["a", "b"]).bucket_payloads[0]
    assert bp.ts.shape == (1, 2)
    assert bool(bp.mask.all())


def test_payload_fields_come_in_the_seed_order_then_ours():
    assert hk.BucketPayload._fields == (
        "ts",
        "y_observed",
        "yvar",
        "mask",
        "covariates",
        "y0",
        "n_obs",
        "row_weights",
        "row_lengths",
        "inputs",
        "jump_ts",
        "jumps",
    )


def seed_fields(mask):
    """A payload's seven seed fields, as a user writes them by hand (`mask` is `[N, T, 1]`)."""
    N, T, _ = mask.shape
    return dict(
        ts=jnp.tile(jnp.linspace(0.0, 1.0, T), (N, 1)),
        y_observed=jnp.zeros((N, T, 1)),
        yvar=jnp.ones((N, T, 1)),
        mask=jnp.asarray(mask),
        covariates={},
        y0=jnp.zeros((N, 1)),
        n_obs=jnp.asarray(mask.sum(), jnp.int32),
    )


def test_a_payload_with_only_the_seed_fields_gets_unit_row_weights():
    bp = hk.BucketPayload(**seed_fields(np.ones((2, 3, 1), bool)))
    np.testing.assert_array_equal(bp.row_weights, [1.0, 1.0])
    assert bp.row_weights.dtype == bp.ts.dtype
    assert bp.inputs is None and bp.jump_ts is None


def test_a_payload_with_only_the_seed_fields_reads_row_lengths_from_the_mask():
    mask = np.zeros((3, 5, 1), bool)
    mask[0, :, 0] = True  # observed to the end: the full length
    mask[1, [0, 2], 0] = True  # time-padded after its third row
    bp = hk.BucketPayload(**seed_fields(mask))  # row 2 observes nothing: the full length
    np.testing.assert_array_equal(bp.row_lengths, [5, 3, 5])
    assert bp.row_lengths.dtype == jnp.int32


def test_given_row_weights_and_lengths_are_kept():
    bp = hk.BucketPayload(
        **seed_fields(np.ones((2, 3, 1), bool)),
        row_weights=jnp.asarray([1.0, 0.0]),
        row_lengths=jnp.asarray([3, 2], jnp.int32),
    )
    np.testing.assert_array_equal(bp.row_weights, [1.0, 0.0])
    np.testing.assert_array_equal(bp.row_lengths, [3, 2])


def test_a_bucket_kernel_on_a_seed_payload_matches_the_full_payload(decay):
    # Two lengths in one padded bucket: the shorter row is time-padded, so the default
    # row_lengths must come from the mask for the half-length loss to agree.
    bp = decay.dataset([6, 4], bucket_policy="padded", max_shapes=1).bucket_payloads[0]
    assert bp.ts.shape == (2, 6) and list(bp.row_lengths) == [6, 4]
    by_hand = hk.BucketPayload(*bp[:7])
    step = hk.build_bucket_step(
        decay.simulate_fn, decay.state_to_output, decay.solver, hk.masked_mse, True
    )
    start = (type(decay.predictors[0])(jnp.asarray(0.5)),)
    loss, grads = step(start, bp, 0.5)
    loss_by_hand, grads_by_hand = step(start, by_hand, 0.5)
    assert float(loss_by_hand) == float(loss)
    assert float(grads_by_hand[0].k) == float(grads[0].k)


def test_payload_shapes_and_dtypes(two_channel):
    bp = hk.make_dataset(
        [two_channel, two_channel], output_channel_names=["a", "b"]
    ).bucket_payloads[0]
    assert bp.ts.shape == (2, 3) and bp.y_observed.shape == (2, 3, 2) and bp.y0.shape == (2, 2)
    assert bp.mask.dtype == bool and bp.n_obs.dtype == jnp.int32 and bp.n_obs.shape == ()
    assert bp.covariates["c"].shape == (2,)
    np.testing.assert_array_equal(bp.row_weights, [1.0, 1.0])
    np.testing.assert_array_equal(bp.row_lengths, [3, 3])


def test_rows_of_one_bucket_may_have_different_times_and_masks():
    e1 = exp("e1", {"a": hk.ChannelObs([0.0, 1.0], [1.0, 2.0])})
    e2 = exp("e2", {"a": hk.ChannelObs([5.0, 7.0], [3.0, 4.0])}, t0=5.0)
    ds = hk.make_dataset([e1, e2], output_channel_names=["a"])
    assert len(ds.bucket_payloads) == 1
    np.testing.assert_array_equal(ds.bucket_payloads[0].ts, [[0.0, 1.0], [5.0, 7.0]])
    assert ds.exp_ids == (("e1", "e2"),)


# --- describe / split / bootstrap / failures ---------------------------------------------------


def lengths_dataset(lengths, **kw):
    exps = [
        exp(f"e{i}", {"a": hk.ChannelObs(np.arange(L, dtype=float), np.ones(L))})
        for i, L in enumerate(lengths)
    ]
    return hk.make_dataset(exps, output_channel_names=["a"], **kw)


def test_describe_buckets_has_one_line_per_bucket_with_its_shape():
    text = hk.describe_buckets(lengths_dataset([2, 2, 3], bucket_policy="exact"))
    assert text.splitlines() == [
        "bucket 0: N=2 (2 real), T=2, D=1, mask fill 100.0%",
        "bucket 1: N=1 (1 real), T=3, D=1, mask fill 100.0%",
    ]


def test_split_dataset_partitions_experiments_and_rebuckets_each_split():
    ds = lengths_dataset([2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    train, val, test = hk.split_dataset(ds, key=jax.random.key(0))
    ids = [e.exp_id for part in (train, val, test) for e in part.experiments]
    assert sorted(ids) == sorted(e.exp_id for e in ds.experiments)
    assert (train.n_experiments, val.n_experiments, test.n_experiments) == (8, 1, 1)
    assert sum(len(i) for i in train.exp_ids) == 8


def test_split_dataset_is_deterministic_in_the_key():
    ds = lengths_dataset(range(2, 12))
    a = hk.split_dataset(ds, key=jax.random.key(3))
    b = hk.split_dataset(ds, key=jax.random.key(3))
    assert [x.exp_ids for x in a] == [x.exp_ids for x in b]


def test_an_empty_split_has_no_payloads_and_cannot_be_split_again():
    _, val, _ = hk.split_dataset(
        lengths_dataset([2, 3, 4]), train=0.5, val=0.0, test=0.5, key=jax.random.key(0)
    )
    assert val.bucket_payloads == ()
    with pytest.raises(ValueError, match="holds no experiments"):
        hk.split_dataset(val, key=jax.random.key(0))


@pytest.mark.parametrize(
    ("fracs", "match"),
    [
        (dict(train=0.5, val=0.1, test=0.1), "must be 1"),
        (dict(train=1.2, val=0.0, test=-0.2), "fraction in \\[0, 1\\]"),
        (dict(train=0.9, val=0.05, test=0.05), "`val=0.05` of 3 experiments floors to 0"),
    ],
)
def test_split_dataset_validates_fractions(fracs, match):
    with pytest.raises(ValueError, match=match):
        hk.split_dataset(lengths_dataset([2, 3, 4]), key=jax.random.key(0), **fracs)


def test_bootstrap_draws_with_replacement_and_rebuckets():
    ds = lengths_dataset([2, 3, 4])
    boot = hk.make_bootstrap_dataset(ds, key=jax.random.key(1), n_experiments=7)
    assert boot.n_experiments == 7
    assert {e.exp_id for e in boot.experiments} <= {"e0", "e1", "e2"}


def test_failed_exp_ids_maps_row_flags_to_ids_and_skips_padding_rows():
    ds = lengths_dataset([2, 2, 3], bucket_policy="exact")
    flags = [np.array([False, True]), np.array([True])]
    assert hk.failed_exp_ids(ds, flags) == ("e1", "e2")


def test_failed_exp_ids_rejects_flags_of_the_wrong_shape():
    ds = lengths_dataset([2, 2], bucket_policy="exact")
    with pytest.raises(ValueError, match=r"bucket 0 flags have shape \(3,\), expected \(2,\)"):
        hk.failed_exp_ids(ds, [np.zeros(3, bool)])
