"""Test configuration for the bank tests: x64 for the whole process, and the spec's banks as
session fixtures (built by `helpers`).

x64 is enabled here once, before any test module imports JAX arrays (the spec's regression
values are float64); float32 behaviour is tested in subprocesses (`test_float32.py`). As in
diffrax, implicit rank promotion raises, so the bank also runs for users who set it. Strict
dtype promotion is not set: optax's own updates (an int32 count against float moments) fail
under it.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402
from helpers import (  # noqa: E402
    make_cluster_bank,
    make_pair_bank,
    make_pair_committed_bank,
    make_tanh_bank,
)

import confluent_bank as cb  # noqa: E402


@pytest.fixture(scope="session")
def pair_bank() -> cb.ConfluentPackBank:
    return make_pair_bank()


@pytest.fixture(scope="session")
def cluster_bank() -> cb.ConfluentPackBank:
    return make_cluster_bank()


@pytest.fixture(scope="session")
def tanh_bank() -> cb.ConfluentPackBank:
    return make_tanh_bank()


@pytest.fixture(scope="session")
def pair_committed_bank() -> cb.ConfluentPackBank:
    return make_pair_committed_bank()


@pytest.fixture(scope="session")
def jit_forward():
    """One shared jitted forward, so tests reuse compiled kernels."""
    return jax.jit(lambda bank, z: bank.forward(z))
