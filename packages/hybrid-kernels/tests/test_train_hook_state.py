"""A hook with `state_dict`/`load_state_dict` keeps its state across a checkpoint and resume."""

import jax
import jax.numpy as jnp
import pytest
from helpers import osc_dataset, quiet, train

from hybrid_kernels._training.state import read_training_meta

STEPS = (6,)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


class Nudger:
    """Stateful: counts its calls, nudges omega by `0.01 * calls` and reports at 2 and 4.

    What it does after a resume depends on the restored count, so a resume that lost the
    state would end at other parameters.
    """

    def __init__(self):
        self.calls = 0
        self.events = []

    def between_steps(self, step, predictors, opt_state):
        self.calls += 1
        if step in (2, 4):
            self.events.append({"kind": "tick", "calls": self.calls})
        nudged = jax.tree.map(lambda x: x + jnp.asarray(0.01 * self.calls, x.dtype), predictors)
        return nudged, opt_state

    def state_dict(self):
        return {"calls": self.calls, "events": list(self.events)}

    def load_state_dict(self, state):
        self.calls = state["calls"]
        self.events = list(state["events"])


class Stop(Exception):
    pass


class StopAfterFour(Nudger):
    def between_steps(self, step, predictors, opt_state):
        result = super().between_steps(step, predictors, opt_state)
        if step == 4:
            raise Stop
        return result


def _interrupted(oscillator, clean, path):
    config = quiet(steps=STEPS, checkpoint_path=path, checkpoint_every=3)
    with pytest.raises(Stop):
        train(oscillator, clean, config, hooks=StopAfterFour())
    return config


def test_the_checkpoint_holds_the_hooks_state_dict(oscillator, clean, tmp_path):
    path = tmp_path / "hook.state"
    _interrupted(oscillator, clean, path)
    saved = read_training_meta(path)["hook_state"]  # saved after step 3
    assert saved == {"calls": 3, "events": [{"kind": "tick", "calls": 2}]}


def test_a_resumed_run_equals_the_uninterrupted_one(oscillator, clean, tmp_path):
    path = tmp_path / "hook.state"
    config = _interrupted(oscillator, clean, path)
    hook = Nudger()
    history, trained = train(oscillator, clean, config, hooks=hook)
    straight_history, straight = train(oscillator, clean, quiet(steps=STEPS), hooks=Nudger())
    assert hook.calls == 5  # restored at 3, then steps 4 and 5
    assert float(trained[0].omega) == pytest.approx(float(straight[0].omega), rel=1e-12)
    assert list(history) == pytest.approx(list(straight_history), rel=1e-12)


def test_events_the_hook_restores_are_not_recorded_twice(oscillator, clean, tmp_path):
    path = tmp_path / "hook.state"
    config = _interrupted(oscillator, clean, path)
    history, _ = train(oscillator, clean, config, hooks=Nudger())
    assert [e["calls"] for e in history.events] == [2, 4]


def test_a_hook_without_state_dict_saves_none(oscillator, clean, tmp_path):
    path = tmp_path / "plain.state"
    config = quiet(steps=STEPS, checkpoint_path=path, checkpoint_every=3)
    train(oscillator, clean, config, hooks=lambda step, predictors, opt_state: None)
    assert read_training_meta(path)["hook_state"] is None


def test_resuming_hook_state_without_load_state_dict_is_a_value_error(oscillator, clean, tmp_path):
    path = tmp_path / "hook.state"
    config = _interrupted(oscillator, clean, path)
    with pytest.raises(ValueError, match="has no load_state_dict"):
        train(oscillator, clean, config, hooks=lambda step, predictors, opt_state: None)


def test_a_state_dict_that_is_not_json_is_a_type_error(oscillator, clean, tmp_path):
    class Unsaveable(Nudger):
        def state_dict(self):
            return {"calls": object()}

    config = quiet(steps=STEPS, checkpoint_path=tmp_path / "bad.state", checkpoint_every=3)
    with pytest.raises(TypeError, match="state_dict\\(\\) is not JSON-serialisable"):
        train(oscillator, clean, config, hooks=Unsaveable())
