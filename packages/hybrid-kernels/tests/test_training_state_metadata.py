"""`read_training_state_metadata`: a saved state's counters and histories, without templates."""

import jax
import jax.numpy as jnp
import pytest

import hybrid_kernels as hk


def saved_state(tmp_path):
    state = hk.TrainingState(
        predictors={"w": jnp.arange(3.0)},
        opt_state=(jnp.zeros(3),),
        step=7,
        phase=1,
        phase_step=2,
        key=jax.random.key(3),
        best_predictors={"w": jnp.ones(3)},
        best_loss=0.125,
        best_step=3,
        history=[1.0, 0.75, 0.5],
        penalties=[0.0, 0.0, 0.1],
        val_history=[(0, 2.0)],
        bad_steps=[1],
        tournament_done=True,
        fingerprint="abc",
        phase_starts=[0, 5],
        failed={4: ("e1",)},
    )
    path = tmp_path / "run.state"
    hk.save_training_state(path, state)
    return path, state


def test_reads_the_counters_without_templates(tmp_path):
    path, _ = saved_state(tmp_path)
    meta = hk.read_training_state_metadata(path)
    assert (meta["step"], meta["phase"], meta["phase_step"]) == (7, 1, 2)
    assert (meta["best_loss"], meta["best_step"]) == (0.125, 3)


def test_gives_what_load_training_state_would_for_every_non_array_field(tmp_path):
    path, _ = saved_state(tmp_path)
    meta = hk.read_training_state_metadata(path)
    loaded = hk.load_training_state(path, predictors={"w": jnp.zeros(3)}, opt_state=(jnp.zeros(3),))
    assert set(meta) == set(vars(loaded)) - {"predictors", "opt_state", "best_predictors", "key"}
    for name, value in meta.items():
        assert value == getattr(loaded, name), name
    assert meta["failed"] == {4: ("e1",)} and meta["val_history"] == [(0, 2.0)]


def test_refuses_a_file_that_is_not_a_training_state(tmp_path):
    path = tmp_path / "predictors.eqx"
    hk.save_predictors(path, {"w": jnp.ones(2)})
    with pytest.raises(ValueError, match="TrainingState"):
        hk.read_training_state_metadata(path)


def test_refuses_an_altered_file(tmp_path):
    path, _ = saved_state(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"run\.state"):
        hk.read_training_state_metadata(path)
