"""One bucket's solves: `simulate_fn` run on every row, with its inputs and state jumps.

The shared core of the training kernels, the scorer and the predictions (`_kernels`,
`_prediction`): each row's input signals join its covariates, its jump times and state jumps
reach every `solver.diffeqsolve` call it makes, and the solver's step counts are read back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from hybrid_kernels import _preflight as pf
from hybrid_kernels._inputs import row_signals
from hybrid_kernels._row import row_context


def _simulate_bucket(predictors, bp, *, simulate_fn, solver) -> Float[Array, "N T S"]:
    return _simulate_with_steps(predictors, bp, simulate_fn=simulate_fn, solver=solver)[0]


def _simulate_with_steps(predictors, bp, *, simulate_fn, solver):
    """`(full [N, T, S], steps [N, 2])`: the states, and each row's accepted and rejected
    solver steps (-1 where `simulate_fn` made no `solver.diffeqsolve` call we could read).

    Each row's input signals join its covariates, and its jump times and state jumps reach
    every `solver.diffeqsolve` call it makes (`row_context`); a row whose jumps or switch
    times no solve received is refused.
    """

    def one(ts, covariates, y0, inputs, jump_ts, jumps):
        covariates = {**covariates, **row_signals(inputs or {}, jump_ts)}
        with row_context(jump_ts, jumps) as row:
            try:
                out = simulate_fn(predictors, ts, covariates, y0, solver)
            except Exception as error:
                note = pf.narrow_y0_note(predictors, y0, bp)
                if note is not None:
                    error.add_note(note)
                raise
        bucket = pf.bucket_name(bp)
        row.check_jumps_applied(bucket)
        row.check_switches_reached(bucket, sorted(inputs or {}))
        row.check_solver_jumps_reached(bucket, getattr(solver, "jump_ts", ()))
        pf.check_simulate_out(out, bp)
        return out, _row_steps(row, ts)

    return _per_row(one)(bp.ts, bp.covariates, bp.y0, bp.inputs, bp.jump_ts, bp.jumps)


def _per_row(one):
    """`jax.vmap(one)`, except for a one-row bucket (a static shape), where `one` runs on row 0
    directly: a vmapped diffrax solve is a batched solver loop, which costs a one-trajectory
    problem about half its step time. The result is the same up to rounding."""

    def run(*rows):
        if rows[0].shape[0] != 1:  # rows[0] is `ts [N, T]`
            return jax.vmap(one)(*rows)
        out = one(*jax.tree.map(lambda x: x[0], rows))
        return jax.tree.map(lambda x: x[None], out)

    return run


def _row_steps(row, ts) -> Array:
    # Only a solve traced at this row's own level can leave the row function: one made inside
    # a nested transform of simulate_fn (its own vmap, scan, ...) would leak a tracer. Without
    # the vmap (one-row buckets) the row's level is that of the caller, where `ts` lives too.
    stats = [
        st
        for st in row.stats
        if getattr(st.get("num_accepted_steps"), "_trace", None) is getattr(ts, "_trace", None)
    ]
    if not stats:
        return jnp.full((2,), -1, jnp.int32)
    acc = sum(jnp.asarray(st["num_accepted_steps"], jnp.int32) for st in stats)
    rej = sum(jnp.asarray(st["num_rejected_steps"], jnp.int32) for st in stats)
    return jnp.stack([acc, rej])
