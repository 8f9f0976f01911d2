"""What the kernels know about the experiment whose `simulate_fn` is being traced.

While one row's `simulate_fn` traces, a context variable holds its input switch times and
state jumps. `SolverConfig.diffeqsolve` reads them (it clips steps at the switches and
integrates piecewise between the jumps) and records its step counts; an `InputSignal` notes
that its switch times were read, and `SolverConfig.stepsize_controller` that it was built.
Afterwards the row refuses a `simulate_fn` that left them, or `SolverConfig(jump_ts=...)`,
unused: a solve made with `diffrax.diffeqsolve` directly sees neither the jumps nor the
switch times unless it was given them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any


class Row:
    """One experiment being traced: its jump times `[J]` (or `None` when its inputs never
    switch), its state jumps (`JumpArrays` of one row, or `None`), whether a solve applied
    them, whether `simulate_fn` read the switch times, and a tape of the solves' `stats`."""

    def __init__(self, jump_ts: Any, jumps: Any = None) -> None:
        self.jump_ts = jump_ts
        self.jumps = jumps
        self.jumps_applied = False
        self.switches_read = False
        self.controller_built = False
        self.stats: list[dict[str, Any]] = []

    def check_jumps_applied(self, bucket: str) -> None:
        """After `simulate_fn`: refuse a row whose jumps no solve applied (never silently).
        `bucket` names the bucket in the message."""
        if self.jumps is not None and not self.jumps_applied:
            raise ValueError(
                f"simulate_fn never called `solver.diffeqsolve`, but the experiments of {bucket} "
                "have state jumps (make_experiment(jumps=...)), which only "
                "`solver.diffeqsolve` applies; they would be ignored. Solve with "
                "`solver.diffeqsolve(term, ts, y0, args)` instead of `diffrax.diffeqsolve`."
            )

    def check_switches_reached(self, bucket: str, inputs: Sequence[str]) -> None:
        """After `simulate_fn`: refuse a row whose input switch times reached no solve.

        A step-size controller that does not know where an input switches steps across the
        switch, and can step over a pulse shorter than its step without a stage inside it:
        the solve is then wrong by more than its tolerances, with nothing to say so."""
        if self.jump_ts is None or self.stats or self.switches_read:
            return
        names = ", ".join(repr(name) for name in inputs)  # a row with switches has inputs
        raise ValueError(
            f"simulate_fn made no `solver.diffeqsolve` call and never read `jump_ts`, but the "
            f"experiments of {bucket} have inputs that change in time ({names}): a "
            "`diffrax.diffeqsolve` that is not given their switch times can step across a "
            "switch, or over a short pulse, and be wrong without any error. Solve with "
            "`solver.diffeqsolve(term, ts, y0, args)`, which adds them, or give them to your "
            "own solve: `stepsize_controller=diffrax.ClipStepSizeController(controller, "
            f"jump_ts=covariates[{inputs[0]!r}].jump_ts)`. (A simulate_fn that solves no "
            "differential equation can read `jump_ts` to say so.)"
        )

    def check_solver_jumps_reached(self, bucket: str, jump_ts: tuple[float, ...]) -> None:
        """After `simulate_fn`: refuse `SolverConfig(jump_ts=...)` times that reached no solve
        (no `solver.diffeqsolve` call, no `solver.stepsize_controller()` built)."""
        if not jump_ts or self.stats or self.controller_built:
            return
        raise ValueError(
            f"SolverConfig(jump_ts={jump_ts}) gives its jump times to `solver.diffeqsolve` and "
            "`solver.stepsize_controller()`, but simulate_fn used neither for the experiments "
            f"of {bucket}: a `diffrax.diffeqsolve` not given them steps across the jumps and "
            "can be wrong beyond its tolerances without any error. Solve with "
            "`solver.diffeqsolve(term, ts, y0, args)`, or pass "
            "`stepsize_controller=solver.stepsize_controller()` to your own solve."
        )


_ROW: contextvars.ContextVar[Row | None] = contextvars.ContextVar("hk_row", default=None)


def current_row() -> Row | None:
    """The row being traced, or `None` outside the kernels."""
    return _ROW.get()


@contextlib.contextmanager
def row_context(jump_ts: Any, jumps: Any = None) -> Iterator[Row]:
    """While tracing one experiment's `simulate_fn`: hand its jump times and state jumps to
    every `SolverConfig.diffeqsolve` call and collect their step counts."""
    row = Row(jump_ts, jumps)
    token = _ROW.set(row)
    try:
        yield row
    finally:
        _ROW.reset(token)
