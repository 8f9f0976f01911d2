"""SolverConfig: validation, the step-size controller, the solve, and the JSON round trip."""

import json

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk
from hybrid_kernels._solver import ADJOINT_REGISTRY, SOLVER_REGISTRY


def config(**kw):
    opts = dict(solver=diffrax.Tsit5(), rtol=1e-8, atol=1e-10, max_steps=256, dt0=0.1)
    opts.update(kw)
    return hk.SolverConfig(**opts)


def test_positional_arguments_follow_the_seed_order():
    cfg = hk.SolverConfig(diffrax.Tsit5(), 1e-5, 1e-7, 100, 0.01)
    assert (cfg.rtol, cfg.atol, cfg.max_steps, cfg.dt0) == (1e-5, 1e-7, 100, 0.01)
    assert (cfg.pcoeff, cfg.icoeff, cfg.dcoeff, cfg.throw) == (0.0, 1.0, 0.0, True)


def test_the_default_adjoint_is_recursive_checkpointing():
    assert type(config().adjoint) is diffrax.RecursiveCheckpointAdjoint


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(rtol=0.0), "`rtol` must be finite and > 0"),
        (dict(rtol=float("inf")), "`rtol` must be finite and > 0"),
        (dict(atol=()), "`atol` must be"),
        (dict(atol=(1e-6, -1.0)), "`atol` must be"),
        (dict(max_steps=0), "`max_steps` must be a positive int"),
        (dict(max_steps=10.5), "`max_steps` must be a positive int"),
        (dict(dt0=0.0), "`dt0` must be None or finite and > 0"),
    ],
)
def test_invalid_fields_raise_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        config(**kw)


def test_a_non_solver_is_a_type_error():
    with pytest.raises(TypeError, match="`solver` must be a diffrax solver instance"):
        config(solver="Tsit5")


def test_dt0_none_is_allowed():
    assert config(dt0=None).dt0 is None


def test_equal_configs_are_equal_and_hash_equal():
    assert config() == config() and hash(config()) == hash(config())
    assert config() != config(rtol=1e-7)


def test_stepsize_controller_carries_the_tolerances_and_pid_coefficients():
    ctrl = config(pcoeff=0.3, icoeff=0.4).stepsize_controller()
    assert (ctrl.rtol, ctrl.atol, ctrl.pcoeff, ctrl.icoeff) == (1e-8, 1e-10, 0.3, 0.4)


def test_a_tuple_atol_becomes_a_per_component_array():
    ctrl = config(atol=(1e-6, 1e-9)).stepsize_controller()
    np.testing.assert_array_equal(ctrl.atol, [1e-6, 1e-9])


def test_diffeqsolve_saves_at_ts_and_matches_the_analytic_solution():
    ts = jnp.linspace(0.0, 2.0, 7)
    sol = jax.jit(
        lambda ts: config().diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -a * y), ts, jnp.ones(1), 0.5
        )
    )(ts)
    assert sol.ys.shape == (7, 1)
    np.testing.assert_allclose(sol.ys[:, 0], np.exp(-0.5 * np.asarray(ts)), rtol=1e-7)


def test_to_dict_round_trips_through_json():
    cfg = config(atol=(1e-6, 1e-9), adjoint=diffrax.DirectAdjoint(), throw=False, dt0=None)
    back = hk.SolverConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg


def test_from_dict_falls_back_to_defaults_for_optional_keys():
    d = {"solver": "Heun", "rtol": 1e-4, "atol": 1e-6, "max_steps": 10, "dt0": 0.1}
    cfg = hk.SolverConfig.from_dict(d)
    assert type(cfg.solver) is diffrax.Heun and cfg.adjoint == diffrax.RecursiveCheckpointAdjoint()
    assert cfg.throw is True


def test_from_dict_lists_the_available_names_for_an_unknown_solver():
    d = {"solver": "Kencarp4", "rtol": 1e-4, "atol": 1e-6, "max_steps": 10, "dt0": 0.1}
    with pytest.raises(ValueError, match=r"unknown solver 'Kencarp4'; available: \['Bosh3'"):
        hk.SolverConfig.from_dict(d)


def test_to_dict_refuses_an_unregistered_solver_class_even_a_subclass():
    class MyTsit5(diffrax.Tsit5):
        pass

    with pytest.raises(ValueError, match="solver MyTsit5 is not registered"):
        config(solver=MyTsit5()).to_dict()


def test_registering_a_solver_makes_it_serialisable():
    class MyEuler(diffrax.Euler):
        pass

    hk.register_solver("MyEuler", MyEuler)
    try:
        cfg = config(solver=MyEuler())
        assert type(hk.SolverConfig.from_dict(cfg.to_dict()).solver) is MyEuler
    finally:
        del SOLVER_REGISTRY["MyEuler"]


def test_registering_an_adjoint_makes_it_serialisable():
    class MyDirect(diffrax.DirectAdjoint):
        pass

    hk.register_adjoint("MyDirect", MyDirect)
    try:
        back = hk.SolverConfig.from_dict(config(adjoint=MyDirect()).to_dict())
        assert type(back.adjoint) is MyDirect
    finally:
        del ADJOINT_REGISTRY["MyDirect"]
