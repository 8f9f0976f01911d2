"""Events a between-steps hook reports: recorded in the history, plotted, kept on resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import omega_start, osc_dataset, quiet, train

import hybrid_kernels as hk
from hybrid_kernels._training.state import read_training_meta

STEPS = (6,)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


@dataclasses.dataclass
class Commit:
    step: int
    kind: str
    slots: tuple[int, ...]
    accepted: bool
    change: float


class Reporter:
    """Reports a dataclass event at steps 2 and 4 (the second one rejected)."""

    def __init__(self, events=()):
        self.events = list(events)

    def between_steps(self, step, predictors, opt_state):
        if step in (2, 4):
            change = np.float32(0.25)  # NumPy scalars are saved as numbers
            self.events.append(Commit(step, "pair", (step, step + 1), step == 2, change))


EXPECTED = [
    {"step": 2, "kind": "pair", "slots": [2, 3], "accepted": True, "change": 0.25},
    {"step": 4, "kind": "pair", "slots": [4, 5], "accepted": False, "change": 0.25},
]


def test_events_a_hook_appends_are_recorded_as_json_dicts(oscillator, clean):
    history, _ = train(oscillator, clean, quiet(steps=STEPS), hooks=Reporter())
    assert history.events == EXPECTED


def test_dict_events_get_the_step_the_hook_ran_at(oscillator, clean):
    class Tagger(Reporter):
        def between_steps(self, step, predictors, opt_state):
            if step == 3:
                self.events.append({"kind": "note"})

    history, _ = train(oscillator, clean, quiet(steps=STEPS), hooks=Tagger())
    assert history.events == [{"step": 3, "kind": "note"}]


def test_events_from_before_the_run_are_not_recorded(oscillator, clean):
    old = Commit(0, "old", (), True, 0.0)
    history, _ = train(oscillator, clean, quiet(steps=STEPS), hooks=Reporter([old]))
    assert history.events == EXPECTED


def test_a_function_hook_records_no_events(oscillator, clean):
    history, _ = train(oscillator, clean, quiet(steps=STEPS), hooks=lambda s, p, o: None)
    assert history.events == []


def test_an_event_that_is_not_json_serialisable_is_a_type_error(oscillator, clean):
    class Bad(Reporter):
        def between_steps(self, step, predictors, opt_state):
            self.events.append({"where": object()})

    with pytest.raises(TypeError, match="after step 1 that is not JSON-serialisable"):
        train(oscillator, clean, quiet(steps=STEPS), hooks=Bad())


def test_an_event_of_another_type_is_a_type_error(oscillator, clean):
    class Bad(Reporter):
        def between_steps(self, step, predictors, opt_state):
            self.events.append("pair")

    with pytest.raises(TypeError, match="events must be dicts or dataclass instances"):
        train(oscillator, clean, quiet(steps=STEPS), hooks=Bad())


class Stop(Exception):
    pass


def test_events_survive_save_and_resume(oscillator, clean, tmp_path):
    path = tmp_path / "events.state"
    config = quiet(steps=STEPS, checkpoint_path=path, checkpoint_every=3)

    class StopAfterFour(Reporter):
        def between_steps(self, step, predictors, opt_state):
            super().between_steps(step, predictors, opt_state)
            if step == 4:
                raise Stop

    with pytest.raises(Stop):
        train(oscillator, clean, config, hooks=StopAfterFour())
    assert read_training_meta(path)["events"] == EXPECTED[:1]  # saved after step 3
    history, _ = train(oscillator, clean, config, hooks=Reporter())
    assert history.events == EXPECTED


def test_plot_history_marks_accepted_and_rejected_events():
    matplotlib = pytest.importorskip("matplotlib", reason="the `plot` extra is not installed")
    matplotlib.use("Agg")
    history = hk.LossHistory([3.0, 2.0, 1.0, 0.5, 0.4])
    history.events = [dict(e) for e in EXPECTED]
    ax = hk.plot_history(history)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["transition"].get_xdata()[0] == pytest.approx(1.5)  # before loss index 2
    assert lines["rejected transition"].get_xdata()[0] == pytest.approx(3.5)
    assert [t.get_text() for t in ax.texts] == ["pair", "pair"]


def test_training_state_keeps_events(tmp_path):
    events = [{"step": 3, "kind": "zero_output_birth", "slots": [7], "accepted": True}]
    state = hk.TrainingState(
        predictors=omega_start(),
        opt_state=jnp.zeros(2),
        step=4,
        phase=0,
        phase_step=4,
        key=jax.random.key(0),
        best_predictors=omega_start(),
        best_loss=1.0,
        best_step=0,
        history=[1.0] * 4,
        penalties=[0.0] * 4,
        val_history=[],
        bad_steps=[],
        events=events,
    )
    hk.save_training_state(tmp_path / "s.state", state)
    loaded = hk.load_training_state(
        tmp_path / "s.state", predictors=omega_start(), opt_state=jnp.ones(2)
    )
    assert loaded.events == events
