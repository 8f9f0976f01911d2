"""Property tests: random valid banks round-trip exactly; corrupted checkpoints give ValueError
or load exactly what they say, never another exception (issue 3, point 6)."""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from pathlib import Path

import jax
import numpy as np
from helpers import make_pair_bank, retracted_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import confluent_bank as cb

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def valid_banks(draw, signed_rho=False):
    p = draw(st.integers(1, 5))
    n = draw(st.integers(0, 3))
    base = draw(st.sampled_from(["sigmoid", "tanh"]))
    bank = cb.init_confluent_bank([], max_packs=p, max_order=n, base=base)

    def floats(shape, elements=finite):
        size = int(np.prod(shape))
        return np.asarray(draw(st.lists(elements, min_size=size, max_size=size))).reshape(shape)

    def ints(low, high):
        return np.asarray(draw(st.lists(st.integers(low, high), min_size=p, max_size=p)))

    rows = {name: floats((p,)) for name in cb.PARAMETER_NAMES[:7]}
    if not signed_rho:
        rows["rho"] = np.abs(rows["rho"])
    rows["moment_coefficients"] = floats((p, n + 1))
    rows["orders"] = ints(0, n)
    rows["ages"] = ints(0, 10**6)
    rows["modes"] = ints(0, 2)
    rows["active"] = np.asarray(draw(st.lists(st.booleans(), min_size=p, max_size=p)))
    ids = draw(st.lists(st.integers(0, 10**9), min_size=p, max_size=p, unique=True))
    rows["slot_ids"] = np.asarray(ids)
    rows["transition_version"] = np.asarray(draw(st.integers(0, 10**9)))
    blocks = {
        name: jax.device_put(value.astype(getattr(bank, name).dtype))
        for name, value in rows.items()
    }
    return dataclasses.replace(bank, **blocks)


@SETTINGS
@given(valid_banks())
def test_random_valid_banks_round_trip_with_identical_digests(bank):
    text = json.dumps(bank.checkpoint(), allow_nan=False)
    restored = cb.bank_from_checkpoint(json.loads(text))
    assert cb.snapshot_digest(restored.portable_snapshot()) == cb.snapshot_digest(
        bank.portable_snapshot()
    )
    assert restored.max_order == bank.max_order and restored.base == bank.base


@SETTINGS
@given(valid_banks(signed_rho=True))
def test_every_bank_saves_and_loads_back_as_its_retraction(bank):
    # Mid-training banks may hold negative spreads: saved with those spreads at 0, which is the
    # bank itself when every spread is already >= 0.
    with tempfile.TemporaryDirectory() as folder:
        restored = cb.load_checkpoint(cb.save_checkpoint(Path(folder) / "bank.json", bank))
    assert cb.snapshot_digest(restored.portable_snapshot()) == cb.snapshot_digest(
        retracted_snapshot(bank)
    )
    assert restored.max_order == bank.max_order and restored.base == bank.base


def paths(node, prefix=()):
    """Every path into a JSON-like tree (mappings and lists), the root excluded."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in items:
        found.append((*prefix, key))
        if isinstance(child, dict | list):
            found.extend(paths(child, (*prefix, key)))
    return found


BASES = {
    "pair": make_pair_bank().checkpoint(),
    "migrated": cb.migrate_legacy(
        cb.init_pack_bank([cb.RefinedPack(1, 0.1, 0.7)], max_packs=2, max_order=1, base="tanh")
    ).checkpoint(),
}
WEIRD = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        1,
        -1,
        2,
        9,
        1.5,
        -0.5,
        1e308,
        -1e-320,
        float("nan"),
        float("inf"),
        2**70,
        -(2**70),
        10**400,
        "x",
        "",
        "float64",
        "float32",
        "int64",
        "int32",
        "bool",
        "complex128",
        "uint8",
        "float16",
        [],
        [1],
        [4],
        [[1]],
        [1.0, 2.0],
        {},
        {"a": 1},
    ]
)


@st.composite
def corruptions(draw):
    name = draw(st.sampled_from(sorted(BASES)))
    data = copy.deepcopy(BASES[name])
    path = draw(st.sampled_from(paths(data)))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "delete", "extra", "append", "truncate"]))
    key = path[-1]
    if action == "replace":
        parent[key] = draw(WEIRD)
    elif action == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif action == "extra":
        target = parent[key] if isinstance(parent[key], dict) else parent
        if isinstance(target, dict):
            target[draw(st.sampled_from(["extra", "values", "x"]))] = draw(WEIRD)
        else:
            target.append(draw(WEIRD))
    elif action == "append" and isinstance(parent[key], list):
        parent[key].append(draw(WEIRD))
    elif action == "truncate" and isinstance(parent[key], list) and parent[key]:
        parent[key].pop()
    else:
        parent[key] = draw(WEIRD)
    return data


@SETTINGS
@given(corruptions())
def test_corrupted_checkpoints_fail_cleanly_or_load_exactly_what_they_say(data):
    try:
        bank = cb.bank_from_checkpoint(data)
    except ValueError:
        return
    assert bank.checkpoint() == data


@SETTINGS
@given(st.sampled_from(sorted(BASES)), st.data())
def test_corrupted_json_text_fails_cleanly(name, draw):
    text = json.dumps(BASES[name])
    cut = draw.draw(st.integers(0, len(text) - 1))
    replacement = draw.draw(st.sampled_from(["", "}", "]", "x", "NaN", '"', "1e999", ",", "-"]))
    corrupted = text[:cut] + replacement + text[cut + 1 :]
    try:
        data = json.loads(corrupted)
    except ValueError:
        return
    try:
        bank = cb.bank_from_checkpoint(data)
    except ValueError:
        return
    assert bank.checkpoint() == data
