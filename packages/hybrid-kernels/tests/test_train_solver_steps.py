"""Solver effort in view: accepted and rejected steps per bucket in the history and the UI."""

import io

import numpy as np
import pytest
from helpers import quiet, rate_dataset, rate_train

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def run():
    ui = hk.RecordingUI()
    history, _ = rate_train(rate_dataset(), quiet(steps=(3,)), ui=ui)
    return history, ui


def test_history_records_mean_and_max_steps_per_bucket_for_every_step(run):
    history, _ = run
    assert len(history.solver_steps) == 3
    (mean_acc, max_acc, mean_rej, max_rej), *_ = history.solver_steps[0]
    assert 0 < mean_acc <= max_acc and 0 <= mean_rej <= max_rej
    assert all(len(s) == len(rate_dataset().bucket_payloads) for s in history.solver_steps)


def test_ui_hears_the_solver_steps_of_every_step(run):
    history, ui = run
    events = ui.of("on_solver_steps")
    assert [e["step"] for e in events] == [0, 1, 2]
    assert events[0]["per_bucket"] == history.solver_steps[0]


def test_log_ui_prints_the_solver_steps():
    out = io.StringIO()
    ui = hk.LogUI(every=1, stream=out)
    ui.on_run_start(total_steps=1, num_phases=1)
    ui.on_solver_steps(step=0, per_bucket=((12.0, 15.0, 0.5, 2.0),))
    ui.on_step_end(step=0, phase_idx=0, loss=1.0, penalty=0.0)
    assert "solver steps b0 12/15 r0/2" in out.getvalue()


def test_bucket_step_exposes_the_last_calls_steps_per_row():
    ds = rate_dataset()
    from helpers import RATE_SOLVER, bounded_rate, rate_mask, rate_simulate
    from helpers import identity_output as identity

    start = (bounded_rate(4.0),)
    step = hk.build_bucket_step(
        rate_simulate, identity, RATE_SOLVER, hk.masked_mse, rate_mask(start)
    )
    bp = ds.bucket_payloads[0]
    step(start, bp, 1.0)
    steps = np.asarray(step.last_solver_steps)
    assert steps.shape == (bp.ts.shape[0], 2) and (steps[:, 0] > 0).all()
