"""Resume: TrainingState saved atomically; a killed run resumed ends bit-identical."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import omega_start, osc_dataset, quiet, train

import hybrid_kernels as hk
from hybrid_kernels._training import state as state_module

TESTS = Path(__file__).parent
PHASES = dict(
    steps=(4, 6),
    lr=(0.05, 0.02),
    length_schedule=(0.5, 1.0),
    reset_optimiser_state=(False, True),
    tournament_attempts=2,
    tournament_steps=1,
    tournament_lr=0.02,
)


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


@pytest.fixture(scope="module")
def reference(oscillator, clean):
    """The uninterrupted run."""
    return train(oscillator, clean, quiet(**PHASES))


class Stop(Exception):
    pass


def assert_same_run(a, b):
    (history_a, pred_a), (history_b, pred_b) = a, b
    assert list(history_a) == list(history_b)  # bit-identical floats
    assert history_a.penalties == history_b.penalties
    assert history_a.phase_starts == history_b.phase_starts
    assert history_a.best_step == history_b.best_step
    assert float(pred_a[0].omega) == float(pred_b[0].omega)


CHILD = """
    import os, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    from helpers import osc_dataset, oscillator_model, quiet, train

    oscillator = oscillator_model()
    config = quiet(checkpoint_path=sys.argv[1], checkpoint_every=2, **{phases})

    def die(step, predictors, opt_state):
        if step == 7:
            os._exit(17)  # killed mid-run: no cleanup, no final save

    train(oscillator, osc_dataset(oscillator), config, hooks=die)
"""


def test_killed_run_resumed_in_another_process_is_bit_identical(
    oscillator, clean, reference, tmp_path
):
    path = tmp_path / "run.state"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(phases=repr(PHASES))))
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    child = subprocess.run(
        [sys.executable, str(script), str(path)], env=env, capture_output=True, text=True
    )
    assert child.returncode == 17, child.stderr[-2000:]
    saved = state_module.read_training_meta(path)
    assert saved["step"] == 6 and saved["phase"] == 1  # the last checkpoint before the kill
    ui = hk.RecordingUI()
    resumed = train(oscillator, clean, quiet(checkpoint_path=path, **PHASES), ui=ui)
    assert_same_run(resumed, reference)
    assert any("resumed" in m["text"] for m in ui.of("on_message"))
    assert [e["step"] for e in ui.of("on_step_end")] == [6, 7, 8, 9]  # only the rest ran


def stopped_at(at, oscillator, clean, config):
    """Train with `config` until step `at` stops the run (no final save); return the saved
    checkpoint's `(step, phase, phase_step)`, read by the public reader."""

    def stop(step, predictors, opt_state):
        if step == at:
            raise Stop

    with pytest.raises(Stop):
        train(oscillator, clean, config, hooks=stop)
    meta = hk.read_training_state_metadata(config.checkpoint_path)
    return meta["step"], meta["phase"], meta["phase_step"]


def test_resume_from_a_phase_boundary_is_bit_identical(oscillator, clean, reference, tmp_path):
    config = quiet(checkpoint_path=tmp_path / "boundary.state", checkpoint_every=4, **PHASES)
    assert stopped_at(5, oscillator, clean, config) == (4, 1, 0)
    assert_same_run(train(oscillator, clean, config), reference)


@pytest.mark.slow
def test_a_run_resumed_inside_an_lbfgs_phase_is_bit_identical(oscillator, clean, tmp_path):
    # The field's recipe, Adam then L-BFGS, resumed from a checkpoint two steps into L-BFGS:
    # it holds the curvature memory and the line search's state. The resumed run's first
    # step solves afresh where the uninterrupted one read the line search's value.
    phases = dict(steps=(4, 8), lr=(0.05, 1.0), optimizer=("adam", "lbfgs"))
    uninterrupted = train(oscillator, clean, quiet(**phases))
    config = quiet(checkpoint_path=tmp_path / "lbfgs.state", checkpoint_every=3, **phases)
    assert stopped_at(9, oscillator, clean, config) == (6, 1, 2)
    resumed = train(oscillator, clean, config)
    assert_same_run(resumed, uninterrupted)
    assert uninterrupted[0][-1] < 1e-6 * uninterrupted[0][4]  # L-BFGS did the work


def test_finished_run_is_saved_and_resuming_it_trains_nothing(oscillator, clean, tmp_path):
    path = tmp_path / "done.state"
    config = quiet(steps=(5,), checkpoint_path=path)
    first = train(oscillator, clean, config)
    assert path.exists()
    ui = hk.RecordingUI()
    again = train(oscillator, clean, config, ui=ui)
    assert_same_run(first, again)
    assert ui.count("on_step_end") == 0


def test_resume_false_starts_afresh(oscillator, clean, tmp_path):
    path = tmp_path / "fresh.state"
    train(oscillator, clean, quiet(steps=(3,), checkpoint_path=path))
    ui = hk.RecordingUI()
    train(oscillator, clean, quiet(steps=(3,), checkpoint_path=path, resume=False), ui=ui)
    assert ui.count("on_step_end") == 3


def test_resuming_with_different_settings_raises(oscillator, clean, tmp_path):
    path = tmp_path / "other.state"
    train(oscillator, clean, quiet(steps=(3,), checkpoint_path=path))
    with pytest.raises(ValueError, match="different settings"):
        train(oscillator, clean, quiet(steps=(3,), lr=(0.5,), checkpoint_path=path))


# --- the file format ------------------------------------------------------------------


def example_state(key):
    predictors = omega_start(1.25)
    return hk.TrainingState(
        predictors=predictors,
        opt_state=(jnp.zeros(3), jnp.asarray(4, jnp.int32)),
        step=7,
        phase=1,
        phase_step=2,
        key=key,
        best_predictors=omega_start(1.5),
        best_loss=0.125,
        best_step=3,
        history=[1.0, float("nan"), 0.5],
        penalties=[0.0, 0.0, 0.1],
        val_history=[(0, 2.0)],
        bad_steps=[1],
        since_best=2,
        bad_in_row=0,
        tournament_done=True,
        fingerprint="abc",
        phase_starts=[0, 5],
    )


@pytest.mark.parametrize("key", [jax.random.key(3), jax.random.PRNGKey(3)])
def test_state_round_trips_exactly(tmp_path, key):
    original = example_state(key)
    path = tmp_path / "s.state"
    hk.save_training_state(path, original)
    loaded = hk.load_training_state(
        path, predictors=omega_start(), opt_state=(jnp.ones(3), jnp.asarray(0, jnp.int32))
    )
    assert float(loaded.predictors[0].omega) == 1.25
    assert float(loaded.best_predictors[0].omega) == 1.5
    assert np.array_equal(loaded.opt_state[0], np.zeros(3))
    assert loaded.opt_state[1].dtype == jnp.int32
    assert loaded.history[0] == 1.0 and np.isnan(loaded.history[1])
    assert (loaded.step, loaded.phase, loaded.phase_step, loaded.best_step) == (7, 1, 2, 3)
    assert loaded.val_history == [(0, 2.0)] and loaded.phase_starts == [0, 5]
    assert np.array_equal(jax.random.key_data(loaded.key), jax.random.key_data(key))
    assert loaded.key.dtype == key.dtype


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "s.state"
    hk.save_training_state(path, example_state(jax.random.key(0)))
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(state_module.np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        hk.save_training_state(path, example_state(jax.random.key(1)))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.state"]


def test_loading_with_a_mismatched_template_raises(tmp_path):
    path = tmp_path / "s.state"
    hk.save_training_state(path, example_state(jax.random.key(0)))
    with pytest.raises(ValueError, match="saved opt_state array 0 has shape"):
        hk.load_training_state(
            path, predictors=omega_start(), opt_state=(jnp.ones(4), jnp.asarray(0, jnp.int32))
        )
    with pytest.raises(ValueError, match="saved opt_state has 2 arrays but the template has 1"):
        hk.load_training_state(path, predictors=omega_start(), opt_state=(jnp.ones(3),))


def test_a_file_that_is_not_a_state_raises(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(2))
    with pytest.raises(ValueError, match="not a saved TrainingState"):
        hk.load_training_state(path, predictors=omega_start(), opt_state=())
