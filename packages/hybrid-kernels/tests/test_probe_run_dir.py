"""Probe scenarios (issue 22): a run folder never mixes two runs, and saves clean up.

Each file of a run folder is bound to its `run.json` by a SHA-256 recorded there. A file
copied in from another run, or a `run.json` copied from another run, is refused naming the
file; a folder written before the digests loads with a warning.
"""

import json
import os
import re
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels import _atomic
from hybrid_kernels._training import run_dir


def predictors(k):
    return (Rate(jnp.asarray(k)), eqx.nn.Linear(2, 1, key=jax.random.key(0)))


CONFIG = hk.OptaxTrainingConfig(steps=(4,), lr=(0.01,), verbose=False)


def _state(p, step):
    opt_state = optax.sgd(0.1).init(eqx.filter(p, eqx.is_inexact_array))
    return hk.TrainingState(
        predictors=p,
        opt_state=opt_state,
        step=step,
        phase=0,
        phase_step=step,
        key=jax.random.key(step),
        best_predictors=p,
        best_loss=0.5,
        best_step=0,
        history=[1.0] * step,
        penalties=[0.0] * step,
        val_history=[],
        bad_steps=[],
    )


def _save(path, k, *, with_state=True, step=3):
    p = predictors(k)
    state = _state(p, step) if with_state else None
    hist = hk.LossHistory([float(k)] * step)
    return hk.save_run(path, p, solver=tiny_solver(), config=CONFIG, history=hist, state=state)


@pytest.fixture
def two_runs(tmp_path):
    return _save(tmp_path / "A", 0.7, step=3), _save(tmp_path / "B", 0.2, step=5)


def _load(path):
    p = predictors(0.0)
    return hk.load_run(path, p, opt_state=optax.sgd(0.1).init(eqx.filter(p, eqx.is_inexact_array)))


def test_an_untouched_run_loads(two_runs):
    a, _ = two_runs
    run = _load(a)
    assert float(run.predictors[0].k) == pytest.approx(0.7)
    assert run.state.step == 3


@pytest.mark.parametrize("name", ["predictors.eqx", "training_state.npz", "run.json"])
def test_a_file_copied_from_another_run_is_refused_naming_it(two_runs, name):
    a, b = two_runs
    shutil.copyfile(b / name, a / name)
    with pytest.raises(ValueError, match=re.escape(repr(str(a / name)))):
        _load(a)


def test_a_manifest_from_another_run_is_named_as_the_odd_one_out(two_runs):
    a, b = two_runs
    shutil.copyfile(b / "run.json", a / "run.json")
    with pytest.raises(ValueError, match="does not belong to the files beside it"):
        _load(a)


def test_a_copied_file_is_refused_even_without_an_opt_state_template(two_runs):
    a, b = two_runs
    shutil.copyfile(b / "training_state.npz", a / "training_state.npz")
    with pytest.raises(ValueError, match=r"training_state\.npz"):
        hk.load_run(a, predictors(0.0))  # the state itself is not read


@pytest.mark.parametrize("name", ["predictors.eqx", "run.json"])
def test_with_one_data_file_a_mismatch_names_both_files(tmp_path, name):
    a = _save(tmp_path / "A", 0.7, with_state=False)
    b = _save(tmp_path / "B", 0.2, with_state=False)
    shutil.copyfile(b / name, a / name)
    with pytest.raises(ValueError, match="come from different saves") as info:
        hk.load_run(a, predictors(0.0))
    assert str(a / "run.json") in str(info.value)
    assert str(a / "predictors.eqx") in str(info.value)


def test_the_manifest_records_a_digest_of_every_file(two_runs):
    a, _ = two_runs
    manifest = json.loads((a / "run.json").read_text())
    assert manifest["version"] == 2
    assert sorted(manifest["digests"]) == ["predictors.eqx", "training_state.npz"]


def _as_version_1(path):
    manifest = json.loads((path / "run.json").read_text())
    manifest.pop("checksum")
    manifest.pop("digests")
    manifest["version"] = 1
    manifest["checksum"] = run_dir._checksum(manifest)
    (path / "run.json").write_text(json.dumps(manifest))


def test_a_run_saved_before_the_digests_loads_with_a_warning(two_runs):
    a, _ = two_runs
    _as_version_1(a)
    with pytest.warns(RuntimeWarning, match="cannot be checked"):
        run = _load(a)
    assert float(run.predictors[0].k) == pytest.approx(0.7)


def test_a_version_2_manifest_without_digests_is_damaged(two_runs):
    a, _ = two_runs
    manifest = json.loads((a / "run.json").read_text())
    manifest.pop("checksum")
    manifest.pop("digests")
    manifest["checksum"] = run_dir._checksum(manifest)
    (a / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="lacks the digests"):
        _load(a)


# --- what killed saves leave behind ------------------------------------------------------


def test_a_stale_staging_folder_is_removed_by_the_next_save(tmp_path):
    stale = tmp_path / ".A.new.0123456789abcdef.tmp"
    stale.mkdir()
    (stale / "predictors.eqx").write_bytes(b"half a file")
    _save(tmp_path / "A", 0.7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A"]


def test_a_staging_folder_locked_by_a_running_save_is_kept(tmp_path):
    live = tmp_path / ".A.new.0123456789abcdef.tmp"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    assert _atomic._lock(fd)  # as a running save holds it
    try:
        _save(tmp_path / "A", 0.7)
        assert live.exists()
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="exists"):
        _save(tmp_path / "A", 0.7)  # refused (no overwrite), but only after the cleanup
    assert not live.exists()


def test_an_old_run_set_aside_by_a_killed_save_is_put_back(tmp_path):
    a = _save(tmp_path / "A", 0.7)
    a.rename(tmp_path / ".A.old.0123456789abcdef.tmp")  # killed between its two renames
    _atomic.remove_stale_folders(a)
    assert float(_load(a).predictors[0].k) == pytest.approx(0.7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A"]


def test_without_an_atomic_exchange_the_old_run_is_set_aside_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir, "exchange", lambda a, b: False)
    a = _save(tmp_path / "A", 0.7)
    hk.save_run(a, predictors(0.3), solver=tiny_solver(), config=CONFIG, overwrite=True)
    assert float(_load_plain(a).predictors[0].k) == pytest.approx(0.3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A"]


def test_an_overwrite_swaps_the_runs_in_one_step(tmp_path, monkeypatch):
    swaps = []
    real = run_dir.exchange
    monkeypatch.setattr(run_dir, "exchange", lambda a, b: swaps.append(b) or real(a, b))
    a = _save(tmp_path / "A", 0.7)
    hk.save_run(a, predictors(0.3), solver=tiny_solver(), config=CONFIG, overwrite=True)
    assert swaps == [a]
    assert float(_load_plain(a).predictors[0].k) == pytest.approx(0.3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A"]


def _load_plain(path):
    return hk.load_run(path, predictors(0.0))


def test_where_folders_cannot_be_locked_saves_work_and_remove_nothing(tmp_path, monkeypatch):
    # As on Windows: no fcntl, no renameat2. A folder that cannot be locked is never deleted.
    monkeypatch.setattr(_atomic, "fcntl", None)
    monkeypatch.setattr(run_dir, "exchange", lambda a, b: False)
    stale = tmp_path / ".A.new.0123456789abcdef.tmp"
    stale.mkdir()
    a = _save(tmp_path / "A", 0.7)
    hk.save_run(a, predictors(0.3), solver=tiny_solver(), config=CONFIG, overwrite=True)
    assert float(_load_plain(a).predictors[0].k) == pytest.approx(0.3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [stale.name, "A"]
