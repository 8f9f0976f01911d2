"""Safe steps: a non-finite step is skipped and reported; too many in a row stop the run."""

import jax
import numpy as np
import pytest
from helpers import flag_config, flag_train, osc_dataset, set_flag

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


class FlagBetween:
    """Sets the NaN flag for the steps in `bad` and records what each hook call saw."""

    def __init__(self, bad):
        self.bad = set(bad)
        self.seen = {}

    def between_steps(self, step, predictors, opt_state):
        self.seen[step] = (float(predictors[0].omega), jax.tree.leaves(opt_state))
        return set_flag(predictors, int(step in self.bad)), opt_state


def test_non_finite_steps_are_not_applied_and_training_continues(clean):
    hook = FlagBetween(bad={3, 4})  # the flag is set before steps 3 and 4
    ui = hk.RecordingUI()
    history, _ = flag_train(clean, flag_config(steps=(8,)), hooks=hook, ui=ui)
    assert history.bad_steps == [3, 4]
    assert [e["step"] for e in ui.of("on_bad_step")] == [3, 4]
    assert not np.isfinite(history[3]) or not np.isfinite(history.penalties[3])
    # parameters and optimiser state after steps 3 and 4 equal those before step 3
    omega3, state3 = hook.seen[3]
    for after in (4, 5):
        omega, state = hook.seen[after]
        assert omega == omega3
        assert all(np.array_equal(a, b) for a, b in zip(state, state3, strict=True))
    assert hook.seen[6][0] != omega3  # step 5 was good again and moved on
    assert len(history) == 8 and np.isfinite(history[-1])


def test_too_many_bad_steps_in_a_row_stop_with_phase_and_step_named(clean):
    hook = FlagBetween(bad=range(6, 100))  # from step 6 on, every step is non-finite
    config = flag_config(steps=(4, 10), lr=(0.05, 0.05), max_bad_steps=3)
    with pytest.raises(hk.NonFiniteTrainingError, match="phase 1 at step 8") as info:
        flag_train(clean, config, hooks=hook)
    err = info.value
    assert (err.phase, err.step) == (1, 8)
    assert err.history.bad_steps == [6, 7, 8]
    # nothing learned is lost: the last good and the best parameters come with the error
    assert float(err.predictors[0].omega) == hook.seen[6][0]
    assert np.isfinite(float(err.best_predictors[0].omega))
    assert err.history.best_step < 6


def test_bad_steps_do_not_count_as_best(clean):
    hook = FlagBetween(bad={2})
    history, _ = flag_train(clean, flag_config(steps=(5,)), hooks=hook)
    assert history.best_step != 2


def test_error_closes_the_ui_run(clean):
    ui = hk.RecordingUI()
    with pytest.raises(hk.NonFiniteTrainingError):
        flag_train(
            clean,
            flag_config(steps=(6,), max_bad_steps=2),
            hooks=FlagBetween(bad=range(1, 10)),
            ui=ui,
        )
    assert ui.events[-1][0] == "on_run_end"
