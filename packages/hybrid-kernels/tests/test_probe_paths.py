"""Probe scenarios (issue 22): one rule for paths in every public save and load.

A directory where a file is expected (or the reverse), a missing parent folder, a missing
file and an unreadable one all raise `ValueError` naming the argument and the path, with the
same words as confluent_bank.
"""

import errno
import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import Rate, osc_dataset, quiet, tiny_solver, train

import hybrid_kernels as hk

pd = pytest.importorskip("pandas")


def predictors():
    return Rate(jnp.asarray(0.7))


def opt_state():
    return optax.sgd(0.1).init(eqx.filter(predictors(), eqx.is_inexact_array))


def state():
    p = predictors()
    return hk.TrainingState(
        predictors=p,
        opt_state=opt_state(),
        step=1,
        phase=0,
        phase_step=1,
        key=jax.random.key(0),
        best_predictors=p,
        best_loss=1.0,
        best_step=0,
        history=[1.0],
        penalties=[0.0],
        val_history=[],
        bad_steps=[],
    )


CONFIG = hk.OptaxTrainingConfig(steps=(1,), lr=(0.01,), verbose=False)
TABLE = pd.DataFrame({"experiment": ["a"], "time": [0.0], "variable": ["y"], "value": [1.0]})

SAVE_FILE = {
    "save_predictors": lambda p: hk.save_predictors(p, predictors()),
    "save_training_state": lambda p: hk.save_training_state(p, state()),
}
LOAD_FILE = {
    "load_predictors": lambda p: hk.load_predictors(p, predictors()),
    "read_predictors_metadata": hk.read_predictors_metadata,
    "load_training_state": lambda p: hk.load_training_state(
        p, predictors=predictors(), opt_state=opt_state()
    ),
}
# (argument name, call) for each table argument that may be a path
READ_TABLE = {
    "observations": lambda p: hk.experiments_from_table(p, y0_fn=lambda c, ch: jnp.zeros(1)),
    "covariates": lambda p: hk.experiments_from_table(
        TABLE, y0_fn=lambda c, ch: jnp.zeros(1), covariates=p
    ),
    "inputs": lambda p: hk.experiments_from_table(
        TABLE, y0_fn=lambda c, ch: jnp.zeros(1), inputs=p
    ),
}


def save_run(path):
    return hk.save_run(path, predictors(), solver=tiny_solver(), config=CONFIG)


def load_run(path):
    return hk.load_run(path, predictors())


def raises(text):
    return pytest.raises(ValueError, match="^" + re.escape(text) + "$")


# --- saving ------------------------------------------------------------------------------


@pytest.mark.parametrize("save", list(SAVE_FILE.values()), ids=list(SAVE_FILE))
def test_saving_a_file_onto_a_directory_is_refused(save, tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    with raises(f"path={str(target)!r} is a directory; expected a file"):
        save(target)


@pytest.mark.parametrize("save", [*SAVE_FILE.values(), save_run], ids=[*SAVE_FILE, "save_run"])
def test_saving_into_a_missing_folder_is_refused(save, tmp_path):
    target = tmp_path / "missing" / "x"
    with raises(f"path={str(target)!r}: the folder {str(target.parent)!r} does not exist"):
        save(target)


def test_saving_a_run_onto_a_file_is_refused(tmp_path):
    target = tmp_path / "taken"
    target.write_text("mine")
    with raises(f"path={str(target)!r} is a file; expected a directory"):
        save_run(target)
    assert target.read_text() == "mine"


# --- loading -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    hk.save_predictors(folder / "p.eqx", predictors())
    hk.save_training_state(folder / "s.npz", state())
    TABLE.to_csv(folder / "t.csv", index=False)
    return folder


LOADERS = {**LOAD_FILE, **{f"table:{k}": v for k, v in READ_TABLE.items()}}


def _arg(name):
    return name.split(":")[1] if name.startswith("table:") else "path"


@pytest.mark.parametrize("name", list(LOADERS))
def test_loading_a_directory_as_a_file_is_refused(name, tmp_path):
    with raises(f"{_arg(name)}={str(tmp_path)!r} is a directory; expected a file"):
        LOADERS[name](tmp_path)


@pytest.mark.parametrize("name", list(LOADERS))
def test_loading_a_missing_file_is_refused(name, tmp_path):
    target = tmp_path / "nothing.csv"
    with raises(f"{_arg(name)}={str(target)!r} does not exist"):
        LOADERS[name](target)


@pytest.mark.parametrize("name", list(LOAD_FILE))
def test_loading_an_unreadable_file_is_refused(name, files, monkeypatch):
    target = files / ("s.npz" if "training" in name else "p.eqx")
    monkeypatch.setattr(pathlib.Path, "read_bytes", _denied)
    with raises(f"path={str(target)!r} cannot be read: Permission denied"):
        LOAD_FILE[name](target)


@pytest.mark.parametrize("arg", list(READ_TABLE))
def test_reading_an_unreadable_table_is_refused(arg, files, monkeypatch):
    monkeypatch.setattr(pd, "read_csv", lambda *a, **k: _denied())
    with raises(f"{arg}={str(files / 't.csv')!r} cannot be read: Permission denied"):
        READ_TABLE[arg](files / "t.csv")


def _denied(*args):
    raise PermissionError(errno.EACCES, "Permission denied")


def test_loading_a_file_as_a_run_is_refused(files):
    target = files / "p.eqx"
    with raises(f"path={str(target)!r} is a file; expected a directory"):
        load_run(target)


def test_loading_a_missing_run_is_refused(tmp_path):
    with raises(f"path={str(tmp_path / 'run')!r} does not exist"):
        load_run(tmp_path / "run")


def test_loading_a_run_with_an_unreadable_manifest_is_refused(tmp_path, monkeypatch):
    run = save_run(tmp_path / "run")
    monkeypatch.setattr(pathlib.Path, "read_bytes", _denied)
    with raises(f"path={str(run / 'run.json')!r} cannot be read: Permission denied"):
        load_run(run)


# --- the trainer's checkpoint ------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing folder", "directory"])
def test_a_checkpoint_path_that_cannot_be_written_is_refused_naming_the_field(
    where, oscillator, tmp_path
):
    target = tmp_path / "missing" / "run.state" if where == "missing folder" else tmp_path
    expected = (
        f"checkpoint_path={str(target)!r}: the folder {str(target.parent)!r} does not exist"
        if where == "missing folder"
        else f"checkpoint_path={str(target)!r} is a directory; expected a file"
    )
    config = quiet(steps=(2,), lr=(0.01,), checkpoint_path=target)
    with raises(expected):  # named as the config's field, not as the save's `path`
        train(oscillator, osc_dataset(oscillator), config)
