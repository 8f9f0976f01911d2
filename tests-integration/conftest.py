"""Session-wide fixtures: one float64 training run with transitions, shared by several tests.

Compiling the ODE kernels dominates the cost on a small CPU, so the standard run is trained
once per session and every test reads what it needs from it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

jax.config.update("jax_enable_x64", True)

# The problem definition is example code, shared with examples/demo.py.
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import hybrid_problem as P  # noqa: E402


@dataclasses.dataclass
class StandardRun:
    dataset: Any
    domain: tuple[float, float]
    history: Any
    bank: Any
    hook: Any  # a confluent_bank.TransitionHook
    simulate: P.TraceCounter


@pytest.fixture(scope="session")
def standard_run() -> StandardRun:
    dataset = P.make_dataset(dtype=jnp.float64)
    domain = P.data_range(dataset)
    objective = P.bucket_objective(dataset, P.make_solver(jnp.float64))
    hook = P.transition_hook(P.STANDARD_PLAN, domain, error_budget=1e-3, objective=objective)
    simulate = P.TraceCounter(P.simulate)
    history, bank = P.run_standard(dataset, dtype=jnp.float64, hooks=hook, simulate_fn=simulate)
    return StandardRun(dataset, domain, history, bank, hook, simulate)


@pytest.fixture(scope="session")
def control_run(standard_run) -> Any:
    """The loss history of the standard run without commits (the hook only retracts)."""
    hook = P.transition_hook({}, standard_run.domain)
    history, _ = P.run_standard(standard_run.dataset, dtype=jnp.float64, hooks=hook)
    return history


# Files whose tests read the session-wide runs above.
_SHARED_RUNS = {"standard_run", "control_run"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup``, keep each file whole on one worker (its module
    fixtures compile once) and every file that reads a shared run on the same worker (the run
    trains once, not once per worker)."""
    shared = {item.module.__name__ for item in items if _SHARED_RUNS & set(item.fixturenames)}
    for item in items:
        name = item.module.__name__
        item.add_marker(pytest.mark.xdist_group("shared-runs" if name in shared else name))
