"""optax optimisers of other kinds through the trainer: those whose update reads the
objective's value (`optax.contrib.reduce_on_plateau`), given the loss of the step's
parameters plus the weighted penalty, and `optax.MultiSteps`."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from helpers import osc_dataset, quiet, rate_dataset, rate_train, train

import hybrid_kernels as hk


class Seen(NamedTuple):
    value: jax.Array


def seen_value() -> optax.GradientTransformationExtraArgs:
    """Passes the updates through and keeps the `value` its update was given."""

    def init(params):
        return Seen(jnp.zeros((), jnp.result_type(float)))

    def update(updates, state, params=None, *, value, **extra):
        return updates, Seen(jnp.asarray(value, state.value.dtype))

    return optax.GradientTransformationExtraArgs(init, update)


class Collect:
    """A hook that keeps one number read from the optimiser state after every step."""

    def __init__(self, read):
        self.read, self.values = read, []

    def between_steps(self, step, predictors, opt_state):
        self.values.append(float(self.read(opt_state)))
        return predictors, opt_state


@pytest.fixture(scope="module")
def dataset(oscillator):
    return osc_dataset(oscillator)


def test_the_update_is_given_each_steps_loss(oscillator, dataset):
    hook = Collect(lambda state: state[1].value)
    chain = optax.chain(optax.adam(0.05), seen_value())
    history, _ = train(oscillator, dataset, quiet(steps=(8,), optimizer=(chain,)), hooks=hook)
    # The hook runs between steps, so after every step but the last.
    assert len(hook.values) == len(history) - 1
    assert hook.values == list(history)[:-1]  # the loss where each update started


def test_the_value_includes_the_weighted_penalty():
    hook = Collect(lambda state: state[1].value)
    weight = 1e3
    config = hk.OptaxTrainingConfig(
        steps=(6,),
        lr=(0.1,),
        optimizer=(optax.chain(optax.adam(0.1), seen_value()),),
        penalty_weight=(weight,),
        verbose=False,
    )
    history, _ = rate_train(rate_dataset(), config, hooks=hook)
    expected = np.asarray(history) + weight * np.asarray(history.penalties)
    assert min(history.penalties) > 0 and len(hook.values) == len(history) - 1
    np.testing.assert_allclose(hook.values, expected[:-1], rtol=1e-12)


def test_reduce_on_plateau_lowers_its_scale_through_the_trainer(oscillator, dataset):
    hook = Collect(lambda state: state[1].scale)
    chain = optax.chain(optax.adam(0.05), optax.contrib.reduce_on_plateau(factor=0.5, patience=2))
    history, (fitted,) = train(
        oscillator, dataset, quiet(steps=(40,), optimizer=(chain,)), hooks=hook
    )
    assert np.all(np.isfinite(history)) and history[-1] < 0.1 * history[0]
    assert hook.values[0] == 1.0 and min(hook.values) < 1.0  # it saw the losses stall
    assert all(b <= a for a, b in zip(hook.values, hook.values[1:], strict=False))
    assert abs(float(fitted.omega) - 1.3) < 0.1


def test_an_optimizer_without_extra_arguments_is_called_without_the_value(oscillator, dataset):
    sgd = optax.sgd(0.05)
    plain = optax.GradientTransformation(sgd.init, lambda g, s, p=None: sgd.update(g, s, p))
    history, _ = train(oscillator, dataset, quiet(steps=(4,), optimizer=(plain,)))
    reference, _ = train(oscillator, dataset, quiet(steps=(4,), optimizer=(sgd,)))
    assert list(history) == list(reference)


def test_multi_steps_applies_an_update_every_kth_step(oscillator, dataset):
    accumulate = optax.MultiSteps(optax.adam(0.05), every_k_schedule=2)
    history, _ = train(oscillator, dataset, quiet(steps=(6,), optimizer=(accumulate,)))
    # Steps 0 and 1 start from the same parameters (the first update only accumulates).
    assert history[0] == history[1] and history[2] == history[3] and history[4] == history[5]
    assert history[2] < history[0] and history[4] < history[2]


def test_polyak_sgd_which_needs_the_value_trains(oscillator, dataset):
    history, (fitted,) = train(
        oscillator, dataset, quiet(steps=(30,), optimizer=(optax.polyak_sgd(0.5),))
    )
    assert history[-1] < 1e-8 * history[0]
    assert abs(float(fitted.omega) - 1.3) < 1e-6


class CountSteps(hk.SilentUI):
    steps = 0

    def on_step_end(self, **kwargs):
        self.steps += 1


@pytest.mark.parametrize(
    ("optimizer", "cause"),
    [
        # The cause, as optax raised it (the message names both kinds in its advice too).
        (optax.lookahead(optax.adam(1e-2), 5, 0.5), r"\(AttributeError: .*fast"),
        (optax.contrib.sophia(1e-2), r"\(ValueError: obj_fn must be provided"),
    ],
    ids=["lookahead", "sophia"],
)
def test_an_optimizer_that_cannot_take_the_trainable_leaves_is_named_before_any_step(
    oscillator, optimizer, cause
):
    # The second phase's: named before the first phase's steps are spent.
    config = quiet(steps=(2, 2), lr=(0.05, 0.05), optimizer=("adam", optimizer))
    ui = CountSteps()
    with pytest.raises(TypeError, match=r"optimizer\[1\] cannot update the trainable leaves"):
        train(oscillator, osc_dataset(oscillator), config, ui=ui)
    assert ui.steps == 0
    with pytest.raises(TypeError, match=cause):
        train(oscillator, osc_dataset(oscillator), config)


def test_an_optimizer_that_takes_only_the_value_passes_the_check_and_trains(oscillator):
    # The check calls it as the step does: `value` alone, no `grad` or `value_fn`.
    def update(updates, state, params=None, *, value):
        return jax.tree.map(lambda g: -0.05 * g, updates), Seen(jnp.asarray(value))

    only_value = optax.GradientTransformationExtraArgs(
        lambda params: Seen(jnp.zeros((), jnp.result_type(float))), update
    )
    history, _ = train(oscillator, osc_dataset(oscillator), quiet(optimizer=(only_value,)))
    assert history[-1] < history[0]
