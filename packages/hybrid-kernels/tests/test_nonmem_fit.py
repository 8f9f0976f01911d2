"""A fit from a NONMEM-style table (issue 23): two compartments, boluses at subject-specific
times (one at an observation time), overlapping infusions, `DV=0` on dose rows.

The data are noise-free values of the exact solution (a matrix exponential per segment, not
the library's solver). The elimination rate is fitted from a wrong start with the library's
gradient kernel (a secant iteration on `d loss / d k10`) and must land on the truth.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import expm

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")

K10, K12, K21 = 0.3, 0.5, 0.2
SOLVER = hk.SolverConfig(
    solver=diffrax.Tsit5(),
    rtol=1e-11,
    atol=1e-12,
    max_steps=4096,
    dt0=None,
    adjoint=diffrax.DirectAdjoint(),
)


class Elimination(eqx.Module):
    k10: jax.Array


def simulate(predictors, ts, covariates, y0, solver):
    (elim,) = predictors

    def vf(t, a, args):
        a1, a2 = a
        da1 = covariates["rate1"](t) - (elim.k10 + K12) * a1 + K21 * a2
        return jnp.stack([da1, K12 * a1 - K21 * a2])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def central(full):
    return full[:, :1]


def y0_fn(covariates, channels):
    return jnp.zeros(2)


# per subject: boluses (time, amount), infusions (start, amount, rate), sample times
SUBJECTS = {
    1: ([(0.0, 10.0), (3.0, 5.0)], [(1.0, 6.0, 3.0), (2.0, 4.0, 4.0)], [0.5, 1.5, 2.5, 3.0, 5.0]),
    2: ([(0.5, 8.0)], [(0.0, 4.0, 2.0), (1.0, 3.0, 1.0), (4.0, 2.0, 2.0)], [1.0, 2.0, 4.5, 6.0]),
    3: ([(2.0, 12.0)], [(0.0, 6.0, 6.0), (1.0, 6.0, 6.0)], [0.25, 1.0, 2.0, 3.5, 5.5]),
}


def exact(boluses, infusions, ts):
    """A1 at `ts` (right-continuous at the boluses): exact per segment of constant input."""
    K = np.array([[-(K10 + K12), K21], [K12, -K21]])
    stops = [(s, s + a / r, r) for s, a, r in infusions]
    cuts = sorted({0.0, *ts, *(t for t, _ in boluses), *(x for s in stops for x in s[:2])})
    a, out, t_now = np.zeros(2), {}, 0.0
    for t in cuts:
        rate = sum(r for s, e, r in stops if s <= t_now < e)
        M = np.zeros((3, 3))
        M[:2, :2], M[0, 2] = K, rate
        a = (np.asarray(expm(jnp.asarray(M * (t - t_now)))) @ np.r_[a, 1.0])[:2]
        a[0] += sum(amt for tb, amt in boluses if tb == t)
        out[t], t_now = a[0], t
    return [out[t] for t in ts]


def nonmem_table():
    rows = []  # ID, TIME, DV, AMT, RATE, EVID, MDV, CMT; DV=0 and MDV=0 on dose rows
    for i, (boluses, infusions, ts) in SUBJECTS.items():
        events = [(t, 0, 0.0, amt, 0.0) for t, amt in boluses]
        events += [(s, 0, 0.0, amt, r) for s, amt, r in infusions]
        events += [
            (t, 1, dv, 0.0, 0.0) for t, dv in zip(ts, exact(boluses, infusions, ts), strict=True)
        ]
        for t, is_obs, dv, amt, rate in sorted(events, key=lambda e: (e[0], e[1])):
            rows.append((i, t, dv, amt, rate, 0 if is_obs else 1, 0, 1))
    return pd.DataFrame(rows, columns=["ID", "TIME", "DV", "AMT", "RATE", "EVID", "MDV", "CMT"])


def test_a_bolus_shares_a_sample_time_and_dose_rows_carry_dv_zero():
    table = nonmem_table()
    assert ((table.EVID == 1) & (table.DV == 0.0) & (table.MDV == 0)).sum() == 11
    subject1 = table[table.ID == 1]
    assert {"bolus", "sample"} == {
        "bolus" if e else "sample" for e in subject1[subject1.TIME == 3.0].EVID
    }


def test_the_elimination_rate_is_fitted_from_a_nonmem_table_to_the_truth():
    exps = hk.experiments_from_nonmem(nonmem_table(), y0_fn=y0_fn, cmt_to_state={1: 0}, channel="C")
    assert [e.channels["C"].ts.size for e in exps] == [5, 4, 5]  # no false observations
    dataset = hk.make_dataset(exps, output_channel_names=["C"])
    (bp,) = dataset.bucket_payloads
    step = hk.build_bucket_step(simulate, central, SOLVER, hk.masked_mse, eqx.is_inexact_array)

    def grad(k):
        _, g = step((Elimination(jnp.asarray(k)),), bp, 1.0)
        return float(g[0].k10)

    k_old, k = 0.15, 0.2  # a wrong start
    g_old = grad(k_old)
    for _ in range(30):
        g = grad(k)
        if g == g_old or abs(k - k_old) < 1e-12:
            break
        k, k_old, g_old = k - g * (k - k_old) / (g - g_old), k, g
    assert abs(k - K10) / K10 < 1e-4
