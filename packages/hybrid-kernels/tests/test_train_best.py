"""Best-step snapshot, restore_best, horizon resets and patience."""

import numpy as np
import pytest
from helpers import osc_dataset, quiet, train


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


def loss_at(oscillator, data, predictors):
    """The training loss measured at `predictors` (one step at learning rate 0)."""
    history, _ = train(oscillator, data, quiet(steps=(1,), lr=(0.0,)), start=predictors)
    return history[0]


def test_best_snapshot_is_the_pre_update_parameters_of_the_minimum(oscillator, clean):
    history, best = train(oscillator, clean, quiet(steps=(15,), lr=(0.3,)))
    assert history.best_step == int(np.argmin(history))
    assert loss_at(oscillator, clean, best) == min(history)
    assert history.best_loss == min(history)


def test_restore_best_false_keeps_the_history_and_returns_the_last_parameters(oscillator, clean):
    config = dict(steps=(15,), lr=(0.3,))
    with_best, best = train(oscillator, clean, quiet(**config))
    without, last = train(oscillator, clean, quiet(restore_best=False, **config))
    assert list(with_best) == list(without)
    assert float(last[0].omega) != float(best[0].omega)
    assert loss_at(oscillator, clean, best) == min(without)


def test_best_restarts_when_the_length_fraction_changes(oscillator, clean):
    history, best = train(
        oscillator, clean, quiet(steps=(15, 4), lr=(0.05, 1.5), length_schedule=(0.3, 1.0))
    )
    start = history.phase_starts[1]
    assert history.best_step >= start
    assert history.best_loss == min(history[start:])
    assert min(history[:start]) < history.best_loss  # without the reset phase 0 would win
    assert loss_at(oscillator, clean, best) == history.best_loss


def test_best_survives_a_phase_boundary_at_the_same_horizon(oscillator, clean):
    history, _ = train(oscillator, clean, quiet(steps=(15, 5), lr=(0.3, 1.5)))
    assert history.best_step == int(np.argmin(history))
    assert history.best_step < history.phase_starts[1]


def test_patience_stops_a_phase_and_restarts_in_the_next(oscillator, clean):
    # lr 0: step 0 sets the best, then nothing improves
    history, _ = train(
        oscillator,
        clean,
        quiet(steps=(10, 5), lr=(0.0, 0.0), reset_optimiser_state=(False, True), patience=3),
    )
    assert history.phase_starts == [0, 4]  # phase 0 stopped after 3 steps without improvement
    # the counter restarted at the boundary: phase 1 got 3 steps, not 0 (its best is phase 0's)
    assert len(history) == 4 + 3


def test_patience_zero_runs_every_step(oscillator, clean):
    history, _ = train(oscillator, clean, quiet(steps=(6,), lr=(0.0,), patience=0))
    assert len(history) == 6
