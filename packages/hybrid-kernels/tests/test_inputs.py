"""Start times, time-varying inputs and jump times (issue 13)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk
from hybrid_kernels._kernels import _simulate_with_steps

SWITCHES = ([0.0, 1.3, 2.7], [0.0, 0.55])  # ragged feed logs: padded and masked per bucket
RATES = ([1.0, 3.0, 0.5], [2.0, -1.0])
TS = np.linspace(0.0, 4.0, 9)


def fed(predictors, ts, covariates, y0, solver):
    """dy/dt = feed(t): the exact solution is the integral of the step function."""

    def vf(t, y, args):
        return jnp.ones_like(y) * covariates["feed"](t)

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def exact(switches, rates, ts):
    edges = np.append(switches, np.inf)
    return np.array(
        [
            sum(r * max(0.0, min(t, edges[k + 1]) - edges[k]) for k, r in enumerate(rates))
            for t in ts
        ]
    )


def experiment(i, t0=0.0, kind=hk.piecewise_constant):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(TS[1:], np.ones(8))},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id=f"e{i}",
        t0=t0,
        inputs={"feed": kind(SWITCHES[i], RATES[i])},
    )


SOLVER = hk.SolverConfig(solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=4096, dt0=None)


@pytest.fixture(scope="module")
def bucket():
    ds = hk.make_dataset([experiment(0), experiment(1)], output_channel_names=["y"])
    return ds.bucket_payloads[0]


def solve(bp):
    run = jax.jit(lambda b: _simulate_with_steps(None, b, simulate_fn=fed, solver=SOLVER))
    full, steps = run(bp)
    return np.asarray(full[..., 0]), np.asarray(steps)


# --- t0 -----------------------------------------------------------------------------------


def test_solve_starts_at_t0_for_an_experiment_first_sampled_later():
    e = hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs([2.0, 3.0], [1.0, 1.0])},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id="late",
        t0=0.0,
        inputs={"feed": hk.piecewise_constant([0.0], [1.0])},
    )
    bp = hk.make_dataset([e], output_channel_names=["y"]).bucket_payloads[0]
    np.testing.assert_array_equal(bp.ts[0], [0.0, 2.0, 3.0])
    np.testing.assert_array_equal(bp.mask[0, :, 0], [False, True, True])
    full, _ = solve(bp)
    np.testing.assert_allclose(full[0], [0.0, 2.0, 3.0], atol=1e-9)  # y(t) = t from y(0) = 0


def test_no_t0_and_a_first_sample_after_zero_raises_naming_experiment_channel_and_field():
    with pytest.raises(ValueError, match=r"make_experiment\('late'\).*channel 'y', field `ts`"):
        hk.make_experiment(
            covariates={},
            channels={"y": hk.ChannelObs([2.0, 3.0], [1.0, 1.0])},
            y0_fn=lambda c, ch: jnp.zeros(1),
            exp_id="late",
        )


def test_an_observation_before_t0_raises():
    with pytest.raises(ValueError, match=r"'e'\): channel 'y' has a time 1.0 in `ts` before t0"):
        hk.make_experiment(
            covariates={},
            channels={"y": hk.ChannelObs([1.0, 3.0], [1.0, 1.0])},
            y0_fn=lambda c, ch: jnp.zeros(1),
            exp_id="e",
            t0=2.0,
        )


def test_t0_defaults_to_zero_when_the_first_time_is_zero():
    e = hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs([0.0, 1.0], [1.0, 1.0])},
        y0_fn=lambda c, ch: jnp.zeros(1),
    )
    assert e.t0 == 0.0


# --- inputs --------------------------------------------------------------------------------


def test_ragged_input_logs_are_padded_to_one_length_and_their_jump_times_masked(bucket):
    ts, _ = bucket.inputs["feed"]
    assert ts.shape == (2, 6)
    np.testing.assert_array_equal(bucket.jump_ts, [[1.3, 2.7], [0.55, np.inf]])


def test_piecewise_constant_input_matches_the_exact_solution(bucket):
    full, _ = solve(bucket)
    for i in range(2):
        np.testing.assert_allclose(full[i], exact(SWITCHES[i], RATES[i], TS), atol=1e-9)


def test_jump_times_cut_steps_and_error_against_the_naive_solve(bucket):
    full, steps = solve(bucket)
    naive, naive_steps = solve(bucket._replace(jump_ts=None))
    truth = np.stack([exact(SWITCHES[i], RATES[i], TS) for i in range(2)])
    assert np.abs(full - truth).max() < 1e-9 < np.abs(naive - truth).max()
    assert (steps[:, 1] == 0).all() and (naive_steps[:, 1] > 0).all()  # no rejected steps
    assert steps.sum() < naive_steps.sum() / 3


def test_piecewise_linear_input_is_linear_between_knots_and_flat_outside():
    signal = hk.InputSignal(
        diffrax.LinearInterpolation(
            *map(jnp.asarray, hk.piecewise_linear([1.0, 3.0], [0.0, 2.0]).knots())
        )
    )
    np.testing.assert_allclose([signal(t) for t in (0.0, 1.0, 2.0, 3.0, 5.0)], [0, 0, 1, 2, 2])


def test_piecewise_constant_input_is_right_continuous():
    signal = hk.InputSignal(
        diffrax.LinearInterpolation(
            *map(jnp.asarray, hk.piecewise_constant([0.0, 1.0], [5.0, 7.0]).knots())
        )
    )
    np.testing.assert_allclose([signal(t) for t in (-1.0, 0.999, 1.0, 9.0)], [5, 5, 7, 7])


def test_user_jump_times_on_solver_config_cut_the_rejected_steps(bucket):
    solver = hk.SolverConfig(
        solver=diffrax.Tsit5(),
        rtol=1e-6,
        atol=1e-6,
        max_steps=4096,
        dt0=None,
        jump_ts=(1.3, 2.7),
    )
    run = jax.jit(lambda b: _simulate_with_steps(None, b, simulate_fn=fed, solver=solver))
    _, steps = run(bucket._replace(jump_ts=None))
    assert int(steps[0, 1]) == 0  # row 0 switches at exactly those times


def test_solver_config_rejects_non_finite_jump_times():
    with pytest.raises(ValueError, match="`jump_ts` must be a tuple of finite floats"):
        hk.SolverConfig(
            solver=diffrax.Tsit5(),
            rtol=1e-6,
            atol=1e-6,
            max_steps=10,
            dt0=None,
            jump_ts=(float("inf"),),
        )


def test_solver_config_round_trips_its_jump_times():
    cfg = hk.SolverConfig(
        solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=10, dt0=None, jump_ts=(1.0,)
    )
    assert hk.SolverConfig.from_dict(cfg.to_dict()) == cfg


def test_input_table_rejects_unsorted_times():
    with pytest.raises(ValueError, match="piecewise_constant: `ts` must be non-decreasing"):
        hk.piecewise_constant([1.0, 0.0], [1.0, 2.0])


def test_an_input_named_like_a_covariate_raises():
    with pytest.raises(ValueError, match="input 'feed' is also a covariate"):
        hk.make_experiment(
            covariates={"feed": 1.0},
            channels={"y": hk.ChannelObs([0.0], [1.0])},
            y0_fn=lambda c, ch: jnp.zeros(1),
            inputs={"feed": hk.piecewise_constant([0.0], [1.0])},
        )


def test_experiments_with_different_inputs_raise_in_make_dataset():
    other = hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs([0.0], [1.0])},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id="none",
    )
    with pytest.raises(ValueError, match="experiment 'none' has inputs"):
        hk.make_dataset([experiment(0), other], output_channel_names=["y"])


def test_two_experiments_sharing_an_id_raise():
    with pytest.raises(ValueError, match="id 'e0' \\(field `exp_id`\\) is used by two"):
        hk.make_dataset([experiment(0), experiment(0)], output_channel_names=["y"])


def test_training_kernels_take_inputs_and_their_gradients(bucket):
    def scaled(predictors, ts, covariates, y0, solver):
        (k,) = predictors

        def vf(t, y, args):
            return jnp.ones_like(y) * k * covariates["feed"](t)

        return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys

    step = hk.build_bucket_step(scaled, lambda s: s, SOLVER, hk.masked_mse, (True,))
    loss, (g,) = step((jnp.asarray(1.0),), bucket, 1.0)
    assert np.isfinite(loss) and np.isfinite(g) and g != 0


def test_piecewise_constant_joins_back_to_back_records_at_a_shared_knot():
    # start/stop pairs of two back-to-back infusions: 5 on [0, 1), 3 on [1, 2), then 0
    table = hk.piecewise_constant([0.0, 1.0, 1.0, 2.0], [5.0, 0.0, 3.0, 0.0])
    assert table.ts.tolist() == [0.0, 1.0, 2.0]
    assert table.values.tolist() == [5.0, 3.0, 0.0]


def test_piecewise_constant_keeps_the_last_of_several_records_at_one_time():
    table = hk.piecewise_constant([0.0, 1.0, 1.0, 1.0], [[1.0], [2.0], [3.0], [4.0]])
    assert table.ts.tolist() == [0.0, 1.0]
    assert table.values.tolist() == [[1.0], [4.0]]


def test_piecewise_constant_with_a_shared_knot_reads_the_later_value_at_the_knot():
    table = hk.piecewise_constant([0.0, 1.0, 1.0, 2.0], [5.0, 0.0, 3.0, 0.0])
    signal = hk.InputSignal(diffrax.LinearInterpolation(*map(jnp.asarray, table.knots())))
    assert [float(signal(t)) for t in (0.5, 1.0 - 1e-9, 1.0, 1.5, 2.0)] == pytest.approx(
        [5.0, 5.0, 3.0, 3.0, 0.0]
    )


def test_piecewise_constant_still_refuses_a_decreasing_time():
    with pytest.raises(ValueError, match="piecewise_constant: `ts` must be non-decreasing"):
        hk.piecewise_constant([0.0, 1.0, 1.0, 0.5], [1.0, 2.0, 3.0, 4.0])
