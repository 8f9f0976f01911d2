"""annealing_schedule: multipliers for custom loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk


@pytest.mark.parametrize("kind", ["cosine", "linear", "exponential", "warmup_cosine"])
def test_every_kind_lands_on_the_end_value_and_stays(kind):
    s = hk.annealing_schedule(kind, total_epochs=20, init_value=2.0, end_value=0.1, warmup_epochs=5)
    for step in (20, 25, 100):
        assert float(s(step)) == pytest.approx(0.1, rel=1e-6)


@pytest.mark.parametrize("kind", ["cosine", "linear", "exponential"])
def test_decaying_kinds_start_at_init_and_never_increase(kind):
    s = hk.annealing_schedule(kind, total_epochs=10, init_value=1.5, end_value=0.15)
    values = np.array([float(s(i)) for i in range(12)])
    assert values[0] == pytest.approx(1.5)
    assert np.all(np.diff(values) <= 1e-12)


def test_warmup_cosine_rises_to_the_peak_then_decays():
    s = hk.annealing_schedule("warmup_cosine", total_epochs=10, warmup_epochs=4)
    values = [float(s(i)) for i in range(11)]
    assert values[0] == 0.0 and values[4] == pytest.approx(1.0)
    assert values.index(max(values)) == 4


def test_exponential_is_geometric():
    s = hk.annealing_schedule("exponential", total_epochs=4, init_value=1.0, end_value=1e-4)
    np.testing.assert_allclose([float(s(i)) for i in range(5)], [1, 0.1, 1e-2, 1e-3, 1e-4])


def test_exponential_with_default_arguments_decays_two_decades():
    s = hk.annealing_schedule("exponential", total_epochs=10)
    assert float(s(0)) == pytest.approx(1.0) and float(s(10)) == pytest.approx(0.01)


@pytest.mark.parametrize("kind", ["cosine", "linear", "warmup_cosine"])
def test_other_kinds_end_at_zero_by_default(kind):
    assert float(hk.annealing_schedule(kind, total_epochs=10, warmup_epochs=2)(10)) == 0.0


def test_constant_is_constant():
    s = hk.annealing_schedule("constant", total_epochs=3, init_value=0.5)
    assert {float(s(i)) for i in range(6)} == {0.5}


def test_schedule_works_under_jit_on_a_traced_step():
    s = hk.annealing_schedule("cosine", total_epochs=8)
    assert float(jax.jit(s)(jnp.asarray(4))) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"kind": "step"}, "kind='step'"),
        ({"total_epochs": 0}, "`total_epochs` must be an int >= 1"),
        ({"init_value": 0.0}, "init_value must be finite and positive"),
        ({"init_value": math.inf}, "init_value must be finite and positive"),
        ({"end_value": 2.0}, r"end_value=2.0 must lie in \[0, init_value=1.0\]"),
        ({"kind": "warmup_cosine", "warmup_epochs": 10}, "warmup_epochs=10 must lie in"),
        ({"kind": "exponential", "end_value": 0.0}, "needs end_value > 0"),
    ],
)
def test_bad_arguments_raise(kwargs, words):
    kwargs.setdefault("total_epochs", 10)
    with pytest.raises(ValueError, match=words):
        hk.annealing_schedule(**kwargs)


def test_total_epochs_must_be_an_int_not_a_float():
    with pytest.raises(TypeError, match=r"`total_epochs` must be an int, got 10\.0"):
        hk.annealing_schedule("cosine", total_epochs=10.0)
