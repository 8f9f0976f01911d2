"""SolverConfig(throw=False): failed rows are masked, reported by id, and the rest trains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, decay_simulate, identity_output, tiny_solver

import hybrid_kernels as hk

# Few steps: a healthy row needs about 20, an exploding one never finishes.
SOLVER = tiny_solver(throw=False, max_steps=64)
START = (Rate(jnp.asarray(0.5)),)


@pytest.fixture(scope="module")
def bucket(decay):
    good = decay.experiments([6, 6, 6])
    bad = hk.make_experiment(
        covariates={"scale": -3000.0},  # dy/dt = +1500 y: overflows, the solve cannot finish
        channels={"y": hk.ChannelObs(np.linspace(0, 2, 6), np.ones(6))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id="exploding",
    )
    ds = hk.make_dataset([good[0], bad, good[1], good[2]], output_channel_names=["y"])
    return ds, ds.bucket_payloads[0]


@pytest.fixture(scope="module")
def step():
    return hk.build_bucket_step(
        decay_simulate, identity_output, SOLVER, hk.masked_mse, True, return_status=True
    )


def without_row(bp, row, donor=0):
    """The same bucket with `row` replaced by a healthy copy of `donor`, masked out."""

    def swap(a):
        return a.at[row].set(a[donor])

    return bp._replace(
        ts=swap(bp.ts),
        y0=swap(bp.y0),
        covariates={k: swap(v) for k, v in bp.covariates.items()},
        mask=bp.mask.at[row].set(False),
    )


def test_a_failed_row_is_flagged_and_reported_by_experiment_id(bucket, step):
    ds, bp = bucket
    _, _, failed = step(START, bp, 1.0)
    np.testing.assert_array_equal(failed, [False, True, False, False])
    assert hk.failed_exp_ids(ds, [failed]) == ("exploding",)


def test_the_rest_of_the_bucket_trains_as_if_the_failed_row_were_absent(bucket, step):
    _, bp = bucket
    loss, grads, _ = step(START, bp, 1.0)
    ref_loss, ref_grads, ref_failed = step(START, without_row(bp, 1), 1.0)
    assert not bool(ref_failed.any())
    assert np.isfinite(float(loss)) and np.isfinite(float(grads[0].k))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-12)
    assert float(grads[0].k) == pytest.approx(float(ref_grads[0].k), rel=1e-10)


def test_a_non_finite_state_also_counts_as_a_failure(bucket, step):
    _, bp = bucket
    healthy = without_row(bp, 1)
    poisoned = healthy._replace(y0=healthy.y0.at[2].set(jnp.nan))
    loss, grads, failed = step(START, poisoned, 1.0)
    np.testing.assert_array_equal(failed, [False, False, True, False])
    assert np.isfinite(float(loss)) and np.isfinite(float(grads[0].k))


def test_score_bucket_reports_the_same_failures(bucket):
    _, bp = bucket
    score = hk.build_score_bucket(
        decay_simulate, identity_output, SOLVER, hk.masked_mse, return_status=True
    )
    loss, failed = score(START, bp, 1.0)
    np.testing.assert_array_equal(failed, [False, True, False, False])
    assert np.isfinite(float(loss))


def _callbacks(fn, *args):
    return str(jax.make_jaxpr(fn)(*args)).count("callback")


def test_throw_false_kernels_contain_no_host_callbacks(bucket):
    _, bp = bucket
    step = hk.build_bucket_step(decay_simulate, identity_output, SOLVER, hk.masked_mse, True)
    assert _callbacks(lambda p: step(p, bp, 1.0), START) == 0


def test_throw_true_kernels_do_contain_host_callbacks(bucket):
    # The reason throw=True kernels cannot enter JAX's persistent compilation cache.
    _, bp = bucket
    solver = tiny_solver(throw=True, max_steps=64)
    step = hk.build_bucket_step(decay_simulate, identity_output, solver, hk.masked_mse, True)
    assert _callbacks(lambda p: step(p, bp, 1.0), START) > 0


def test_a_bucket_whose_every_row_fails_gives_zero_loss_and_zero_gradient(bucket, step):
    _, bp = bucket
    all_bad = bp._replace(y0=jnp.full_like(bp.y0, jnp.nan))
    loss, grads, failed = step(START, all_bad, 1.0)
    assert bool(failed.all())
    assert float(loss) == 0.0 and float(grads[0].k) == 0.0
