"""Session-wide fixtures: one float64 training run with transitions, shared by several tests.

Compiling the ODE kernels dominates the cost on a small CPU, so the standard run is trained
once per session and every test reads what it needs from it.
"""

from __future__ import annotations

import dataclasses
import re
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


@dataclasses.dataclass
class GrownRun:
    history: Any
    bank: Any
    hook: Any  # the confluent_bank.GrowingHook that grew it


@pytest.fixture(scope="session")
def grown_run(standard_run) -> GrownRun:
    """The standard problem's bank grown from two broad atoms by the growing hook."""
    start = P.two_broad_atoms(jnp.float64)
    hook = P.growing_hook(standard_run.dataset, start, dtype=jnp.float64)
    history, bank = P.run_standard(standard_run.dataset, dtype=jnp.float64, hooks=hook, bank=start)
    return GrownRun(history, bank, hook)


def _files_reading_shared_runs() -> set[str]:
    """The test files that use `standard_run`, `control_run` or `grown_run` (read from their
    source: the scheduler runs in xdist's controller, which collects no tests)."""
    uses = re.compile(r"\b(standard_run|control_run|grown_run)\b")
    return {p.name for p in Path(__file__).parent.glob("test_*.py") if uses.search(p.read_text())}


# optionalhook: without pytest-xdist (the GPU lease's Python has none) the hook is unknown.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist's ``--dist loadfile``: each file whole on one worker (its module
    fixtures compile once), as loadfile does, and every file that reads a session-wide run
    on the same worker, so the run trains once, not once per worker. (``xdist_group`` marks
    cannot say this: under pytest 9 xdist no longer sees them.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared = _files_reading_shared_runs()

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "shared-runs" if Path(file).name in shared else file

    return SharedRunScheduling(config, log)
