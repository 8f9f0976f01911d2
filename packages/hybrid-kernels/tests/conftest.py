"""pytest configuration for the hybrid-kernels tests: float64 once, and the model fixtures.

x64 is process-global in jax, so it is switched on here, once, before any test module is
imported. Tests of float32 behaviour say so explicitly: they pass `dtype="float32"` and float32
arrays, or run a subprocess with jax's defaults (x64 off). Models and helpers live in
`helpers.py`.
"""

from __future__ import annotations

import jax
import pytest
from helpers import Model, decay_model, oscillator_model

from hybrid_kernels._training import _loop

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="session")
def decay() -> Model:
    """Exponential decay with true rate k = 0.7."""
    return decay_model()


@pytest.fixture(scope="session")
def oscillator() -> Model:
    """Harmonic oscillator with true angular frequency ω = 1.3, position observed."""
    return oscillator_model()


@pytest.fixture
def no_lag(monkeypatch):
    """The next training run reads every step it dispatches before dispatching the next."""
    monkeypatch.setattr(_loop, "may_lag", lambda setup: False)
