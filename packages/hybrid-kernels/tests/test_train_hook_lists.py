"""`hooks=[a, b, ...]`: several hooks run in order after each step, each given what the one
before returned; their events are recorded hook by hook, and their states are checkpointed
and restored one by one."""

import jax
import jax.numpy as jnp
import pytest
from helpers import osc_dataset, quiet, train
from test_train_hook_state import Nudger, Stop, StopAfterFour

from hybrid_kernels._training.state import read_training_meta

STEPS = (6,)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


class Scale:
    """Multiplies omega by `factor` after every step."""

    def __init__(self, factor):
        self.factor = factor

    def between_steps(self, step, predictors, opt_state):
        return jax.tree.map(lambda x: x * jnp.asarray(self.factor, x.dtype), predictors), opt_state


class Watch:
    """Records the omega it is given and reports it as an event; changes nothing."""

    def __init__(self):
        self.seen, self.events = [], []

    def between_steps(self, step, predictors, opt_state):
        self.seen.append(float(predictors[0].omega))
        self.events.append({"kind": "watch", "omega": self.seen[-1]})


def test_each_hook_is_given_what_the_one_before_returned(oscillator, clean):
    before, after = Watch(), Watch()
    train(oscillator, clean, quiet(steps=(3,)), hooks=[before, Scale(2.0), after])
    assert after.seen == pytest.approx([2.0 * omega for omega in before.seen], rel=1e-15)


def test_the_list_trains_as_one_hook_doing_both_edits(oscillator, clean):
    listed, _ = train(oscillator, clean, quiet(steps=(4,)), hooks=[Scale(1.01), Scale(0.98)])
    single, _ = train(oscillator, clean, quiet(steps=(4,)), hooks=Scale(1.01 * 0.98))
    assert list(listed) == pytest.approx(list(single), rel=1e-12)


def test_events_are_recorded_hook_by_hook(oscillator, clean):
    first, second = Watch(), Nudger()
    history, _ = train(oscillator, clean, quiet(steps=STEPS), hooks=[first, second])
    kinds = [(e["step"], e["kind"]) for e in history.events]
    expected = [(s, "watch") for s in range(1, 6)]
    for step in (2, 4):  # the second hook's tick after the first hook's watch of that step
        expected.insert(expected.index((step, "watch")) + 1, (step, "tick"))
    assert kinds == expected


class StopAt:
    """Stateless; raises `Stop` after step `step` (never when `None`)."""

    def __init__(self, step):
        self.step = step

    def between_steps(self, step, predictors, opt_state):
        if step == self.step:
            raise Stop


def _interrupted(oscillator, clean, path, hooks):
    config = quiet(steps=STEPS, checkpoint_path=path, checkpoint_every=3)
    with pytest.raises(Stop):
        train(oscillator, clean, config, hooks=[*hooks, StopAt(4)])
    return config


def test_every_stateful_hook_is_checkpointed_and_restored(oscillator, clean, tmp_path):
    path = tmp_path / "hooks.state"
    config = _interrupted(oscillator, clean, path, [Nudger(), Watch(), Nudger()])
    saved = read_training_meta(path)["hook_state"]
    three = {"calls": 3, "events": [{"kind": "tick", "calls": 2}]}
    assert saved == {"hook_list": [three, None, three, None]}
    resumed = [Nudger(), Watch(), Nudger(), StopAt(None)]
    history, trained = train(oscillator, clean, config, hooks=resumed)
    straight_history, straight = train(
        oscillator, clean, quiet(steps=STEPS), hooks=[Nudger(), Watch(), Nudger()]
    )
    assert resumed[0].calls == resumed[2].calls == 5
    assert float(trained[0].omega) == pytest.approx(float(straight[0].omega), rel=1e-12)
    assert list(history) == pytest.approx(list(straight_history), rel=1e-12)


def test_resuming_with_other_hooks_is_a_value_error(oscillator, clean, tmp_path):
    path = tmp_path / "hooks.state"
    config = _interrupted(oscillator, clean, path, [Nudger(), Nudger()])
    with pytest.raises(ValueError, match="state of different hooks"):
        train(oscillator, clean, config, hooks=[Nudger(), StopAt(None)])
    with pytest.raises(ValueError, match="state of different hooks"):
        train(oscillator, clean, config, hooks=Nudger())  # one hook, not a list
    single = tmp_path / "single.state"
    config = quiet(steps=STEPS, checkpoint_path=single, checkpoint_every=3)
    with pytest.raises(Stop):
        train(oscillator, clean, config, hooks=StopAfterFour())
    with pytest.raises(ValueError, match="state of different hooks"):
        train(oscillator, clean, config, hooks=[Nudger()])  # a list, not one hook


def test_an_element_that_is_not_a_hook_is_named_by_its_index(oscillator, clean):
    with pytest.raises(TypeError, match=r"hooks\[1\]=3 has no between_steps"):
        train(oscillator, clean, quiet(steps=(2,)), hooks=[Watch(), 3])


def test_an_empty_list_is_no_hook(oscillator, clean):
    listed, _ = train(oscillator, clean, quiet(steps=(3,)), hooks=[])
    plain, _ = train(oscillator, clean, quiet(steps=(3,)))
    assert list(listed) == list(plain)
