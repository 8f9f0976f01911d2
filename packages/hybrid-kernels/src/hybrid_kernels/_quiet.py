"""`throw=True` solves traced without host callbacks, their checks replayed when one may fail.

On CPU, jax runs a program that holds a host callback synchronously: its dispatch returns only
once the program has run. Every `throw=True` solve holds equinox's checks (diffrax's result
check, its argument checks) as callbacks, so a training loop on CPU cannot overlap its host
work (reads, display, the next dispatch) with the step in flight, and the callbacks add to the
program XLA compiles. A hand-written diffrax loop pays this too.

The trainer's one-bucket step is traced instead with equinox's checks in their `"nan"` form
(`_errors.no_host_callbacks`): a failed check poisons its value with NaN, so a failed solve
leaves non-finite states in its row. Such a step is *suspect*, and so is any step whose loss,
gradient or states are not finite; the trainer then rolls back to before it and runs it again
with the callbacks, which raises exactly the error (or reports exactly the skipped step) that
a `throw=True` run raises. A step that is not suspect passed every check, so its result is
the `throw=True` one. `SolverConfig(throw=True)` keeps its meaning; only where it is checked
moves.

The quiet trace passes `simulate_fn` a `_QuietSolver`: equal to the user's config in every
field, but of another type, so that a `simulate_fn` the user jitted themselves caches its
quiet trace apart from its ordinary one (jax keys its trace cache on the arguments' types).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybrid_kernels._solver import SolverConfig


class _QuietSolver(SolverConfig):
    """A `throw=True` `SolverConfig` whose checks are traced as NaN poisoning."""


def quiet(solver: SolverConfig) -> SolverConfig:
    """`solver` traced without host callbacks (see the module); a `throw=False` config, which
    holds none already, is returned as it is."""
    return solver if is_quiet(solver) or not solver.throw else _as(_QuietSolver, solver)


def loud(solver: SolverConfig) -> SolverConfig:
    """The user's own config behind `quiet(solver)` (`solver` itself if it is not quiet)."""
    return _as(SolverConfig, solver) if is_quiet(solver) else solver


def _as(cls: type[SolverConfig], solver: SolverConfig) -> SolverConfig:
    return cls(**{f.name: getattr(solver, f.name) for f in dataclasses.fields(solver)})


def is_quiet(solver: Any) -> bool:
    """Whether `solver` is a `throw=True` config traced without host callbacks."""
    return isinstance(solver, _QuietSolver)


def callback_free(solver: Any) -> bool:
    """Whether a kernel traced with `solver` holds no host callbacks of equinox's checks."""
    return not getattr(solver, "throw", True) or is_quiet(solver)
