"""A kernel call walks only the predictors and the bucket, and still reports solver failures.

The static parts of a kernel (objective, solver config, callables, trainable mask) are bound
once when it is built (`hybrid_kernels._flat_jit`); these tests count what a call flattens
rather than timing it.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels import _flat_jit as fj


@jax.tree_util.register_pytree_node_class
class Box:
    """A pytree node that counts how often a mask (a box holding a bool) is flattened."""

    mask_flattens = 0

    def __init__(self, child):
        self.child = child

    def tree_flatten(self):
        if isinstance(self.child, bool):
            Box.mask_flattens += 1
        return (self.child,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0])


def boxed_simulate(predictors, ts, covariates, y0, solver):
    (box,) = predictors
    return y0[None, :] * jnp.exp(-box.child() * (ts - ts[0]))[:, None]


def identity(full):
    return full


def _bucket(n_points=6):
    ts = np.linspace(0.0, 1.0, n_points)
    exps = [
        hk.make_experiment(
            covariates={},
            channels={"y": hk.ChannelObs(ts, np.exp(-0.5 * ts))},
            y0_fn=lambda c, ch: jnp.array([1.0]),
            exp_id=f"e{i}",
        )
        for i in range(2)
    ]
    (bp,) = hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads
    return bp


@pytest.mark.parametrize("throw", [True, False])
def test_repeated_calls_do_not_walk_the_static_parts(throw):
    predictors = (Box(Rate(jnp.asarray(0.3, jnp.float64))),)
    mask = (Box(True),)
    step = hk.build_bucket_step(
        boxed_simulate, identity, tiny_solver(throw=throw), hk.masked_mse, mask
    )
    bp = _bucket()
    fraction = jnp.asarray(1.0, jnp.float64)
    jax.block_until_ready(step(predictors, bp, fraction))  # trace, compile, first-use checks
    before = Box.mask_flattens
    for _ in range(5):
        loss, grads = step(predictors, bp, fraction)
    jax.block_until_ready((loss, grads))
    assert Box.mask_flattens == before
    assert np.isfinite(float(loss)) and grads[0].child.k.shape == ()


def test_kernels_built_from_equal_arguments_share_one_entry():
    predictors = (Rate(jnp.asarray(0.3, jnp.float64)),)
    mask = hk.trainable_mask(predictors)
    a = hk.build_bucket_step(boxed_simulate, identity, tiny_solver(), hk.masked_mse, mask)
    b = hk.build_bucket_step(boxed_simulate, identity, tiny_solver(), hk.masked_mse, mask)
    assert a._run is b._run


def test_a_failed_check_in_a_waited_call_is_an_equinox_runtime_error():
    def body(predictors):
        term = diffrax.ODETerm(lambda t, y, args: -50.0 * y)
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 10.0, 0.01, predictors, max_steps=3)

    static, dynamic = fj.flatten(jnp.asarray(1.0))
    run = fj.entry(lambda p: body(p).ys)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"^The maximum number of solver steps"):
        fj.call(run, static, dynamic, wait=True)


def test_flatten_makes_weak_leaves_strong_and_keeps_static_leaves():
    tree = {"w": jnp.asarray(0.5), "n": 3, "f": jnp.tanh}
    static, dynamic = fj.flatten(tree)
    assert [x.weak_type for x in dynamic] == [False]
    back = fj.unflatten(static, dynamic)
    assert back["n"] == 3 and back["f"] is jnp.tanh and float(back["w"]) == 0.5


def test_a_mask_with_array_leaves_is_still_refused_by_name():
    predictors = (Box(Rate(jnp.asarray(0.3, jnp.float64))),)
    step = hk.build_bucket_step(
        boxed_simulate, identity, tiny_solver(), hk.masked_mse, (Box(np.array(True)),)
    )
    with pytest.raises(ValueError, match="trainable"):
        step(predictors, _bucket(), 1.0)


class UnhashableSimulate:
    """A callable object that defines `__eq__` without `__hash__`, so it cannot be hashed."""

    def __eq__(self, other):
        return self is other

    def __call__(self, predictors, ts, covariates, y0, solver):
        return boxed_simulate(predictors, ts, covariates, y0, solver)


def test_an_unhashable_simulate_fn_works_and_is_shared_only_with_itself():
    predictors = (Box(Rate(jnp.asarray(0.3, jnp.float64))),)
    simulate, other = UnhashableSimulate(), UnhashableSimulate()
    with pytest.raises(TypeError):
        hash(simulate)
    a = hk.build_bucket_step(simulate, identity, tiny_solver(), hk.masked_mse, (Box(True),))
    b = hk.build_bucket_step(simulate, identity, tiny_solver(), hk.masked_mse, (Box(True),))
    c = hk.build_bucket_step(other, identity, tiny_solver(), hk.masked_mse, (Box(True),))
    loss, grads = a(predictors, _bucket(), 1.0)
    assert a._run is b._run and a._run is not c._run
    assert np.isfinite(float(loss)) and np.isfinite(float(grads[0].child.k))


@pytest.mark.parametrize("throw", [True, False])
def test_a_kernel_called_inside_jit_and_vmap_gives_the_direct_result(throw):
    predictors = (Box(Rate(jnp.asarray(0.3, jnp.float64))),)
    step = hk.build_bucket_step(
        boxed_simulate, identity, tiny_solver(throw=throw), hk.masked_mse, (Box(True),)
    )
    bp = _bucket()
    loss, grads = step(predictors, bp, 1.0)
    inner_loss, inner_grads = eqx.filter_jit(lambda p: step(p, bp, 1.0))(predictors)
    # Compiled inside another program, XLA may fuse differently: equal to the last bits only.
    assert float(inner_loss) == pytest.approx(float(loss), rel=1e-14)
    assert float(inner_grads[0].child.k) == pytest.approx(float(grads[0].child.k), rel=1e-14)
    rates = jnp.asarray([0.3, 0.6], jnp.float64)
    swept = jax.vmap(lambda k: step((Box(Rate(k)),), bp, 1.0)[0])(rates)
    assert float(swept[0]) == pytest.approx(float(loss), rel=1e-14)
    assert float(swept[1]) != float(swept[0])
