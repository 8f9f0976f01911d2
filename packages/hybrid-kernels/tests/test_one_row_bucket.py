"""A one-row bucket solves its row without the per-row vmap: same loss, gradient and statistics.

The kernels skip `jax.vmap` when a bucket has a single row (a batched solver loop costs a
one-trajectory problem about half its step time). The two paths are compared on one row: alone
in its bucket, and beside a duplicate of itself in a two-row bucket, where the vmap runs.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Omega, oscillator_model, position_output, tiny_solver

import hybrid_kernels as hk

MODES = {
    "forward": tiny_solver(sensitivity="forward"),
    "reverse": tiny_solver(sensitivity="reverse", adjoint=diffrax.RecursiveCheckpointAdjoint()),
    "throw_false": tiny_solver(
        sensitivity="reverse", adjoint=diffrax.RecursiveCheckpointAdjoint(), throw=False
    ),
}


@pytest.fixture(scope="module")
def buckets():
    model = oscillator_model()
    (exp,) = model.experiments([10])
    twin = hk.make_experiment(
        covariates=exp.covariates,
        channels=exp.channels,
        y0_fn=lambda c, ch: exp.y0,
        exp_id="twin",
    )
    one = hk.make_dataset([exp], output_channel_names=[model.channel]).bucket_payloads
    two = hk.make_dataset([exp, twin], output_channel_names=[model.channel]).bucket_payloads
    assert [b.ts.shape[0] for b in (*one, *two)] == [1, 2]
    return model, one[0], two[0]


def _step(model, mode):
    return hk.build_bucket_step(
        model.simulate_fn, position_output, MODES[mode], hk.masked_mse, True
    )


def _start():
    return (Omega(jnp.asarray(1.1)),)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_one_row_bucket_gives_the_loss_and_gradient_of_that_row_beside_a_duplicate(buckets, mode):
    model, one, two = buckets
    step = _step(model, mode)
    loss1, grads1 = step(_start(), one, 1.0)
    loss2, grads2 = step(_start(), two, 1.0)
    assert float(loss1) == pytest.approx(float(loss2), rel=1e-12)
    g1, g2 = jax.tree.leaves(eqx.filter(grads1, eqx.is_array)), jax.tree.leaves(grads2)
    assert len(g1) == len(g2) == 1 and float(g1[0]) != 0.0
    np.testing.assert_allclose(g1[0], g2[0], rtol=1e-12)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_one_row_bucket_reports_its_solver_steps(buckets, mode):
    model, one, two = buckets
    step = _step(model, mode)
    step(_start(), two, 1.0)
    both = np.asarray(step.last_solver_steps)
    step(_start(), one, 1.0)
    alone = np.asarray(step.last_solver_steps)
    assert alone.shape == (1, 2) and alone[0, 0] > 0
    np.testing.assert_array_equal(alone[0], both[0])


def _nested_simulate(predictors, ts, covariates, y0, solver):
    # The solve runs inside simulate_fn's own vmap: its statistics live at that nested level.
    (omega,) = predictors

    def vf(t, y, args):
        return jnp.stack([y[1], -(omega() ** 2) * y[0]])

    ys = jax.vmap(lambda y: solver.diffeqsolve(diffrax.ODETerm(vf), ts, y).ys)(y0[None])
    return ys[0]


def test_one_row_bucket_leaves_out_the_steps_of_solves_inside_a_nested_transform(buckets):
    _, one, _ = buckets
    step = hk.build_bucket_step(
        _nested_simulate, position_output, MODES["reverse"], hk.masked_mse, True
    )
    loss, _ = step(_start(), one, 1.0)
    assert np.isfinite(float(loss))
    np.testing.assert_array_equal(np.asarray(step.last_solver_steps), [[-1, -1]])
