"""Damaged, truncated, foreign or crafted files raise ValueError; they never load other values.

Both file formats (`save_predictors`, `save_training_state`) carry a checksum verified on
load, and every stored array's header is checked against the template before its data is
read.
"""

import dataclasses
import io
import json
import tracemalloc
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybrid_kernels as hk
import hybrid_kernels._serialise as serialise
from hybrid_kernels._training import state as state_module

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PREDICTORS = {"w": jnp.arange(8.0), "b": jnp.asarray(0.5)}
OPT_STATE = (jnp.zeros(8), jnp.asarray(3, jnp.int32))


def _opt_template():
    return (jnp.ones(8), jnp.asarray(0, jnp.int32))


def _state():
    return hk.TrainingState(
        predictors=PREDICTORS,
        opt_state=OPT_STATE,
        step=7,
        phase=1,
        phase_step=2,
        key=jax.random.key(3),
        best_predictors={"w": jnp.arange(8.0) * 2, "b": jnp.asarray(1.5)},
        best_loss=0.125,
        best_step=3,
        history=[1.0, 0.75, 0.5],
        penalties=[0.0, 0.0, 0.1],
        val_history=[(0, 2.0)],
        bad_steps=[1],
        since_best=2,
        bad_in_row=1,
        tournament_done=True,
        fingerprint="abc",
        phase_starts=[0, 5],
    )


def _load_state(path):
    template = {"w": jnp.zeros(8), "b": jnp.asarray(0.0)}
    return hk.load_training_state(path, predictors=template, opt_state=_opt_template())


def _load_predictors(path):
    return hk.load_predictors(path, {"w": jnp.zeros(8), "b": jnp.asarray(0.0)})


def _flip(data, index, bit=0):
    data = bytearray(data)
    data[index] ^= 1 << bit
    return bytes(data)


def _npy(array):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asarray(array))
    return buffer.getvalue()


def _members(path):
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def _write_members(path, members, *, fix_checksum):
    """Rewrite a state archive (zip CRCs stay valid); optionally recompute our checksum."""
    members = dict(members)
    if fix_checksum:
        members.pop("checksum.npy")
        members["checksum.npy"] = _npy(state_module._digest(members))
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _huge_npy(dtype="<f8"):
    buffer = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": (10**10,)}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + bytes(64)


def _assert_state_equal(a, b):
    for field in dataclasses.fields(hk.TrainingState):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name == "key":
            assert np.array_equal(jax.random.key_data(x), jax.random.key_data(y))
        elif field.name in ("predictors", "opt_state", "best_predictors"):
            assert jax.tree_util.tree_all(
                jax.tree_util.tree_map(
                    lambda u, v: u.dtype == v.dtype and np.array_equal(u, v), x, y
                )
            )
        else:
            assert x == y, field.name


# -- predictors files ------------------------------------------------------------------------


def test_one_flipped_bit_in_a_predictors_leaf_is_refused(tmp_path):
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, PREDICTORS)
    data = path.read_bytes()
    path.write_bytes(_flip(data, len(data) - serialise._DIGEST_SIZE - 1))  # last leaf byte
    with pytest.raises(ValueError, match="checksum does not match"):
        _load_predictors(path)


def test_an_altered_digit_in_predictors_metadata_is_refused(tmp_path):
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, PREDICTORS, metadata={"lr": 0.5})
    path.write_bytes(path.read_bytes().replace(b'"lr": 0.5', b'"lr": 0.4'))
    with pytest.raises(ValueError, match="checksum does not match"):
        hk.read_predictors_metadata(path)


def test_a_truncated_predictors_file_is_refused(tmp_path):
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, PREDICTORS)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match="checksum does not match"):
        _load_predictors(path)


def _craft_predictors(path, header, leaves):
    blob = serialise._MAGIC + json.dumps(header).encode() + b"\n" + leaves
    path.write_bytes(blob + serialise._DIGEST(blob).digest())


def _saved_parts(path):
    header, leaves = serialise._read(path)
    return header, leaves


def test_a_crafted_predictors_header_without_leaves_raises_value_error(tmp_path):
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, PREDICTORS)
    header, leaves = _saved_parts(path)
    del header["fingerprint"]["leaves"]
    _craft_predictors(path, header, leaves)
    with pytest.raises(ValueError, match="damaged header"):
        _load_predictors(path)


def test_a_predictors_leaf_declaring_a_huge_shape_is_refused_without_allocating(tmp_path):
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, {"w": jnp.arange(8.0)})
    header, _ = _saved_parts(path)
    _craft_predictors(path, header, _huge_npy())
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"stored with shape \(10000000000,\)"):
            hk.load_predictors(path, {"w": jnp.zeros(8)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20


def test_a_predictors_leaf_stored_with_another_dtype_raises_value_error(tmp_path):
    # equinox itself would raise RuntimeError here, after reading the data.
    path = tmp_path / "p.eqx"
    hk.save_predictors(path, {"w": jnp.arange(8.0)})
    header, _ = _saved_parts(path)
    _craft_predictors(path, header, _npy(np.arange(8, dtype=np.int64)))
    with pytest.raises(ValueError, match="does not match its header"):
        hk.load_predictors(path, {"w": jnp.zeros(8)})


@pytest.fixture(scope="module")
def predictors_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "p.eqx"
    hk.save_predictors(path, PREDICTORS, metadata={"lr": 0.5})
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_fuzz_corrupted_predictors_files_only_raise_value_error(predictors_bytes, tmp_path, data):
    size = len(predictors_bytes)
    if data.draw(st.booleans(), label="truncate"):
        damaged = predictors_bytes[: data.draw(st.integers(0, size - 1), label="length")]
    else:
        index = data.draw(st.integers(0, size - 1), label="byte")
        damaged = _flip(predictors_bytes, index, data.draw(st.integers(0, 7), label="bit"))
    path = tmp_path / "damaged.eqx"
    path.write_bytes(damaged)
    with pytest.raises(ValueError):
        _load_predictors(path)


# -- training-state files --------------------------------------------------------------------


def test_every_training_state_field_round_trips(tmp_path):
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    _assert_state_equal(_load_state(path), _state())


def test_a_state_altered_behind_valid_zip_checksums_is_refused(tmp_path):
    # The zip CRCs are recomputed by the rewrite; only our own checksum can notice.
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    members = _members(path)
    members["predictors/1.npy"] = _npy(np.arange(8.0) + 1)
    _write_members(path, members, fix_checksum=False)
    with pytest.raises(ValueError, match="checksum does not match"):
        _load_state(path)


def test_a_stored_array_shorter_than_its_metadata_is_refused(tmp_path):
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    members = _members(path)
    members["predictors/1.npy"] = _npy(np.arange(5.0))  # "w"; the metadata still says (8,)
    _write_members(path, members, fix_checksum=True)
    with pytest.raises(ValueError, match=r"stored with shape \(5,\); expected \(8,\)"):
        _load_state(path)


def test_a_state_member_declaring_a_huge_shape_is_refused_without_allocating(tmp_path):
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    members = _members(path)
    members["opt_state/0.npy"] = _huge_npy()
    _write_members(path, members, fix_checksum=True)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"stored with shape \(10000000000,\)"):
            _load_state(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20


def _pickled_npz(path):
    with open(path, "wb") as f:
        np.savez(f, meta=np.asarray([{"format": "x"}], dtype=object))


@pytest.mark.parametrize(
    "make",
    [
        lambda path: path.write_bytes(b""),
        lambda path: path.write_bytes(b"hello, not an archive\n"),
        lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
        lambda path: path.write_bytes(path.read_bytes()[:-10]),
        _pickled_npz,
    ],
    ids=["empty", "foreign", "truncated-half", "truncated-tail", "pickled"],
)
def test_unreadable_state_files_raise_value_error_without_pickle_hints(tmp_path, make):
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    make(path)
    with pytest.raises(ValueError) as info:
        _load_state(path)
    assert "allow_pickle" not in str(info.value)
    with pytest.raises(ValueError):
        state_module.read_training_meta(path)


def test_a_state_with_a_malformed_field_raises_value_error(tmp_path):
    path = tmp_path / "s.state"
    hk.save_training_state(path, _state())
    members = _members(path)
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))))
    meta["history"] = 5
    members["meta.npy"] = _npy(json.dumps(meta))
    _write_members(path, members, fix_checksum=True)
    with pytest.raises(ValueError, match="its history is malformed"):
        _load_state(path)


@pytest.fixture(scope="module")
def state_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "s.state"
    hk.save_training_state(path, _state())
    return path.read_bytes()


@FUZZ
@given(data=st.data())
def test_fuzz_corrupted_state_files_raise_value_error_or_load_unchanged(
    state_bytes, tmp_path, data
):
    # Some zip bytes (timestamps, attributes) carry no content: flipping them changes nothing.
    size = len(state_bytes)
    if data.draw(st.booleans(), label="truncate"):
        damaged = state_bytes[: data.draw(st.integers(0, size - 1), label="length")]
    else:
        index = data.draw(st.integers(0, size - 1), label="byte")
        damaged = _flip(state_bytes, index, data.draw(st.integers(0, 7), label="bit"))
    path = tmp_path / "damaged.state"
    path.write_bytes(damaged)
    try:
        loaded = _load_state(path)
    except ValueError:
        return
    _assert_state_equal(loaded, _state())
