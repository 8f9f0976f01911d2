"""State jumps: `make_experiment(jumps=...)` applied by `solver.diffeqsolve` inside the kernels.

The reference is the closed form of `dy/dt = -k y` between jumps: `y(t) = y(t_j) e^{-k (t - t_j)}`,
and `y ← scale · y + add` at each jump, right-continuously.
"""

from __future__ import annotations

import diffrax
import jax.numpy as jnp
import numpy as np
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
    assert bp.jumps.ts.shape == (3, 4)  # padded to the next power of two of 3
    for row, exp in enumerate(exps):
        np.testing.assert_allclose(
            pred[row], closed_form(TS, 1.0, list(exp.jumps)), rtol=TOL, atol=TOL
        )


def test_jump_counts_are_padded_to_a_power_of_two():
    assert [hk._jumps.jump_slots(n) for n in (0, 1, 2, 3, 5, 8, 1000)] == [1, 1, 2, 4, 8, 8, 1024]


def test_a_dataset_without_jumps_has_no_jump_arrays():
    bp, _ = predict([experiment("a", TS, [])])
    assert bp.jumps is None
