"""float32 with x64 OFF: forward, gradient and checkpoint round trip (spec 7.1).

x64 is process-global and on in this test process, so the float32 facts are measured once in a
fresh subprocess and asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import PB_FORWARD, make_pair_bank

CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import confluent_bank as cb

    assert not jax.config.jax_enable_x64
    facts = {}
    packs = [cb.RefinedPack(0, -0.125, 2.0), cb.RefinedPack(0, 0.125, -1.0),
             cb.RefinedPack(1, 0.2, 0.3)]
    bank = cb.init_confluent_bank(packs, max_packs=4, max_order=3)
    facts["dtypes"] = {name: str(getattr(bank, name).dtype) for name in cb.STATE_NAMES}
    x = jnp.linspace(-0.5, 0.5, 9)
    facts["forward"] = np.asarray(bank.forward(x)).tolist()
    facts["forward_dtype"] = str(bank.forward(x).dtype)
    import dataclasses
    pair = dataclasses.replace(
        bank,
        centers=bank.centers.at[0].set(0.0),
        weights=bank.weights.at[:2].set(jnp.array([1.0, 0.0])),
        rho=bank.rho.at[0].set(0.015625),
        odd_moments=bank.odd_moments.at[0].set(0.375),
        modes=bank.modes.at[0].set(1),
        active=bank.active.at[1].set(False),
    )
    facts["pair_forward"] = np.asarray(jax.jit(lambda b, z: b.forward(z))(pair, x)).tolist()

    def objective(parameters):
        return jnp.sum(pair.with_parameters(parameters).forward(x) ** 2)

    grads = jax.jit(jax.grad(objective))(pair.parameters)
    facts["grad_finite"] = all(bool(jnp.all(jnp.isfinite(g))) for g in grads.values())
    facts["grad_dtypes"] = sorted({str(g.dtype) for g in grads.values()})
    facts["grad_odd"] = float(grads["odd_moments"][0])
    text = json.dumps(pair.checkpoint())
    restored = cb.bank_from_checkpoint(json.loads(text))
    facts["round_trip_equal"] = restored.portable_snapshot() == pair.portable_snapshot()
    facts["round_trip_digest"] = (cb.snapshot_digest(restored.portable_snapshot())
                                  == cb.snapshot_digest(pair.portable_snapshot()))
    try:
        cb.bank_from_checkpoint(json.loads(sys.stdin.read()))
        facts["float64_refused"] = None
    except ValueError as error:
        facts["float64_refused"] = str(error)
    print(json.dumps(facts))
    """
)


@pytest.fixture(scope="module")
def facts():
    env = {**os.environ, "JAX_ENABLE_X64": "0", "JAX_PLATFORMS": "cpu"}
    float64_checkpoint = json.dumps(make_pair_bank().checkpoint())
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=float64_checkpoint,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_default_dtypes_are_float32_and_int32(facts):
    dtypes = facts["dtypes"]
    assert dtypes["centers"] == dtypes["moment_coefficients"] == "float32"
    assert dtypes["orders"] == dtypes["slot_ids"] == dtypes["transition_version"] == "int32"
    assert dtypes["active"] == "bool"


def test_float32_forward_matches_the_float64_values(facts):
    assert facts["forward_dtype"] == "float32"
    assert max(abs(a - b) for a, b in zip(facts["forward"], PB_FORWARD, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(facts["pair_forward"], PB_FORWARD, strict=True)) < 1e-6


def test_float32_gradient_is_finite_and_float32(facts):
    assert facts["grad_finite"]
    assert facts["grad_dtypes"] == ["float32"]
    assert facts["grad_odd"] != 0


def test_float32_checkpoint_round_trips_with_the_same_digest(facts):
    assert facts["round_trip_equal"] and facts["round_trip_digest"]


def test_a_float64_checkpoint_is_refused_without_x64(facts):
    assert facts["float64_refused"] is not None
    assert "centers" in facts["float64_refused"]
