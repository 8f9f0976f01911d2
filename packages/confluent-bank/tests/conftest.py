"""Shared fixtures for the bank tests: the spec's pair bank PB, cluster bank CB and tanh bank.

x64 is enabled for the whole test process (the spec's regression values are float64); float32
behaviour is tested in subprocesses (`test_float32.py`).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import dataclasses  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

import confluent_bank as cb  # noqa: E402

PB_DIGEST = "fb65eb322b8867ba9e7c9b3d12aa75d640c096cc17fded5a27d9e8fe6fcf23ff"
PB_PAIR_DIGEST = "1772e5f36b38ad1389d6c3d13be79518d1513edaf6840f3a14ed17cca4fc9c27"
PB_FORWARD = [
    0.5325355267458475,
    0.5672333751923615,
    0.6015755411798961,
    0.6352303820260509,
    0.6678830919348268,
    0.6992476318198144,
    0.7290769710587179,
    0.7571708610107785,
    0.7833806228852624,
]


def make_pair_bank(**kwargs) -> cb.ConfluentPackBank:
    """PB: f(x) = 2σ(x+0.125) − σ(x−0.125) + 0.3σ'(x−0.2); 4 slots, max_order 3."""
    packs = [
        cb.RefinedPack(0, -0.125, 2.0),
        cb.RefinedPack(0, 0.125, -1.0),
        cb.RefinedPack(1, 0.2, 0.3),
    ]
    return cb.init_confluent_bank(packs, max_packs=4, max_order=3, **kwargs)


def make_cluster_bank() -> cb.ConfluentPackBank:
    """CB: three order-0 atoms near 0; 4 slots, max_order 4."""
    packs = [cb.RefinedPack(0, c, w) for c, w in [(-0.01, 0.7), (0.0, -0.2), (0.02, 0.5)]]
    return cb.init_confluent_bank(packs, max_packs=4, max_order=4)


def make_tanh_bank() -> cb.ConfluentPackBank:
    """Ordinary tanh atoms of every order 0..3."""
    packs = [cb.RefinedPack(n, 0.1 * n, 0.3 + n * 0.1, 0.7) for n in range(4)]
    return cb.init_confluent_bank(packs, max_packs=4, max_order=3, base="tanh")


def set_rows(bank: cb.ConfluentPackBank, updates) -> cb.ConfluentPackBank:
    """Apply `(name, index, value)` row updates by hand (independent of `commit_transition`)."""
    blocks = {}
    for name, index, value in updates:
        block = blocks.get(name, getattr(bank, name))
        blocks[name] = block.at[index].set(jnp.asarray(value, dtype=block.dtype))
    return dataclasses.replace(bank, **blocks)


# The spec's PB pair proposal (h = 0.125, m0 = 1, m1 = 0.375), applied by hand.
PB_PAIR_UPDATES = (
    ("centers", 0, 0.0),
    ("weights", 0, 1.0),
    ("rho", 0, 0.015625),
    ("odd_moments", 0, 0.375),
    ("modes", 0, 1),
    ("directions", 0, 0.0),
    ("direction_bias", 0, 1.0),
    ("active", 1, False),
    ("weights", 1, 0.0),
    ("odd_moments", 1, 0.0),
)


def make_pair_committed_bank() -> cb.ConfluentPackBank:
    """PB after its exact pair transition: slot 0 is a centred pair, slot 1 is off."""
    bank = set_rows(make_pair_bank(), PB_PAIR_UPDATES)
    return dataclasses.replace(bank, transition_version=bank.transition_version + 1)


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
