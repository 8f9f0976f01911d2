"""dtype policy: one storage dtype, a once-only mixed-precision warning, an exact cutoff."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Omega, Rate, oscillator_model, tiny_solver

import hybrid_kernels as hk


def experiments(n=2, L=5):
    return [
        hk.make_experiment(
            covariates={"scale": 1.0, "index": np.int32(i)},
            channels={"y": hk.ChannelObs(np.linspace(0, 1, L), np.ones(L))},
            y0_fn=lambda c, ch: np.array([1.0]),
        )
        for i in range(n)
    ]


def simulate(predictors, ts, covariates, y0, solver):
    return y0[None, :] * jnp.exp(-predictors[0].k * (ts - ts[0]))[:, None]


def identity(full):
    return full


def float_dtypes(bp):
    return {str(x.dtype) for x in jax.tree.leaves(bp) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_dtype_float32_stores_every_float_array_in_float32_under_x64():
    bp = hk.make_dataset(
        experiments(), output_channel_names=["y"], dtype="float32"
    ).bucket_payloads[0]
    assert float_dtypes(bp) == {"float32"}
    assert bp.covariates["index"].dtype == jnp.int32  # integer covariates keep their type


def test_default_dtype_follows_x64():
    bp = hk.make_dataset(experiments(), output_channel_names=["y"]).bucket_payloads[0]
    assert float_dtypes(bp) == {"float64"}


def test_a_non_float_dtype_is_rejected():
    with pytest.raises(ValueError, match="`dtype` must be float32 or float64, got int32"):
        hk.make_dataset(experiments(), output_channel_names=["y"], dtype="int32")


def test_mixed_data_and_predictor_dtypes_warn_once():
    bp = hk.make_dataset(
        experiments(), output_channel_names=["y"], dtype="float32"
    ).bucket_payloads[0]
    score = hk.build_score_bucket(simulate, identity, tiny_solver(), hk.masked_mse)
    p = (Rate(jnp.asarray(0.5, jnp.float64)),)
    with pytest.warns(
        UserWarning, match=r"mixed float dtypes \(data: float32, y0: float32, predictors: float64\)"
    ):
        score(p, bp, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        score(p, bp, 1.0)
        score(p, bp, 0.5)


def test_matching_dtypes_do_not_warn():
    bp = hk.make_dataset(experiments(3), output_channel_names=["y"]).bucket_payloads[0]
    score = hk.build_score_bucket(simulate, identity, tiny_solver(), hk.masked_mse)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        score((Rate(jnp.asarray(0.5, jnp.float64)),), bp, 1.0)


def _first_float32_disagreement():
    for L in range(2, 400):
        for i in range(1, 100):
            f = i / 100
            f32 = int(np.ceil(np.float32(L) * np.float32(f)))
            f64 = int(np.ceil(np.float64(L) * np.float64(f)))
            if f32 != f64:
                return L, f, f64
    raise AssertionError("no disagreement found")


def test_length_cutoff_is_computed_in_float64_under_x64():
    L, f, expected = _first_float32_disagreement()
    assert int(hk.length_cutoff(L, f)) == expected
    bp = hk.make_dataset(
        [
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(np.arange(L, dtype=float), np.ones(L))},
                y0_fn=lambda c, ch: np.ones(1),
            )
        ],
        output_channel_names=["y"],
    ).bucket_payloads[0]
    assert int(hk.apply_length_mask(bp, f).n_obs) == expected


def test_length_cutoff_is_clamped_at_one():
    assert int(hk.length_cutoff(10, 1e-9)) == 1


SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    sys.path.insert(0, {tests!r})
    import jax
    assert not jax.config.read("jax_enable_x64")
    import jax.numpy as jnp
    import numpy as np
    import hybrid_kernels as hk
    from helpers import Rate, decay_simulate, identity_output, tiny_solver

    TS = np.linspace(0, 2, 6)
    exps = [
        hk.make_experiment(
            covariates={{"scale": 1.0}},
            channels={{"y": hk.ChannelObs(TS, np.exp(-0.7 * TS))}},
            y0_fn=lambda c, ch: np.array([1.0]),
        )
        for _ in range(2)
    ]
    try:
        hk.make_dataset(exps, output_channel_names=["y"], dtype="float64")
        f64_error = ""
    except ValueError as e:
        f64_error = str(e)
    (bp,) = hk.make_dataset(exps, output_channel_names=["y"]).bucket_payloads
    solver = tiny_solver(rtol=1e-5, atol=1e-6)
    step = hk.build_bucket_step(decay_simulate, identity_output, solver, hk.masked_mse, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grads = step((Rate(jnp.asarray(0.5)),), bp, 1.0)
    print(json.dumps({{
        "f64_error": f64_error,
        "ts_dtype": str(bp.ts.dtype),
        "loss_dtype": str(loss.dtype),
        "loss": float(loss),
        "grad": float(grads[0].k),
    }}))
    """
)


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    script = tmp_path_factory.mktemp("f32") / "run.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_float64_without_x64_is_an_error_not_a_silent_downcast(float32_run):
    assert (
        "`dtype=float64` needs `jax.config.update('jax_enable_x64', True)`"
        in float32_run["f64_error"]
    )


def test_float32_kernels_run_with_x64_off(float32_run):
    assert float32_run["ts_dtype"] == float32_run["loss_dtype"] == "float32"
    assert float32_run["loss"] > 0 and float32_run["grad"] < 0  # k = 0.5 decays too slowly


def _oscillator_bucket(dtype):
    osc = oscillator_model()
    data = hk.make_dataset(osc.experiments([6, 6]), output_channel_names=["x"], dtype=dtype)
    score = hk.build_score_bucket(osc.simulate_fn, osc.state_to_output, osc.solver, hk.masked_mse)
    return data.bucket_payloads[0], score


def test_a_solve_that_fails_on_float32_data_and_a_float64_model_says_why():
    bp, score = _oscillator_bucket("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mixed-dtypes warning, once per process
        with pytest.raises(ValueError) as error:
            score((Omega(jnp.asarray(1.0, jnp.float64)),), bp, 1.0)
    (note,) = [n for n in error.value.__notes__ if n.startswith("hybrid_kernels:")]
    assert "bucket N=2, T=6, y0 is float32" in note
    assert "make_dataset(..., dtype='float64')" in note


def test_an_error_that_dtypes_do_not_explain_gets_no_note():
    bp, _ = _oscillator_bucket("float64")

    def broken(predictors, ts, covariates, y0, solver):
        raise RuntimeError("the user's own bug")

    score = hk.build_score_bucket(broken, identity, tiny_solver(), hk.masked_mse)
    with pytest.raises(RuntimeError, match="the user's own bug") as error:
        score((Rate(jnp.asarray(0.5, jnp.float64)),), bp, 1.0)
    assert not any(n.startswith("hybrid_kernels:") for n in getattr(error.value, "__notes__", []))
