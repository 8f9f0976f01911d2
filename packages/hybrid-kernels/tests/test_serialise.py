"""Saving and loading predictors: exact round trips, validated templates, atomic files."""

import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels._serialise as serialise
from hybrid_kernels import (
    BoundedPredictor,
    BoundScaler,
    load_predictors,
    read_predictors_metadata,
    save_predictors,
)


def _model(seed=0, width=4, high=1.0, activation=jax.nn.tanh):
    mlp = eqx.nn.MLP(2, 1, width, 1, activation=activation, key=jax.random.key(seed))
    return (
        BoundedPredictor(
            mlp,
            in_scaler=BoundScaler([(0.1, 1.0), (1e-2, 1e2)], warp="log"),
            out_scaler=BoundScaler([(0.0, high)]),
            input_keys=("a", "b"),
        ),
        {"omega": jnp.asarray(1.5)},
    )


def _leaves_equal(a, b):
    la, lb = (
        jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array)),
        jax.tree_util.tree_leaves(eqx.filter(b, eqx.is_array)),
    )
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb, strict=True)
    )


def test_round_trip_restores_every_leaf_exactly(tmp_path):
    saved = _model(seed=1)
    save_predictors(tmp_path / "p.eqx", saved)
    loaded = load_predictors(tmp_path / "p.eqx", _model(seed=2))
    assert _leaves_equal(loaded, saved)
    assert not _leaves_equal(_model(seed=2), saved)  # the template really was different


def test_metadata_round_trips(tmp_path):
    meta = {"solver": {"rtol": 1e-6}, "loss_history": [1.0, 0.5]}
    save_predictors(tmp_path / "p.eqx", _model(), metadata=meta)
    assert read_predictors_metadata(tmp_path / "p.eqx") == meta


def test_template_with_another_leaf_shape_is_rejected(tmp_path):
    save_predictors(tmp_path / "p.eqx", {"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"\['w'\] of the template is an array of shape \(4,\)"):
        load_predictors(tmp_path / "p.eqx", {"w": jnp.ones(4)})
    save_predictors(tmp_path / "p.eqx", _model(width=4))
    with pytest.raises(ValueError, match="width_size is 5 in the template but 4 in the file"):
        load_predictors(tmp_path / "p.eqx", _model(width=5))


def test_template_with_other_static_configuration_is_rejected(tmp_path):
    # Same leaf shapes, different bound: the peer loaded this silently.
    save_predictors(tmp_path / "p.eqx", _model(high=1.0))
    with pytest.raises(
        ValueError, match=r"BoundScaler at \[0\]\.out_scaler: bounds is \(\(0\.0, 2\.0\),\)"
    ):
        load_predictors(tmp_path / "p.eqx", _model(high=2.0))


def test_template_with_another_activation_is_rejected(tmp_path):
    save_predictors(tmp_path / "p.eqx", _model(activation=jax.nn.tanh))
    with pytest.raises(ValueError, match="callable"):
        load_predictors(tmp_path / "p.eqx", _model(activation=jax.nn.softplus))


def test_template_with_another_container_is_rejected(tmp_path):
    save_predictors(tmp_path / "p.eqx", _model())
    with pytest.raises(ValueError, match="template does not match"):
        load_predictors(tmp_path / "p.eqx", _model()[:1])


def test_template_with_another_dtype_is_rejected(tmp_path):
    saved = _model()
    save_predictors(tmp_path / "p.eqx", saved)
    as32 = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, saved
    )
    with pytest.raises(ValueError, match="dtype float32"):
        load_predictors(tmp_path / "p.eqx", as32)


def test_a_file_that_is_not_a_predictors_file_is_rejected(tmp_path):
    (tmp_path / "other.bin").write_bytes(b"\x00\x01 not ours")
    with pytest.raises(ValueError, match="not a file written by save_predictors"):
        load_predictors(tmp_path / "other.bin", _model())
    damaged = serialise._MAGIC + b"{not json\n"
    (tmp_path / "damaged.eqx").write_bytes(damaged)
    with pytest.raises(ValueError, match="damaged header"):
        load_predictors(tmp_path / "damaged.eqx", _model())


def test_a_newer_file_format_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(serialise, "_FORMAT", 99)
    save_predictors(tmp_path / "p.eqx", _model())
    monkeypatch.undo()
    with pytest.raises(ValueError, match="file format 99"):
        load_predictors(tmp_path / "p.eqx", _model())


def test_metadata_must_be_json_serialisable(tmp_path):
    with pytest.raises(TypeError, match="metadata must be JSON-serialisable"):
        save_predictors(tmp_path / "p.eqx", _model(), metadata={"f": object()})
    assert not (tmp_path / "p.eqx").exists()


def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        save_predictors(tmp_path / "nope" / "p.eqx", _model())


def test_a_failed_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "p.eqx"
    save_predictors(path, _model(seed=1))
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_predictors(path, _model(seed=2))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.eqx"]  # no temp file left


def test_files_load_in_a_fresh_process(tmp_path):
    # Function reprs carry memory addresses; the fingerprint must not depend on them.
    save_predictors(tmp_path / "p.eqx", _model(seed=3))
    code = textwrap.dedent(
        f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_serialise import _model, _leaves_equal
        from hybrid_kernels._serialise import load_predictors
        loaded = load_predictors({str(tmp_path / "p.eqx")!r}, _model(seed=0))
        assert _leaves_equal(loaded, _model(seed=3))
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
