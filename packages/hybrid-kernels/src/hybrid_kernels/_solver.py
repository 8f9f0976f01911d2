"""SolverConfig: every diffrax option a kernel needs, as one static, hashable value.

All fields are static, so a config is part of each kernel's compile-cache key: two equal
configs share compiled kernels, and changing a tolerance compiles anew.

**Adjoint default.** We default to `diffrax.RecursiveCheckpointAdjoint()`, diffrax's own
default and its recommended reverse-mode adjoint: it differentiates the solver's internal
operations with O(log n) checkpointed memory. On our CPU measurement (64 logistic-growth
experiments, see the guide) its steady-state step was about 3x faster than `DirectAdjoint`'s
(1.4 ms vs 4.2 ms) for a compile about 15% longer. `DirectAdjoint` (the peer's default)
compiles faster and supports forward mode too; pass `adjoint=diffrax.DirectAdjoint()` for short
runs or tests where compile time dominates. `BacksolveAdjoint` only differentiates what is
passed through diffrax `args` (see the guide).

**Sensitivity.** `sensitivity` says how a bucket step differentiates the solve: in reverse
mode through `adjoint`, or in forward mode (`diffrax.ForwardMode()`, one tangent per trainable
scalar). It lives here, beside the adjoint, because it describes the same thing, how the solve
is differentiated; so the kernels, the trainer and a custom loop all take it from the config
they already receive, with no new parameter. `"auto"` (the default) chooses from the number of
trainable scalars when a kernel is traced (`hybrid_kernels._sensitivity`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np

from hybrid_kernels._inputs import unusable_times
from hybrid_kernels._jumps import solve_with_jumps
from hybrid_kernels._row import current_row

# diffrax's ODE solvers that build with no arguments: explicit ones, and the implicit ones a
# stiff model needs (a saved run with `Kvaerno5` must reload without a `register_solver`).
SOLVER_REGISTRY: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        diffrax.Euler,
        diffrax.Heun,
        diffrax.Midpoint,
        diffrax.Ralston,
        diffrax.Bosh3,
        diffrax.Tsit5,
        diffrax.Dopri5,
        diffrax.Dopri8,
        diffrax.ImplicitEuler,
        diffrax.Kvaerno3,
        diffrax.Kvaerno4,
        diffrax.Kvaerno5,
    )
}
"""diffrax solver classes by name, for `SolverConfig.to_dict`/`from_dict` (`register_solver`)."""
ADJOINT_REGISTRY: dict[str, type] = {
    "RecursiveCheckpointAdjoint": diffrax.RecursiveCheckpointAdjoint,
    "DirectAdjoint": diffrax.DirectAdjoint,
    "BacksolveAdjoint": diffrax.BacksolveAdjoint,
    "ForwardMode": diffrax.ForwardMode,
}
"""diffrax adjoint classes by name, for `SolverConfig.to_dict`/`from_dict` (`register_adjoint`)."""


def register_solver(name: str, cls: type) -> None:
    """Make a diffrax solver class serialisable under `name` (overwrites an existing entry)."""
    SOLVER_REGISTRY[name] = cls


def register_adjoint(name: str, cls: type) -> None:
    """Make a diffrax adjoint class serialisable under `name` (overwrites an existing entry)."""
    ADJOINT_REGISTRY[name] = cls


def available_solvers() -> tuple[str, ...]:
    """The solver names `SolverConfig.from_dict` accepts (and `to_dict` writes), sorted.

    A read-only snapshot: built-ins plus those added with [`hybrid_kernels.register_solver`][].
    """
    return tuple(sorted(SOLVER_REGISTRY))


def available_adjoints() -> tuple[str, ...]:
    """The adjoint names `SolverConfig.from_dict` accepts (and `to_dict` writes), sorted.

    A read-only snapshot: built-ins plus those added with [`hybrid_kernels.register_adjoint`][].
    """
    return tuple(sorted(ADJOINT_REGISTRY))


def _name_of(obj: Any, registry: dict[str, type], what: str) -> str:
    for name, cls in registry.items():
        if type(obj) is cls:  # exact type: a subclass may carry different behaviour
            return name
    raise ValueError(
        f"SolverConfig.to_dict: {what} {type(obj).__name__} is not registered; call "
        f"register_{what}(name, {type(obj).__name__}) first. Registered: {sorted(registry)}."
    )


def _lookup(name: str, registry: dict[str, type], what: str) -> type:
    if name not in registry:
        raise ValueError(
            f"SolverConfig.from_dict: unknown {what} {name!r}; available: {sorted(registry)}."
        )
    return registry[name]


def _positive_finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


class SolverConfig(eqx.Module):
    """How every experiment is integrated.

    **Arguments:**

    - `solver`: a diffrax solver instance, e.g. `diffrax.Tsit5()`.
    - `rtol`: relative tolerance, finite and > 0.
    - `atol`: absolute tolerance, a float or a tuple with one entry per state component.
    - `max_steps`: the most solver steps per experiment, a positive int.
    - `dt0`: the initial step, or `None` to let diffrax pick one.
    - `adjoint`: a diffrax adjoint; default `RecursiveCheckpointAdjoint()` (see module docs).
    - `pcoeff`, `icoeff`, `dcoeff`: PID step-size controller coefficients (default: plain
        integral control).
    - `jump_ts`: times at which the vector field jumps for every experiment (a tuple of
        floats, default none). The solver steps to just before and just after each of them
        (`diffrax.ClipStepSizeController`) instead of failing steps across them. Each
        experiment's own input switch times (see [`hybrid_kernels.piecewise_constant`][]) are
        added automatically inside the kernels. A time too large to step around in float64
        (`t + 1 == t`, beyond about 4.5e15) raises `ValueError`. They reach the solves made by
        `SolverConfig.diffeqsolve` or with `SolverConfig.stepsize_controller()`; a
        `simulate_fn` that uses neither is refused when traced, rather than silently
        stepping across them.
    - `throw`: `True` (default) raises when a solve fails. `False` lets a failed experiment
        return non-finite states instead; the kernels then mask that row out of the loss,
        report it (`return_status=True`) and keep training the rest of the bucket. Kernels
        built with `throw=False` contain no host callbacks, so JAX's persistent compilation
        cache can store them.
    - `sensitivity`: how [`hybrid_kernels.build_bucket_step`][] differentiates the solve.
        `"reverse"`: backwards through `adjoint`. `"forward"`: forwards, with
        `diffrax.ForwardMode()` in place of `adjoint` and one tangent per trainable scalar
        (frozen leaves get none). `"auto"` (default): forward for at most 16 trainable
        scalars (a mechanistic model with a few rates), reverse above (a neural network),
        decided when the kernel is traced; a `BacksolveAdjoint` keeps reverse mode, and so
        does a `simulate_fn` forward mode cannot differentiate (one calling
        `diffrax.diffeqsolve` without `adjoint=solver.adjoint`), said once in a log record
        and on the progress display. An explicit `"forward"` that cannot run raises
        `ValueError`. Both modes give the same gradients to solver precision.
    """

    solver: Any = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    atol: float | tuple[float, ...] = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    dt0: float | None = eqx.field(static=True)
    adjoint: Any = eqx.field(static=True, default=diffrax.RecursiveCheckpointAdjoint())
    pcoeff: float = eqx.field(static=True, default=0.0)
    icoeff: float = eqx.field(static=True, default=1.0)
    dcoeff: float = eqx.field(static=True, default=0.0)
    throw: bool = eqx.field(static=True, default=True)
    jump_ts: tuple[float, ...] = eqx.field(static=True, default=())
    sensitivity: Literal["reverse", "forward", "auto"] = eqx.field(static=True, default="auto")

    def __check_init__(self):
        if not isinstance(self.solver, diffrax.AbstractSolver):
            raise TypeError(
                f"SolverConfig: `solver` must be a diffrax solver instance such as "
                f"diffrax.Tsit5(), got {self.solver!r}."
            )
        if not _positive_finite(self.rtol):
            raise ValueError(f"SolverConfig: `rtol` must be finite and > 0, got {self.rtol!r}.")
        atols = self.atol if isinstance(self.atol, tuple) else (self.atol,)
        if not atols or not all(_positive_finite(a) for a in atols):
            raise ValueError(
                "SolverConfig: `atol` must be a finite float > 0 or a non-empty tuple of them, "
                f"got {self.atol!r}."
            )
        if (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or self.max_steps < 1
        ):
            raise ValueError(
                f"SolverConfig: `max_steps` must be a positive int, got {self.max_steps!r}."
            )
        if self.dt0 is not None and not _positive_finite(self.dt0):
            raise ValueError(
                f"SolverConfig: `dt0` must be None or finite and > 0, got {self.dt0!r}."
            )
        if not isinstance(self.throw, bool):
            raise TypeError(f"SolverConfig: `throw` must be a bool, got {self.throw!r}.")
        if not isinstance(self.jump_ts, tuple) or not all(
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            for t in self.jump_ts
        ):
            raise ValueError(
                f"SolverConfig: `jump_ts` must be a tuple of finite floats, got {self.jump_ts!r}."
            )
        too_large = unusable_times(self.jump_ts, np.float64)
        if too_large:
            raise ValueError(
                f"SolverConfig: `jump_ts` {too_large} are too large for float64 times "
                "(t + 1 == t): the solver cannot step to just before and after them. Shift or "
                "rescale the times."
            )
        if self.sensitivity not in ("reverse", "forward", "auto"):
            raise ValueError(
                "SolverConfig: `sensitivity` must be 'reverse', 'forward' or 'auto', got "
                f"{self.sensitivity!r}."
            )

    def stepsize_controller(self, jump_ts: Any = None) -> Any:
        """The step-size controller: a `diffrax.PIDController` for these tolerances (a tuple
        `atol` becomes an array), wrapped in a `diffrax.ClipStepSizeController` when there are
        jump times (`self.jump_ts` and the given `jump_ts` `[J]`; `+inf` entries are padding).
        A `simulate_fn` that calls `diffrax.diffeqsolve` itself passes this controller to
        apply `SolverConfig(jump_ts=...)`.
        """
        row = current_row()
        if row is not None:
            row.controller_built = True
        atol = jnp.asarray(self.atol) if isinstance(self.atol, tuple) else self.atol
        pid = diffrax.PIDController(
            rtol=self.rtol, atol=atol, pcoeff=self.pcoeff, icoeff=self.icoeff, dcoeff=self.dcoeff
        )
        parts = [jnp.asarray(jump_ts)] if jump_ts is not None else []
        if self.jump_ts:
            dtype = parts[0].dtype if parts else None
            parts.append(jnp.asarray(np.asarray(self.jump_ts), dtype=dtype))
        if not parts:
            return pid
        return diffrax.ClipStepSizeController(pid, jump_ts=jnp.concatenate(parts))

    def diffeqsolve(
        self, term: Any, ts: Any, y0: Any, args: Any = None, *, jump_ts: Any = None
    ) -> diffrax.Solution:
        """Integrate `term` from `ts[0]` to `ts[-1]`, saving at `ts`; take `.ys` for `[T, S]`.

        **Arguments:**

        - `term`: a diffrax term, e.g. `diffrax.ODETerm(vector_field)`.
        - `ts`: save times `[T]`, non-decreasing (repeated trailing times are fine).
        - `y0`: the initial state `[S]`.
        - `args`: passed to the vector field; thread trainable values through here when using
            `BacksolveAdjoint`.
        - `jump_ts`: extra jump times `[J]` for this solve. Inside the kernels, the
            experiment's input switch times are added here automatically.

        Inside the kernels, the experiment's [`hybrid_kernels.StateJump`][]s are applied
        here: the solve runs piecewise between them (see the guide's "State jumps"), and the
        returned solution then carries `ts`, `ys`, `stats` and `result` but no dense
        interpolation. A `simulate_fn` with jumps must therefore solve through this method,
        not `diffrax.diffeqsolve`. Inside the kernels, the solution's accepted and rejected
        step counts are also recorded for the training display (no extra solve).
        """
        row = current_row()
        if row is not None and row.jump_ts is not None:
            jump_ts = row.jump_ts if jump_ts is None else jnp.concatenate([row.jump_ts, jump_ts])
        if jump_ts is None and self.jump_ts:
            jump_ts = ()
        if jump_ts is not None:  # jump times must share the time dtype (diffrax checks)
            jump_ts = jnp.asarray(jump_ts, dtype=jnp.result_type(ts))
        controller = self.stepsize_controller(jump_ts)

        def solve(t0, t1, save_ts, y0):
            return diffrax.diffeqsolve(
                term,
                self.solver,
                t0=t0,
                t1=t1,
                dt0=self.dt0,
                y0=y0,
                args=args,
                saveat=diffrax.SaveAt(ts=save_ts),
                stepsize_controller=controller,
                adjoint=self.adjoint,
                max_steps=self.max_steps,
                throw=self.throw,
            )

        if row is not None and row.jumps is not None:
            # The row's state jumps: piecewise between them, each segment ending exactly at a
            # jump, so no step crosses one (what `jump_ts` does for input switches).
            row.jumps_applied = True
            ts = jnp.asarray(ts)
            sol = solve_with_jumps(
                lambda a, b, save, y: solve(a, b, jnp.concatenate([save, b[None]]), y),
                ts,
                y0,
                row.jumps,
            )
        else:
            sol = solve(ts[0], ts[-1], ts, y0)
        if row is not None:
            row.stats.append(sol.stats)
        return sol

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; solver and adjoint are stored by registry name."""
        return {
            "solver": _name_of(self.solver, SOLVER_REGISTRY, "solver"),
            "rtol": self.rtol,
            "atol": list(self.atol) if isinstance(self.atol, tuple) else self.atol,
            "max_steps": self.max_steps,
            "dt0": self.dt0,
            "adjoint": _name_of(self.adjoint, ADJOINT_REGISTRY, "adjoint"),
            "pcoeff": self.pcoeff,
            "icoeff": self.icoeff,
            "dcoeff": self.dcoeff,
            "throw": self.throw,
            "jump_ts": list(self.jump_ts),
            "sensitivity": self.sensitivity,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SolverConfig:
        """Rebuild from `SolverConfig.to_dict`; optional keys fall back to the defaults."""
        missing = [k for k in ("solver", "rtol", "atol", "max_steps", "dt0") if k not in d]
        if missing:
            raise ValueError(f"SolverConfig.from_dict: missing key(s) {missing}.")
        atol = d["atol"]
        kwargs: dict[str, Any] = {}
        if "adjoint" in d:
            kwargs["adjoint"] = _lookup(d["adjoint"], ADJOINT_REGISTRY, "adjoint")()
        for k in ("pcoeff", "icoeff", "dcoeff", "throw", "sensitivity"):
            if k in d:
                kwargs[k] = d[k]
        if "jump_ts" in d:
            kwargs["jump_ts"] = tuple(float(t) for t in d["jump_ts"])
        return cls(
            solver=_lookup(d["solver"], SOLVER_REGISTRY, "solver")(),
            rtol=d["rtol"],
            atol=tuple(atol) if isinstance(atol, list | tuple) else atol,
            max_steps=d["max_steps"],
            dt0=d["dt0"],
            **kwargs,
        )
