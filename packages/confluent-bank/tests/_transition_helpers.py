"""Shared fixtures for the transition tests: the spec's pair and cluster banks (spec section 6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import confluent_bank as cb

PB_DIGEST = "fb65eb322b8867ba9e7c9b3d12aa75d640c096cc17fded5a27d9e8fe6fcf23ff"
PB_PAIR_DIGEST = "1772e5f36b38ad1389d6c3d13be79518d1513edaf6840f3a14ed17cca4fc9c27"


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
