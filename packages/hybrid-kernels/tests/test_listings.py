"""Read-only listings of the names the package accepts: losses, solvers, adjoints, bounds."""

import diffrax
import pytest

import hybrid_kernels as hk
from hybrid_kernels import _solver

LISTINGS = [
    hk.available_losses,
    hk.available_solvers,
    hk.available_adjoints,
    hk.available_bound_transforms,
    hk.available_warps,
]


@pytest.mark.parametrize("listing", LISTINGS)
def test_a_listing_is_a_sorted_tuple_of_names(listing):
    names = listing()
    assert isinstance(names, tuple) and names
    assert list(names) == sorted(names) and all(isinstance(n, str) for n in names)


def test_every_listed_loss_resolves():
    assert hk.available_losses() == ("bal_mle", "bal_mse", "mle", "mse")
    for name in hk.available_losses():
        assert callable(hk.resolve_loss_fn(name))


def test_an_unknown_loss_error_lists_the_same_names():
    with pytest.raises(ValueError, match="available") as info:
        hk.resolve_loss_fn("huber")
    assert str(list(hk.available_losses())) in str(info.value)


def test_every_listed_solver_and_adjoint_round_trips_through_from_dict():
    base = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-6, atol=1e-8, max_steps=16, dt0=None).to_dict()
    for name in hk.available_solvers():
        assert hk.SolverConfig.from_dict({**base, "solver": name}).to_dict()["solver"] == name
    for name in hk.available_adjoints():
        assert hk.SolverConfig.from_dict({**base, "adjoint": name}).to_dict()["adjoint"] == name


def test_the_implicit_solvers_a_stiff_model_needs_are_known_without_registering():
    config = hk.SolverConfig(diffrax.Kvaerno5(), rtol=1e-6, atol=1e-8, max_steps=16, dt0=None)
    assert config.to_dict()["solver"] == "Kvaerno5"
    assert {"ImplicitEuler", "Kvaerno3", "Kvaerno4", "Kvaerno5"} <= set(hk.available_solvers())


def test_registered_solvers_and_adjoints_are_listed(monkeypatch):
    monkeypatch.setattr(_solver, "SOLVER_REGISTRY", dict(_solver.SOLVER_REGISTRY))
    monkeypatch.setattr(_solver, "ADJOINT_REGISTRY", dict(_solver.ADJOINT_REGISTRY))
    hk.register_solver("MyEuler", diffrax.Euler)
    hk.register_adjoint("MyImplicit", diffrax.ImplicitAdjoint)
    assert "MyEuler" in hk.available_solvers()
    assert "MyImplicit" in hk.available_adjoints()


def test_a_listing_cannot_change_what_is_accepted():
    names = hk.available_solvers()
    with pytest.raises(AttributeError):
        names.append("Bogus")  # type: ignore[attr-defined]
    assert "Bogus" not in hk.available_solvers()


@pytest.mark.parametrize("transform", hk.available_bound_transforms())
@pytest.mark.parametrize("warp", hk.available_warps())
def test_every_listed_transform_and_warp_builds_a_bound_scaler(transform, warp):
    scaler = hk.BoundScaler([(0.5, 2.0)], transform=transform, warp=warp)
    assert (scaler.transform, scaler.warp) == (transform, warp)


def test_bound_transforms_and_warps_name_the_built_ins():
    assert hk.available_bound_transforms() == ("algebraic", "sigmoid")
    assert hk.available_warps() == ("linear", "log")
