"""Shared test helpers: the spec's banks (pair bank PB, cluster bank CB, tanh bank), their
regression values, hand-applied row updates and the moment states the transition tests use.

Imported by name (`from helpers import make_pair_bank`); `conftest.py` turns the banks into
fixtures and enables x64 once for the whole test process.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax
import jax.numpy as jnp

import confluent_bank as cb

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


def always(_bank, _proposal) -> bool:
    return True


def commit_pair(bank, state, **options):
    """Commit `bank.propose_pair(0, 1)` between steps; accepted unless `acceptance` says no."""
    options.setdefault("acceptance", always)
    return cb.commit_transition(bank, bank.propose_pair(0, 1), state, between_steps=True, **options)


def moments(bank, step=7) -> cb.NamedMomentState:
    """Adam-like moments: first = 1, second = 2, for every parameter."""
    first = {name: jnp.ones_like(value) for name, value in bank.parameters.items()}
    second = {name: 2 * jnp.ones_like(value) for name, value in bank.parameters.items()}
    return cb.NamedMomentState(jnp.asarray(step), {"first": first, "second": second})


def unique_moments(bank, odd="first", even="second") -> cb.NamedMomentState:
    """Moments whose every entry is distinct: `arange + 1` per parameter (kind `odd`) and its
    square (kind `even`, omitted when None), step 7."""
    first = {
        name: jnp.arange(value.size, dtype=value.dtype).reshape(value.shape) + 1
        for name, value in bank.parameters.items()
    }
    table = {odd: first}
    if even is not None:
        table[even] = {name: value**2 for name, value in first.items()}
    return cb.NamedMomentState(jnp.asarray(7), table)


forward = jax.jit(lambda bank, x: bank.forward(x))


def custom_proposal(bank, updates, slot_ids=(0,)) -> cb.TransitionProposal:
    """A hand-made proposal of a kind without a rule (only the structural and range checks
    apply), bound to `bank`'s current state; `updates` are `(name, index, value)` triples."""
    return cb.TransitionProposal(
        cb.snapshot_digest(bank.portable_snapshot()),
        int(bank.transition_version),
        slot_ids,
        tuple(cb.SlotUpdate(*u) for u in updates),
        "custom",
        "test",
    )


def moment_fields(state, names) -> dict:
    """`{field: tree}` for the first occurrence of each named field of a nested optax state
    (NamedTuples, tuples and lists) whose value is a dict (a moment tree of the bank's
    parameters)."""
    found = {}

    def visit(node):
        if hasattr(node, "_fields"):
            for field in node._fields:
                value = getattr(node, field)
                if field in names and isinstance(value, dict) and field not in found:
                    found[field] = value
                else:
                    visit(value)
        elif isinstance(node, tuple | list):
            for item in node:
                visit(item)

    visit(state)
    return found


def trained_optax_state(bank, optimizer, gradient, steps):
    """An optax state after `steps` real steps of `gradient(parameters, bank)`, so every moment
    row is non-zero."""
    parameters = bank.parameters
    state = optimizer.init(parameters)
    for _ in range(steps):
        _, state = optimizer.update(gradient(parameters, bank), state, parameters)
    return state


# The spec's cluster bank CB as exact rationals, and its moments about the mean centre.
CB_CENTERS = (-0.01, 0.0, 0.02)
CB_WEIGHTS = (0.7, -0.2, 0.5)


def cluster_init(order) -> cb.MomentInitialization:
    centers = [Fraction(c) for c in CB_CENTERS]
    mean = sum(centers, Fraction(0)) / 3
    return cb.initialize_moments([-c for c in centers], CB_WEIGHTS, order=order, center=-mean)


BACKEND_COMPILES: list[str] = []
"""The names of every XLA backend compilation since the test process started."""
jax.monitoring.register_event_duration_secs_listener(
    lambda name, *_, **__: (
        BACKEND_COMPILES.append(name)
        if name == "/jax/core/compile/backend_compile_duration"
        else None
    )
)


def retracted_snapshot(bank: cb.ConfluentPackBank) -> dict:
    """`bank.portable_snapshot()` with every negative spread at 0 (spec 1.2: the forward reads
    `where(ρ ≥ 0, ρ, 0)`), computed on the host so that a negative subnormal, which a device
    flushing subnormals keeps through `retract()`, is projected too."""
    snapshot = bank.portable_snapshot()
    rho = snapshot["rho"]["values"]
    snapshot["rho"]["values"] = [0.0 if value < 0 else value for value in rho]
    return snapshot


def jaxpr_equations(jaxpr):
    """Every equation of a jaxpr, those of every nested sub-jaxpr (jit, scan, cond, custom
    rules) included, depth first."""
    for equation in jaxpr.eqns:
        yield equation
        for value in equation.params.values():
            for item in value if isinstance(value, list | tuple) else (value,):
                if hasattr(item, "eqns"):
                    yield from jaxpr_equations(item)
                elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                    yield from jaxpr_equations(item.jaxpr)
