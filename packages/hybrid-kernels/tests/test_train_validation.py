"""Validation data during training: forward-only scoring, best-restore and early stopping."""

import equinox as eqx
import numpy as np
import pytest
from helpers import osc_dataset, quiet, train

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


@pytest.fixture(scope="module")
def held_out(oscillator):
    return osc_dataset(oscillator, noise=0.05, seed=11)  # same shape, other values


def loss_at(oscillator, data, predictors):
    history, _ = train(oscillator, data, quiet(steps=(1,), lr=(0.0,)), start=predictors)
    return history[0]


def test_validation_runs_every_k_steps_and_at_start_and_end(oscillator, clean, held_out):
    ui = hk.RecordingUI()
    history, _ = train(
        oscillator, clean, quiet(steps=(12,), val_every=5), val_dataset=held_out, ui=ui
    )
    assert [s for s, _ in history.val] == [0, 5, 10, 12]
    assert [e["step"] for e in ui.of("on_validation")] == [0, 5, 10, 12]
    assert len(history) == 12


def test_validation_score_is_the_loss_on_the_validation_data(oscillator, clean):
    # scored on the training data itself, step 0's score is step 0's training loss
    history, _ = train(oscillator, clean, quiet(steps=(3,), val_every=1), val_dataset=clean)
    assert history.val[0][1] == pytest.approx(history[0], rel=1e-12)
    assert history.val[1][1] == pytest.approx(history[1], rel=1e-12)


def test_monitor_val_restores_the_best_validation_snapshot(oscillator, clean, held_out):
    config = quiet(steps=(16,), lr=(0.3,), val_every=2, monitor="val")
    history, best = train(oscillator, clean, config, val_dataset=held_out)
    scores = [v for _, v in history.val]
    assert history.best_loss == min(scores)
    assert history.best_step == history.val[int(np.argmin(scores))][0]
    assert loss_at(oscillator, held_out, best) == pytest.approx(min(scores), rel=1e-12)


def test_validation_patience_stops_the_phase(oscillator, clean, held_out):
    config = quiet(steps=(20,), lr=(0.0,), val_every=2, monitor="val", patience=2)
    history, _ = train(oscillator, clean, config, val_dataset=held_out)
    # scores at 0 (best), 2 and 4 (no improvement, patience 2) -> stop after step 4
    assert len(history) == 4
    assert [s for s, _ in history.val] == [0, 2, 4]


def test_monitor_val_without_validation_data_raises(oscillator, clean):
    with pytest.raises(ValueError, match="monitor='val' needs a val_dataset"):
        train(oscillator, clean, quiet(monitor="val"))


def test_empty_validation_dataset_raises(oscillator, clean):
    empty = eqx.tree_at(lambda d: d.bucket_payloads, clean, ())
    with pytest.raises(ValueError, match="val_dataset has no buckets"):
        train(oscillator, clean, quiet(), val_dataset=empty)
