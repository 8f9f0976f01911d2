"""`split_dataset`'s size rule: a zero fraction always gets zero experiments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk


def dataset(n):
    exps = [
        hk.make_experiment(
            covariates={},
            channels={"a": hk.ChannelObs(np.arange(3, dtype=float), np.ones(3))},
            y0_fn=lambda cov, ch: jnp.asarray([1.0]),
            exp_id=f"e{i}",
        )
        for i in range(n)
    ]
    return hk.make_dataset(exps, output_channel_names=["a"])


def sizes(n, **fracs):
    parts = hk.split_dataset(dataset(n), key=jax.random.key(0), **fracs)
    return tuple(p.n_experiments for p in parts)


@pytest.mark.parametrize(("n", "expected"), [(3, (2, 1, 0)), (4, (2, 2, 0)), (7, (4, 3, 0))])
def test_a_zero_test_fraction_puts_no_experiment_in_test(n, expected):
    assert sizes(n, train=0.7, val=0.3, test=0.0) == expected


def test_a_zero_validation_fraction_puts_no_experiment_in_val():
    assert sizes(7, train=0.45, val=0.0, test=0.55) == (3, 0, 4)


def test_the_leftover_goes_to_train_when_it_is_the_only_positive_split():
    assert sizes(5, train=1.0, val=0.0, test=0.0) == (5, 0, 0)


def test_the_leftover_goes_to_test_when_its_fraction_is_positive():
    assert sizes(10, train=0.75, val=0.15, test=0.1) == (7, 1, 2)
