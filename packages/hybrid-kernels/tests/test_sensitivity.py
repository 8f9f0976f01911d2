"""Forward or reverse sensitivities: the same gradients either way, and what `"auto"` picks."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    Omega,
    Rate,
    decay_simulate,
    identity_output,
    oscillator_simulate,
    oscillator_simulate_args,
    position_output,
    tiny_solver,
)
from jax.flatten_util import ravel_pytree

import hybrid_kernels as hk
from hybrid_kernels._sensitivity import FORWARD_MAX_SCALARS, forward_value_and_grad

AGREE = 1e-10  # relative, float64: both modes differentiate the same discrete solve


class Damped(eqx.Module):
    """An oscillator whose damping is a small MLP of the velocity."""

    omega: jax.Array
    damping: eqx.nn.MLP


def damped_simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors

    def vf(t, y, args):
        return jnp.stack([y[1], -(p.omega**2) * y[0] - p.damping(y[1:])[0]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def damped(width):
    mlp = eqx.nn.MLP(1, 1, width, 1, activation=jnp.tanh, key=jax.random.key(0))
    mlp = jax.tree.map(lambda x: 0.3 * x if eqx.is_inexact_array(x) else x, mlp)
    return (Damped(jnp.asarray(1.1), mlp),)


class Recorder:
    """`simulate_fn` that records the sensitivity and adjoint of the solver it is traced with."""

    def __init__(self, fn):
        self.fn = fn
        self.seen = []

    def __call__(self, predictors, ts, covariates, y0, solver):
        self.seen.append((solver.sensitivity, type(solver.adjoint).__name__))
        return self.fn(predictors, ts, covariates, y0, solver)


def flat(grads):
    return ravel_pytree(eqx.filter(grads, eqx.is_inexact_array))[0]


def assert_agree(forward, reverse):
    (lf, gf), (lr, gr) = forward[:2], reverse[:2]
    assert float(lf) == pytest.approx(float(lr), rel=1e-13)
    assert jax.tree.structure(gf) == jax.tree.structure(gr)
    gf, gr = np.asarray(flat(gf)), np.asarray(flat(gr))
    assert np.linalg.norm(gr) > 0
    assert np.linalg.norm(gf - gr) <= AGREE * np.linalg.norm(gr)


def both_modes(simulate, output, solver, trainable, predictors, bp, **kwargs):
    out = {}
    for mode in ("forward", "reverse"):
        s = dataclasses.replace(solver, sensitivity=mode)
        step = hk.build_bucket_step(simulate, output, s, hk.masked_mse, trainable, **kwargs)
        out[mode] = step(predictors, bp, 1.0)
    return out["forward"], out["reverse"]


# --- forward and reverse agree ---------------------------------------------------------------


@pytest.fixture(scope="module")
def decay_bucket(decay):
    return decay.dataset([6, 6, 6]).bucket_payloads[0]


@pytest.fixture(scope="module")
def oscillator_bucket(oscillator):
    return oscillator.dataset([6, 6]).bucket_payloads[0]


def test_forward_and_reverse_agree_on_decay_with_the_default_adjoint(decay_bucket):
    solver = tiny_solver(adjoint=diffrax.RecursiveCheckpointAdjoint())
    fwd, rev = both_modes(
        decay_simulate, identity_output, solver, True, (Rate(jnp.asarray(0.5)),), decay_bucket
    )
    assert_agree(fwd, rev)


@pytest.mark.parametrize("simulate", [oscillator_simulate, oscillator_simulate_args])
def test_forward_and_reverse_agree_on_the_oscillator(oscillator_bucket, simulate):
    fwd, rev = both_modes(
        simulate,
        position_output,
        tiny_solver(),
        True,
        (Omega(jnp.asarray(1.1)),),
        oscillator_bucket,
    )
    assert_agree(fwd, rev)


@pytest.fixture(scope="module")
def mlp_with_a_frozen_leaf(oscillator_bucket):
    predictors = damped(3)
    mask = hk.trainable_mask(predictors)
    mask = eqx.tree_at(lambda m: m[0].damping.layers[-1].bias, mask, replace=False)
    fwd, rev = both_modes(
        damped_simulate, position_output, tiny_solver(), mask, predictors, oscillator_bucket
    )
    return fwd, rev


def test_forward_and_reverse_agree_on_an_mlp_model_with_a_frozen_leaf(mlp_with_a_frozen_leaf):
    assert_agree(*mlp_with_a_frozen_leaf)


def test_a_frozen_leaf_gets_no_forward_gradient(mlp_with_a_frozen_leaf):
    (_, grads), _ = mlp_with_a_frozen_leaf
    assert grads[0].damping.layers[-1].bias is None
    assert grads[0].damping.layers[-1].weight is not None


@pytest.fixture(scope="module")
def exploding_bucket(decay):
    good = decay.experiments([6, 6])
    bad = hk.make_experiment(
        covariates={"scale": -3000.0},  # dy/dt = +1500 y: overflows, the solve cannot finish
        channels={"y": hk.ChannelObs(np.linspace(0, 2, 6), np.ones(6))},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id="exploding",
    )
    return hk.make_dataset([good[0], bad, good[1]], output_channel_names=["y"]).bucket_payloads[0]


def test_forward_and_reverse_agree_with_throw_false_and_a_failed_row(exploding_bucket):
    solver = tiny_solver(throw=False, max_steps=64)
    fwd, rev = both_modes(
        decay_simulate,
        identity_output,
        solver,
        True,
        (Rate(jnp.asarray(0.5)),),
        exploding_bucket,
        return_status=True,
    )
    np.testing.assert_array_equal(fwd[2], [False, True, False])
    np.testing.assert_array_equal(fwd[2], rev[2])
    assert_agree(fwd, rev)


def test_chunked_tangents_give_the_unchunked_gradient():
    diff = {"a": jnp.linspace(0.1, 0.9, 5), "b": jnp.asarray(2.0), "frozen": None}

    def fn(d):
        value = jnp.sum(jnp.sin(d["a"]) * d["b"] ** 2)
        return value, d["b"]

    (value, aux), grads = forward_value_and_grad(fn, diff, chunk=2)
    reference = jax.grad(lambda d: fn(d)[0])({"a": diff["a"], "b": diff["b"]})
    assert float(value) == pytest.approx(float(fn(diff)[0]), rel=1e-15)
    assert float(aux) == 2.0
    assert grads["frozen"] is None
    np.testing.assert_allclose(grads["a"], reference["a"], rtol=1e-14)
    np.testing.assert_allclose(grads["b"], reference["b"], rtol=1e-14)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_gradients_on_the_gpu_match_the_cpu(decay_bucket, mode):
    step = hk.build_bucket_step(
        decay_simulate, identity_output, tiny_solver(sensitivity=mode), hk.masked_mse, True
    )
    out = {}
    for platform in ("cpu", "gpu"):
        device = jax.devices(platform)[0]
        predictors, bp = jax.device_put(((Rate(jnp.asarray(0.5)),), decay_bucket), device)
        loss, grads = step(predictors, bp, 1.0)
        out[platform] = (float(loss), np.asarray(flat(grads)))
    (lc, gc), (lg, gg) = out["cpu"], out["gpu"]
    assert lg == pytest.approx(lc, rel=1e-8)  # float64 on two backends' math libraries
    assert np.linalg.norm(gg - gc) <= 1e-8 * np.linalg.norm(gc)


SHARDED = """
import json, sys
sys.path.insert(0, {tests!r})
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import hybrid_kernels as hk
from helpers import Rate, decay_simulate, identity_output, tiny_solver

assert jax.device_count() == 4
exps = [
    hk.make_experiment(
        covariates={{"scale": 1.0 + 0.1 * i}},
        channels={{"y": hk.ChannelObs(np.linspace(0, 2, 5), np.exp(-0.7 * np.linspace(0, 2, 5)))}},
        y0_fn=lambda c, ch: np.array([1.0]),
        exp_id=f"e{{i}}",
    )
    for i in range(6)
]
(bp,) = hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads
out = {{}}
for mode in ("forward", "reverse"):
    step = hk.build_bucket_step(
        decay_simulate, identity_output, tiny_solver(sensitivity=mode), hk.masked_mse, True
    )
    loss, grads = step((Rate(jnp.asarray(0.5)),), bp, 1.0)
    out[mode] = [float(loss), float(grads[0].k), grads[0].k.sharding.is_fully_replicated]
out["n_devices"] = len(bp.ts.sharding.device_set)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_forward_mode_on_rows_sharded_over_four_devices_matches_reverse(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SHARDED.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n_devices"] == 4
    (lf, gf, replicated), (lr, gr, _) = result["forward"], result["reverse"]
    assert replicated
    assert lf == pytest.approx(lr, rel=1e-13)
    assert gf == pytest.approx(gr, rel=AGREE)


# --- what "auto" picks ------------------------------------------------------------------------


def traced_mode(simulate, output, predictors, trainable, bp, **solver_kwargs):
    recorder = Recorder(simulate)
    step = hk.build_bucket_step(
        recorder, output, tiny_solver(**solver_kwargs), hk.masked_mse, trainable
    )
    step.lower(predictors, bp, 1.0)  # tracing is enough: the choice is made at trace time
    return set(recorder.seen)


def test_auto_picks_forward_for_a_model_with_a_few_rates(decay_bucket):
    seen = traced_mode(
        decay_simulate, identity_output, (Rate(jnp.asarray(0.5)),), True, decay_bucket
    )
    assert seen == {("forward", "ForwardMode")}


def test_auto_picks_reverse_for_an_mlp_model(oscillator_bucket):
    predictors = damped(16)
    assert ravel_pytree(eqx.filter(predictors, eqx.is_inexact_array))[0].size > FORWARD_MAX_SCALARS
    seen = traced_mode(damped_simulate, position_output, predictors, True, oscillator_bucket)
    assert seen == {("reverse", "DirectAdjoint")}


def test_auto_counts_only_the_trainable_scalars(oscillator_bucket):
    predictors = damped(16)
    mask = hk.freeze_paths(hk.trainable_mask(predictors), ["0.damping"])
    seen = traced_mode(damped_simulate, position_output, predictors, mask, oscillator_bucket)
    assert seen == {("forward", "ForwardMode")}


def test_auto_keeps_reverse_mode_for_backsolve_adjoint(oscillator_bucket):
    seen = traced_mode(
        oscillator_simulate_args,
        position_output,
        (Omega(jnp.asarray(1.1)),),
        True,
        oscillator_bucket,
        adjoint=diffrax.BacksolveAdjoint(),
    )
    assert seen == {("reverse", "BacksolveAdjoint")}


def test_an_explicit_sensitivity_overrides_auto(decay_bucket):
    seen = traced_mode(
        decay_simulate,
        identity_output,
        (Rate(jnp.asarray(0.5)),),
        True,
        decay_bucket,
        sensitivity="reverse",
    )
    assert seen == {("reverse", "DirectAdjoint")}


# --- the config -------------------------------------------------------------------------------


def test_sensitivity_defaults_to_auto():
    assert tiny_solver().sensitivity == "auto"


def test_an_unknown_sensitivity_is_rejected():
    with pytest.raises(ValueError, match="`sensitivity` must be 'reverse', 'forward' or 'auto'"):
        tiny_solver(sensitivity="backward")


def test_sensitivity_survives_the_dict_round_trip():
    solver = tiny_solver(sensitivity="forward")
    assert hk.SolverConfig.from_dict(solver.to_dict()).sensitivity == "forward"
