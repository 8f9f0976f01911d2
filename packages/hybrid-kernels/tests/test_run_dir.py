"""`save_run` / `load_run`: run directories round-trip, validate and are written atomically."""

import json
import math
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Rate, tiny_solver

import hybrid_kernels as hk
from hybrid_kernels._training import run_dir


def predictors(k=0.7):
    return (Rate(jnp.asarray(k)), eqx.nn.Linear(2, 1, key=jax.random.key(0)))


def history():
    h = hk.LossHistory([1.0, 0.5, float("nan"), 0.25])
    h.penalties = [0.0, 0.1, 0.2, 0.3]
    h.val = [(0, 2.0), (3, 0.4)]
    h.bad_steps = [2]
    h.phase_starts = [0]
    h.best_step, h.best_loss = 3, 0.25
    return h


def config(**kw):
    return hk.OptaxTrainingConfig(steps=(4,), lr=(0.01,), verbose=False, **kw)


def state(p, opt_state):
    return hk.TrainingState(
        predictors=p,
        opt_state=opt_state,
        step=4,
        phase=1,
        phase_step=0,
        key=jax.random.key(5),
        best_predictors=p,
        best_loss=0.25,
        best_step=3,
        history=[1.0, 0.5, 0.3, 0.25],
        penalties=[0.0] * 4,
        val_history=[],
        bad_steps=[],
    )


@pytest.fixture
def saved(tmp_path):
    p = predictors()
    path = hk.save_run(
        tmp_path / "run",
        p,
        solver=tiny_solver(),
        config=config(),
        history=history(),
        trainable=hk.trainable_mask(p),
        metadata={"dataset": "decay", "seeds": (1, 2)},
    )
    return path, p


def test_save_run_writes_a_manifest_and_the_predictors(saved):
    path, _ = saved
    assert sorted(os.listdir(path)) == ["predictors.eqx", "run.json"]


def test_load_run_restores_the_predictors(saved):
    path, p = saved
    loaded = hk.load_run(path, predictors(0.0))
    assert float(loaded.predictors[0].k) == 0.7
    np.testing.assert_array_equal(loaded.predictors[1].weight, p[1].weight)


def test_load_run_restores_the_solver_and_a_plain_config(saved):
    loaded = hk.load_run(saved[0], predictors())
    assert loaded.solver.to_dict() == tiny_solver().to_dict()
    assert loaded.config == config()


def test_load_run_restores_every_history_attribute(saved):
    h = hk.load_run(saved[0], predictors()).history
    assert isinstance(h, hk.LossHistory)
    assert h[:2] == [1.0, 0.5] and math.isnan(h[2]) and h[3] == 0.25
    assert h.val == [(0, 2.0), (3, 0.4)] and h.bad_steps == [2] and h.penalties[1] == 0.1
    assert (h.best_step, h.best_loss, h.phase_starts) == (3, 0.25, [0])


def test_a_new_history_attribute_round_trips_without_code_changes(tmp_path):
    h = history()
    h.events = [{"step": 2, "kind": "pair", "slots": (0, 1)}, {"step": 3, "kind": "birth"}]
    hk.save_run(tmp_path / "run", predictors(), solver=tiny_solver(), config=config(), history=h)
    assert hk.load_run(tmp_path / "run", predictors()).history.events == h.events


def test_a_history_attribute_that_is_not_json_data_is_skipped_with_a_warning(tmp_path):
    h = history()
    h.opaque = object()
    with pytest.warns(RuntimeWarning, match=r"history attribute\(s\) \['opaque'\]"):
        hk.save_run(
            tmp_path / "run", predictors(), solver=tiny_solver(), config=config(), history=h
        )
    assert not hasattr(hk.load_run(tmp_path / "run", predictors()).history, "opaque")


def test_metadata_records_versions_leaves_and_the_user_s_data(saved):
    meta = hk.load_run(saved[0], predictors()).metadata
    assert meta["versions"]["hybrid_kernels"] == hk.__version__ and "jax" in meta["versions"]
    assert meta["user"] == {"dataset": "decay", "seeds": (1, 2)}
    assert meta["n_trainable_params"] == 1 + 2 + 1
    assert meta["leaves"][0] == {"path": "0.k", "shape": [], "dtype": "float64", "trainable": True}


def test_a_config_with_callables_is_described_but_not_rebuilt(tmp_path):
    def my_loss(pred, bp):
        return jnp.sum(pred)

    hk.save_run(tmp_path / "run", predictors(), solver=tiny_solver(), config=config(loss=my_loss))
    loaded = hk.load_run(tmp_path / "run", predictors())
    assert loaded.config is None
    assert "my_loss" in loaded.config_fields["loss"]["callable"]
    assert loaded.config_fields["steps"] == (4,)


def test_the_optimiser_state_round_trips_through_the_training_state(tmp_path):
    p = predictors()
    opt = optax.adam(1e-2)
    opt_state = opt.init(eqx.filter(p, eqx.is_inexact_array))
    opt_state = opt.update(jax.tree.map(jnp.ones_like, opt_state[0].mu), opt_state)[1]
    hk.save_run(
        tmp_path / "run", p, solver=tiny_solver(), config=config(), state=state(p, opt_state)
    )
    template = opt.init(eqx.filter(p, eqx.is_inexact_array))
    loaded = hk.load_run(tmp_path / "run", predictors(0.0), opt_state=template)
    assert loaded.state.step == 4 and loaded.state.best_step == 3
    assert int(loaded.state.opt_state[0].count) == 1
    assert float(loaded.state.opt_state[0].mu[0].k) == float(opt_state[0].mu[0].k)


def test_without_an_opt_state_template_the_state_is_not_read(tmp_path):
    p = predictors()
    opt_state = optax.sgd(0.1).init(eqx.filter(p, eqx.is_inexact_array))
    hk.save_run(
        tmp_path / "run", p, solver=tiny_solver(), config=config(), state=state(p, opt_state)
    )
    assert hk.load_run(tmp_path / "run", predictors()).state is None


# --- validation ---------------------------------------------------------------------------


def test_an_existing_run_is_not_replaced_without_overwrite(saved):
    path, p = saved
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        hk.save_run(path, p, solver=tiny_solver(), config=config())


def test_overwrite_replaces_a_run_completely(saved):
    path, _ = saved
    hk.save_run(path, predictors(0.2), solver=tiny_solver(), config=config(), overwrite=True)
    loaded = hk.load_run(path, predictors())
    assert float(loaded.predictors[0].k) == 0.2 and list(loaded.history) == []
    assert [n for n in os.listdir(path.parent) if n.startswith(".")] == []


def test_overwrite_never_replaces_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="is not a run directory; refusing"):
        hk.save_run(
            tmp_path / "mine", predictors(), solver=tiny_solver(), config=config(), overwrite=True
        )


def test_save_run_rejects_a_missing_parent(tmp_path):
    with pytest.raises(ValueError, match=r"the folder .* does not exist"):
        hk.save_run(tmp_path / "no" / "run", predictors(), solver=tiny_solver(), config=config())


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(solver="Tsit5"), "solver must be a SolverConfig"),
        (dict(config={"steps": (1,)}), "config must be an OptaxTrainingConfig"),
        (dict(state={"step": 1}), "state must be a TrainingState"),
        (dict(metadata={"f": print}), "metadata must be JSON data"),
    ],
)
def test_save_run_rejects_wrong_argument_types(tmp_path, kwargs, words):
    args = dict(solver=tiny_solver(), config=config()) | kwargs
    with pytest.raises(TypeError, match=words):
        hk.save_run(tmp_path / "run", predictors(), **args)


def test_a_failed_save_leaves_no_directory_behind(tmp_path, monkeypatch):
    def broken(path, state):
        raise OSError("disk full")

    monkeypatch.setattr(run_dir, "save_training_state", broken)
    p = predictors()
    opt_state = optax.sgd(0.1).init(eqx.filter(p, eqx.is_inexact_array))
    with pytest.raises(OSError, match="disk full"):
        hk.save_run(
            tmp_path / "run", p, solver=tiny_solver(), config=config(), state=state(p, opt_state)
        )
    assert os.listdir(tmp_path) == []


def test_a_failed_overwrite_keeps_the_previous_run(saved, monkeypatch):
    path, _ = saved
    monkeypatch.setattr(run_dir, "save_predictors", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        hk.save_run(path, predictors(0.1), solver=tiny_solver(), config=config(), overwrite=True)
    assert float(hk.load_run(path, predictors()).predictors[0].k) == 0.7


def _edit_manifest(path, **changes):
    manifest = json.loads((path / "run.json").read_text())
    manifest.update(changes)
    (path / "run.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda p: os.remove(p / "run.json"), "holds no run.json"),
        (lambda p: (p / "run.json").write_text("{not json"), "is damaged"),
        (lambda p: _edit_manifest(p, format="something else"), "is not a run manifest"),
        (lambda p: _edit_manifest(p, version=99), "run format version 99"),
        (lambda p: os.remove(p / "predictors.eqx"), "lacks its file 'predictors.eqx'"),
        (lambda p: _edit_manifest(p, history=None), "is damaged"),
    ],
)
def test_load_run_rejects_a_damaged_run_with_a_value_error(saved, damage, words):
    path, _ = saved
    damage(path)
    with pytest.raises(ValueError, match=words):
        hk.load_run(path, predictors())


def test_one_changed_digit_in_the_manifest_is_refused(saved):
    path, _ = saved
    text = (path / "run.json").read_text()
    position = text.index('"history"')
    digit = next(i for i in range(position, len(text)) if text[i].isdigit())
    changed = "1" if text[digit] != "1" else "2"
    (path / "run.json").write_text(text[:digit] + changed + text[digit + 1 :])
    with pytest.raises(ValueError, match="checksum does not match"):
        hk.load_run(path, predictors())


def test_load_run_rejects_a_path_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        hk.load_run(tmp_path / "nothing", predictors())


def test_load_run_rejects_a_template_of_another_architecture(saved):
    other = (Rate(jnp.asarray(0.7)), eqx.nn.Linear(3, 1, key=jax.random.key(0)))
    with pytest.raises(ValueError, match="template does not match"):
        hk.load_run(saved[0], other)
