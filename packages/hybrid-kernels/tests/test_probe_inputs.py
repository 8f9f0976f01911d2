"""Probe scenarios (issue 22): input tables the solver cannot use are refused, naming them.

An `InputTable` built directly checks itself like `piecewise_constant` does; a time too
large for the solve's dtype (`t + 1 == t`) is refused at `make_experiment`, `make_dataset`
and `SolverConfig` instead of ending as "maximum number of solver steps was reached".
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_inputs import SOLVER, fed

import hybrid_kernels as hk
from hybrid_kernels._kernels import _simulate_with_steps


def experiment(table, exp_id="e0"):
    return hk.make_experiment(
        covariates={},
        channels={"y": hk.ChannelObs([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id=exp_id,
        t0=0.0,
        inputs={"feed": table},
    )


@pytest.mark.parametrize(
    ("ts", "values", "words"),
    [
        ([0.0, 2.0, 1.0], [0.0, 1.0, 2.0], "strictly increasing"),
        ([0.0, 1.0, 1.0], [0.0, 1.0, 2.0], "strictly increasing"),
        ([0.0, np.nan], [0.0, 1.0], "`ts` must be finite"),
        ([0.0, np.inf], [0.0, 1.0], "`ts` must be finite"),
        ([0.0, 1.0], [0.0, np.inf], "`values` must be finite"),
        ([0.0, 1.0], [0.0, np.nan], "`values` must be finite"),
        ([0.0, 1.0], [0.0, 1.0, 2.0], "K = len"),
        ([], [], "non-empty rank-1"),
        ([[0.0, 1.0]], [[0.0, 1.0]], "non-empty rank-1"),
    ],
)
@pytest.mark.parametrize("kind", ["constant", "linear"])
def test_an_input_table_built_directly_checks_itself(ts, values, words, kind):
    with pytest.raises(ValueError, match=f"InputTable: .*{words}"):
        hk.InputTable(ts=ts, values=values, kind=kind)


def test_a_valid_direct_table_is_the_same_as_the_constructor_s():
    direct = hk.InputTable(ts=[0, 1, 3], values=[1, 2, 0], kind="constant")
    made = hk.piecewise_constant([0.0, 1.0, 3.0], [1.0, 2.0, 0.0])
    assert direct.ts.dtype == np.float64 and isinstance(direct.values, np.ndarray)
    np.testing.assert_array_equal(direct.knots()[0], made.knots()[0])
    np.testing.assert_array_equal(direct.knots()[1], made.knots()[1])


def test_an_input_table_built_from_traced_arrays_is_not_checked():
    # Inside jit/vmap the values are unknown; building must not fail on them.
    build = jax.vmap(lambda t: hk.InputTable(ts=t, values=t, kind="linear").ts * 2)
    np.testing.assert_array_equal(build(jnp.ones((2, 3))), 2 * np.ones((2, 3)))


@pytest.mark.parametrize("make", [hk.piecewise_linear, hk.piecewise_constant])
def test_times_too_large_for_float64_are_refused_at_make_experiment(make):
    with pytest.raises(ValueError, match=r"make_experiment\('e0'\): input 'feed': .*t \+ 1 == t"):
        experiment(make([1e16, 2e16], [1.0, 2.0]))


def test_times_too_large_for_float32_are_refused_at_make_dataset_naming_the_experiment():
    e = experiment(hk.piecewise_constant([0.0, 1e8], [1.0, 2.0]), exp_id="late")
    hk.make_dataset([e], output_channel_names=["y"])  # float64: fine
    with pytest.raises(ValueError, match=r"experiment 'late', input 'feed'.*float32"):
        hk.make_dataset([e], output_channel_names=["y"], dtype="float32")


def test_the_largest_usable_times_still_integrate():
    # 1e15 + 1 != 1e15 in float64: the table is usable and the solve is exact.
    e = experiment(hk.piecewise_constant([0.0, 1e15], [1.0, 2.0]))
    bp = hk.make_dataset([e], output_channel_names=["y"]).bucket_payloads[0]
    full, _ = jax.jit(lambda b: _simulate_with_steps(None, b, simulate_fn=fed, solver=SOLVER))(bp)
    np.testing.assert_allclose(np.asarray(full)[0, :, 0], [0.0, 1.0, 2.0, 3.0], atol=1e-9)


@pytest.mark.parametrize("jump", [1e16, -1e16])
def test_a_solver_jump_time_too_large_for_float64_is_refused(jump):
    with pytest.raises(ValueError, match=r"SolverConfig: `jump_ts` .*t \+ 1 == t"):
        hk.SolverConfig(
            solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=64, dt0=None, jump_ts=(jump,)
        )


@pytest.mark.parametrize("jump", [float("nan"), float("inf")])
def test_a_non_finite_solver_jump_time_is_refused(jump):
    with pytest.raises(ValueError, match="SolverConfig: `jump_ts` must be a tuple of finite"):
        hk.SolverConfig(
            solver=diffrax.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=64, dt0=None, jump_ts=(jump,)
        )
