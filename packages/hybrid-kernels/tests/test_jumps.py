"""State jumps: `make_experiment(jumps=...)` applied by `solver.diffeqsolve` inside the kernels.

The reference is the closed form of `dy/dt = -k y` between jumps: `y(t) = y(t_j) e^{-k (t - t_j)}`,
and `y ← scale · y + add` at each jump, right-continuously.
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, identity_output

import hybrid_kernels as hk

K = 0.8
TOL = 1e-8
SOLVER = hk.SolverConfig(
    solver=diffrax.Tsit5(),
    rtol=1e-11,
    atol=1e-12,
    max_steps=4096,
    dt0=None,
    adjoint=diffrax.DirectAdjoint(),
)
TRUE = (Rate(jnp.asarray(K)),)


def simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors
    return solver.diffeqsolve(diffrax.ODETerm(lambda t, y, a: -rate() * y), ts, y0).ys


def closed_form(ts, y0, jumps, t0=0.0, k=K):
    """`y(t)` at each of `ts`, right-continuous, with `jumps` applied in the given order."""
    out = []
    for t in ts:
        y, s = y0, t0
        for j in sorted(jumps, key=lambda j: j.time):  # stable: list order at ties
            if j.time > t:
                break
            y = y * np.exp(-k * (j.time - s))
            y = j.scale * y + j.add
            s = j.time
        out.append(y * np.exp(-k * (t - s)))
    return np.asarray(out)


def experiment(exp_id, ts, jumps, y0=1.0, t0=0.0):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(ts, np.zeros(len(ts)))},
        y0_fn=lambda c, ch: np.array([y0]),
        exp_id=exp_id,
        t0=t0,
        jumps=jumps,
    )


def predict(experiments, solver=SOLVER, **kwargs):
    ds = hk.make_dataset(experiments, output_channel_names=["y"], **kwargs)
    (bp,) = ds.bucket_payloads
    return bp, np.asarray(hk.predict_bucket(TRUE, bp, simulate, identity_output, solver))[..., 0]


TS = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
BOLUSES = [hk.StateJump(0.5, 0, add=2.0), hk.StateJump(1.2, 0, add=1.0)]


def test_boluses_match_the_closed_form_before_at_and_after_each_jump():
    _, pred = predict([experiment("a", TS, BOLUSES)])
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, BOLUSES), rtol=TOL, atol=TOL)
    # right-continuous: the sample at t = 0.5 sees the dose
    assert pred[0, 2] > 2.0


def test_a_scale_jump_multiplies_the_state():
    jumps = [hk.StateJump(1.0, 0, scale=0.25)]
    _, pred = predict([experiment("a", TS, jumps)])
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, jumps), rtol=TOL, atol=TOL)


def test_several_jumps_at_one_time_apply_in_list_order():
    empty_then_dose = [hk.StateJump(0.5, 0, scale=0.0), hk.StateJump(0.5, 0, add=3.0)]
    dose_then_empty = empty_then_dose[::-1]
    _, pred = predict([experiment("a", TS, empty_then_dose), experiment("b", TS, dose_then_empty)])
    np.testing.assert_allclose(pred[0, 2], 3.0, rtol=TOL)
    np.testing.assert_allclose(pred[1, 2], 0.0, atol=TOL)


def test_a_jump_at_t0_is_seen_by_the_first_sample():
    jumps = [hk.StateJump(0.0, 0, add=4.0)]
    _, pred = predict([experiment("a", TS, jumps)])
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, jumps), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(pred[0, 0], 5.0, rtol=TOL)


def test_jumps_after_the_last_sample_change_nothing():
    _, pred = predict([experiment("a", TS, [hk.StateJump(5.0, 0, add=9.0)])])
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, []), rtol=TOL, atol=TOL)


def test_experiments_with_different_jump_counts_share_one_bucket():
    many = [hk.StateJump(t, 0, add=0.5) for t in (0.3, 0.6, 0.9)]
    exps = [
        experiment("three", TS, many),
        experiment("one", TS, BOLUSES[:1]),
        experiment("none", TS, []),
    ]
    bp, pred = predict(exps)
    assert bp.jumps.ts.shape == (3, 8)  # padded to a power of two, at least 8
    for row, exp in enumerate(exps):
        np.testing.assert_allclose(
            pred[row], closed_form(TS, 1.0, list(exp.jumps)), rtol=TOL, atol=TOL
        )


def test_jump_counts_are_padded_to_a_power_of_two_of_at_least_eight():
    counts = (0, 1, 3, 5, 8, 9, 1000, 1461)
    assert [hk._jumps.jump_slots(n) for n in counts] == [8, 8, 8, 8, 8, 16, 1024, 2048]


def test_a_dataset_without_jumps_has_no_jump_arrays():
    bp, _ = predict([experiment("a", TS, [])])
    assert bp.jumps is None


# --- gradients, throw=False, traces, dense predictions ---------------------------------------

OBS_JUMPS = [
    [hk.StateJump(0.5, 0, add=2.0), hk.StateJump(1.0, 0, scale=0.5)],
    [hk.StateJump(0.2, 0, add=1.0)],
]


def observed(exp_id, jumps, k=K):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs(TS, closed_form(TS, 1.0, jumps, k=k))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=exp_id,
        jumps=jumps,
    )


@pytest.fixture(scope="module")
def fit_bucket():
    exps = [observed(f"s{i}", j) for i, j in enumerate(OBS_JUMPS)]
    return hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads[0]


def grad_of(bp, sensitivity, adjoint, k=0.5):
    solver = hk.SolverConfig(
        solver=diffrax.Tsit5(),
        rtol=1e-10,
        atol=1e-12,
        max_steps=4096,
        dt0=None,
        adjoint=adjoint,
        sensitivity=sensitivity,
    )
    step = hk.build_bucket_step(simulate, identity_output, solver, hk.masked_mse, True)
    loss, grads = step((Rate(jnp.asarray(k)),), bp, 1.0)
    return float(loss), float(grads[0].k)


def test_forward_and_reverse_sensitivities_give_the_same_gradient(fit_bucket):
    loss_f, g_f = grad_of(fit_bucket, "forward", diffrax.RecursiveCheckpointAdjoint())
    loss_r, g_r = grad_of(fit_bucket, "reverse", diffrax.RecursiveCheckpointAdjoint())
    assert loss_f == pytest.approx(loss_r, rel=1e-10)
    assert g_f == pytest.approx(g_r, rel=1e-7)
    # The central difference reads the losses of the forward kernel already compiled above
    # (a third adjoint would only add a compile: the loss does not depend on the adjoint).
    h = 1e-5
    fd = (
        grad_of(fit_bucket, "forward", diffrax.RecursiveCheckpointAdjoint(), 0.5 + h)[0]
        - grad_of(fit_bucket, "forward", diffrax.RecursiveCheckpointAdjoint(), 0.5 - h)[0]
    ) / (2 * h)
    assert g_f == pytest.approx(fd, rel=1e-5)


def exploding(predictors, ts, covariates, y0, solver):
    (rate,) = predictors
    term = diffrax.ODETerm(lambda t, y, a: -rate() * covariates["c"] * y)
    return solver.diffeqsolve(term, ts, y0).ys


def test_throw_false_flags_a_failed_row_and_keeps_the_others_exact():
    def exp(exp_id, c):
        return hk.make_experiment(
            covariates={"c": c},
            channels={"y": hk.ChannelObs(TS, closed_form(TS, 1.0, BOLUSES))},
            y0_fn=lambda cv, ch: np.array([1.0]),
            exp_id=exp_id,
            jumps=BOLUSES,
        )

    ds = hk.make_dataset([exp("ok", 1.0), exp("bad", -3000.0)], output_channel_names=["y"])
    (bp,) = ds.bucket_payloads
    solver = hk.SolverConfig(
        solver=diffrax.Tsit5(),
        rtol=1e-10,
        atol=1e-12,
        max_steps=256,
        dt0=None,
        adjoint=diffrax.DirectAdjoint(),
        throw=False,
    )
    pred = np.asarray(hk.predict_bucket(TRUE, bp, exploding, identity_output, solver))[..., 0]
    np.testing.assert_allclose(pred[0], closed_form(TS, 1.0, BOLUSES, k=K), rtol=TOL)
    assert not np.isfinite(pred[1, -1])  # the segments after the failure are not solved
    step = hk.build_bucket_step(
        exploding, identity_output, solver, hk.masked_mse, True, return_status=True
    )
    loss, grads, failed = step((Rate(jnp.asarray(K)),), bp, 1.0)
    np.testing.assert_array_equal(failed, [False, True])
    assert hk.failed_exp_ids(ds, [failed]) == ("bad",)
    assert float(loss) == pytest.approx(0.0, abs=1e-14) and np.isfinite(float(grads[0].k))


TRACES = {"n": 0}


def counting(predictors, ts, covariates, y0, solver):
    TRACES["n"] += 1
    return simulate(predictors, ts, covariates, y0, solver)


def test_datasets_with_3_and_5_jumps_per_row_share_one_compiled_shape():
    def dataset(n_jumps, seed):
        rng = np.random.default_rng(seed)
        exps = []
        for i in range(2):
            times = np.sort(rng.uniform(0.0, 2.0, n_jumps))
            jumps = [hk.StateJump(float(t), 0, add=0.3) for t in times]
            exps.append(observed(f"e{i}", jumps))
        return hk.make_dataset(exps, output_channel_names=["y"])

    score = hk.build_score_bucket(counting, identity_output, SOLVER, hk.masked_mse)
    three, five = dataset(3, 0), dataset(5, 1)
    assert three.bucket_payloads[0].jumps.ts.shape == five.bucket_payloads[0].jumps.ts.shape
    score(TRUE, three.bucket_payloads[0], 1.0)
    before = TRACES["n"]
    loss = score(TRUE, five.bucket_payloads[0], 1.0)
    assert TRACES["n"] == before
    assert float(loss) == pytest.approx(0.0, abs=1e-14)


def test_predict_dense_shows_each_jump_from_both_sides():
    exps = [observed("a", OBS_JUMPS[0])]
    ds = hk.make_dataset(exps, output_channel_names=["y"])
    ((ts, pred),) = hk.predict_dense(TRUE, ds, simulate, identity_output, SOLVER, n_points=20)
    ts, pred = np.asarray(ts)[0], np.asarray(pred)[0, :, 0]
    assert ts.shape == (20 + 2 * 8,) and np.all(np.diff(ts) >= 0)  # two points per slot
    np.testing.assert_allclose(pred, closed_form(ts, 1.0, OBS_JUMPS[0]), rtol=1e-7, atol=TOL)
    at = np.flatnonzero(ts == 0.5)[-1]
    assert ts[at - 1] == np.nextafter(0.5, 0.0)
    assert pred[at] - pred[at - 1] == pytest.approx(2.0, rel=1e-7)  # vertical, not smeared


def test_float32_datasets_apply_jumps():
    exps = [experiment("a", TS, BOLUSES)]
    ds = hk.make_dataset(exps, output_channel_names=["y"], dtype="float32")
    (bp,) = ds.bucket_payloads
    assert bp.jumps.ts.dtype == np.float32
    solver = hk.SolverConfig(solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-7, max_steps=512, dt0=None)
    p32 = (Rate(jnp.asarray(K, jnp.float32)),)
    pred = np.asarray(hk.predict_bucket(p32, bp, simulate, identity_output, solver))[0, :, 0]
    assert pred.dtype == np.float32
    np.testing.assert_allclose(pred, closed_form(TS, 1.0, BOLUSES), rtol=1e-5)


# --- a fit after jumps -------------------------------------------------------------------------

K12, K21, KEL = 0.3, 0.2, 0.5
FIT_TS = np.arange(0.0, 8.5, 1.0)
# Subject-specific bolus times into the central compartment; s1's second dose and s4's third
# fall exactly on a sample, which sees the dose (right-continuous).
DOSES = {
    "s1": [(0.0, 10.0), (2.0, 5.0)],
    "s2": [(0.0, 8.0), (1.5, 4.0), (4.7, 6.0)],
    "s3": [(0.5, 12.0)],
    "s4": [(0.0, 6.0), (3.25, 6.0), (6.0, 3.0)],
}


def two_compartment(predictors, ts, covariates, y0, solver):
    (kel,) = predictors

    def vf(t, y, args):
        return jnp.stack([-(kel() + K12) * y[0] + K21 * y[1], K12 * y[0] - K21 * y[1]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def central(full):
    return full[:, :1]


def pk_experiments(values):
    return [
        hk.make_experiment(
            covariates={},
            channels={"C": hk.ChannelObs(FIT_TS, values[i])},
            y0_fn=lambda c, ch: np.zeros(2),
            exp_id=sid,
            jumps=[hk.StateJump(t, 0, add=amt) for t, amt in doses],
        )
        for i, (sid, doses) in enumerate(DOSES.items())
    ]


def test_the_elimination_rate_is_learned_through_boluses_from_a_wrong_start():
    blank = hk.make_dataset(pk_experiments(np.zeros((4, FIT_TS.size))), output_channel_names=["C"])
    truth = hk.predict_bucket(
        (Rate(jnp.asarray(KEL)),), blank.bucket_payloads[0], two_compartment, central, SOLVER
    )
    data = hk.make_dataset(pk_experiments(np.asarray(truth)[..., 0]), output_channel_names=["C"])
    config = hk.OptaxTrainingConfig(
        steps=(100, 100), lr=(0.05, 0.005), optimizer=("adam", "adam"), verbose=False
    )
    history, trained = hk.train_with_optax(
        (Rate(jnp.asarray(0.2)),),
        data,
        config,
        simulate_fn=two_compartment,
        state_to_output=central,
        solver=SOLVER,
        key=jax.random.key(0),
    )
    assert history[0] > 1.0
    assert float(trained[0].k) == pytest.approx(KEL, rel=1e-4)


def test_processes_agree_on_the_slots_of_the_most_jumps_anywhere(monkeypatch):
    from hybrid_kernels import _distributed

    # Two simulated processes: this one's rows have 3 jumps, the other's 5 and 9.
    gathered = [np.asarray([3]), np.asarray([5, 9])]
    monkeypatch.setattr(_distributed, "_gather_ints", lambda values: gathered)
    assert _distributed._jump_slots([3]) == 16
    gathered[:] = [np.asarray([0]), np.asarray([], np.int64)]
    assert _distributed._jump_slots([0]) is None  # no jump anywhere: no jump arrays


def test_solver_step_counts_are_summed_over_the_segments():
    from hybrid_kernels._kernels import _simulate_with_steps

    bp, _ = predict([experiment("a", TS, BOLUSES), experiment("b", TS, [])])
    _, steps = _simulate_with_steps(TRUE, bp, simulate_fn=simulate, solver=SOLVER)
    steps = np.asarray(steps)
    assert np.all(steps[:, 1] >= 0)  # read, not the -1 of an unreadable solve
    assert steps[0, 0] > steps[1, 0] >= 1  # three non-empty segments take more steps than one


def test_plot_fit_draws_each_jump_vertically():
    import matplotlib

    matplotlib.use("Agg")
    ds = hk.make_dataset([observed("a", OBS_JUMPS[0])], output_channel_names=["y"])
    fig = hk.plot_fit(
        TRUE, ds, simulate_fn=simulate, state_to_output=identity_output, solver=SOLVER, n_points=20
    )
    curve = fig.axes[0].lines[1]  # the observations, then the predicted curve
    xs, ys = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata())
    at = np.flatnonzero(xs == 0.5)[-1]
    assert xs[at - 1] == np.nextafter(0.5, 0.0)
    assert ys[at] - ys[at - 1] == pytest.approx(2.0, rel=1e-7)
    matplotlib.pyplot.close(fig)
