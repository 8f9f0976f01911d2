"""Host side of every kernel call: argument coercion, first-use checks, dispatch.

Everything here runs in Python before a compiled kernel is dispatched, so it is kept cheap:
one flatten of the predictors per call, cached scalar arrays, a shape key that is a handful of
tuples, and a dispatch whose static parts were bound when the kernel was built
(`hybrid_kernels._flat_jit`). The compiled bodies live in `hybrid_kernels._kernels`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array

from hybrid_kernels import _flat_jit as fj
from hybrid_kernels import _preflight as pf
from hybrid_kernels import _sensitivity as sensitivity
from hybrid_kernels._data import BucketPayload
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._errors import RowSolveError, solver_reason
from hybrid_kernels._quiet import quiet
from hybrid_kernels._solver import SolverConfig


def _strong_flat(tree: Any) -> tuple[Any, Any]:
    """`(tree with weak-typed array leaves made strong, treedef)`, flattening only once."""
    leaves, treedef = jtu.tree_flatten(tree)
    if any(fj.is_weak(x) for x in leaves):
        leaves = [fj.strong(x) if fj.is_weak(x) else x for x in leaves]
        tree = jtu.tree_unflatten(treedef, leaves)
    return tree, treedef


def _strong(tree: Any) -> Any:
    """Give weak-typed array leaves a strong type, so an update never changes the cache key."""
    return _strong_flat(tree)[0]


_SCALARS: dict[tuple, Array] = {}


def _scalar(x: Any) -> Array:
    """`x` as a strong array of jax's default float dtype; Python numbers are cached.

    Caching means a loop passing the same Python float every step pays no host-to-device
    transfer per call.
    """
    dt = default_float()
    if isinstance(x, jax.Array):
        return x if x.dtype == dt and not x.weak_type else jnp.asarray(x, dtype=dt)
    if type(x) in (float, int):
        key = (x, dt)
        arr = _SCALARS.get(key)
        if arr is None:
            if len(_SCALARS) >= 4096:
                _SCALARS.clear()
            arr = _SCALARS[key] = jnp.asarray(x, dtype=dt)
        return arr
    return jnp.asarray(x, dtype=dt)


def _shape_key(treedef: Any, bp: Any) -> tuple:
    """What a first-use check depends on: the predictors' structure and the bucket's shape."""
    return (
        treedef,
        bp.ts.shape,
        bp.ts.dtype,
        bp.y0.shape,
        bp.y0.dtype,
        bp.y_observed.shape,
        bp.y_observed.dtype,
    )


def _check_build(where: str, simulate_fn, state_to_output, solver, loss_fn) -> None:
    if not isinstance(solver, SolverConfig):
        raise TypeError(f"{where}: `solver` must be a SolverConfig, got {type(solver).__name__}.")
    for name, fn in (
        ("simulate_fn", simulate_fn),
        ("state_to_output", state_to_output),
        ("loss_fn", loss_fn),
    ):
        if not callable(fn):
            raise TypeError(f"{where}: `{name}` must be callable, got {type(fn).__name__}.")


def _check_tp(fn: Callable | None, weight: Any) -> None:
    pf.check_weight(weight, "trajectory_penalty_weight")
    if fn is None and not isinstance(weight, jax.core.Tracer) and float(weight) != 0.0:
        raise ValueError(
            "`trajectory_penalty_weight` is non-zero but `trajectory_penalty_fn` is None; "
            "pass the penalty function too."
        )


def _explain_backsolve(error: Exception, solver: SolverConfig) -> None:
    """Turn JAX's closed-over custom_vjp error into the recipe a BacksolveAdjoint user needs."""
    if isinstance(solver.adjoint, diffrax.BacksolveAdjoint) and "closed-over value" in str(error):
        raise ValueError(
            "BacksolveAdjoint only differentiates values passed through diffrax `args`, but "
            "simulate_fn closes over trainable predictors. Pass them explicitly: "
            "`solver.diffeqsolve(term, ts, y0, args=predictors)` and read them from the vector "
            "field's `args`, or use RecursiveCheckpointAdjoint / DirectAdjoint."
        ) from error


class _BucketKernel:
    """Host wrapper around one bucket body: coercion, first-use checks, dispatch."""

    def __init__(self, body, objective, trainable, tp_weight, return_status, where, diagnose):
        # Bound once into one jitted entry (`_flat_jit`): kernels built from equal arguments
        # share it, so rebuilding a kernel (a new run, an ensemble member, an optimiser reset)
        # never recompiles, and a call flattens only the predictors and the bucket.
        bound = (objective,) if trainable is None else (objective, trainable)
        self._run = fj.entry(body, *bound)
        self._body, self._bound = body, bound
        self._objective = objective
        self._trainable = trainable
        self._tp_weight = tp_weight
        self._return_status = return_status
        self._where = where
        # The forward-only body, rerun with throw=False to find failed rows on error.
        self._diagnose = diagnose
        self._seen: set = set()
        self.last_solver_steps: Array | None = None

    def quiet_run(self):
        """This kernel's entry traced without host callbacks (`_quiet`): a `throw=True`
        solve's failed checks leave NaN and flag their rows, for the caller to replay."""
        objective = self._bound[0]
        bound = (dataclasses.replace(objective, solver=quiet(objective.solver)), *self._bound[1:])
        return fj.entry(self._body, *bound)

    @property
    def sensitivity_notice(self) -> str | None:
        """Why `sensitivity="auto"` differentiates this kernel in reverse mode although it
        chose forward (`simulate_fn` cannot be differentiated forwards); `None` otherwise.
        Known once the kernel has been traced."""
        return sensitivity.fallback_reason(self._objective)

    def _arguments(self, predictors, bp, length_mask_fraction, trajectory_penalty_weight):
        """Check and coerce one call's arguments: `(static, dynamic, fraction, weight)`."""
        if not isinstance(bp, BucketPayload):
            raise TypeError(
                f"{self._where}: `bp` must be a BucketPayload, got {type(bp).__name__}."
            )
        static, dynamic = fj.flatten(predictors)
        if isinstance(length_mask_fraction, float | int):
            pf.check_fraction(length_mask_fraction)
        weight = self._tp_weight if trajectory_penalty_weight is None else trajectory_penalty_weight
        # Python numbers are checked every call (free); an array weight is checked only when
        # a shape is first used, so a loop passing device scalars never syncs with the host.
        if trajectory_penalty_weight is not None and not isinstance(weight, jax.Array):
            _check_tp(self._objective.trajectory_penalty_fn, weight)
        key = _shape_key(static[0], bp)
        if key not in self._seen:
            pf.check_fraction(length_mask_fraction)
            _check_tp(self._objective.trajectory_penalty_fn, weight)
            strong = fj.unflatten(static, dynamic)
            if self._trainable is not None:
                pf.check_trainable(self._trainable, strong)
            pf.check_dtypes(strong, bp, self._where)
            self._seen.add(key)
        return static, dynamic, _scalar(length_mask_fraction), _scalar(weight)

    def __call__(self, predictors, bp, length_mask_fraction, trajectory_penalty_weight=None):
        args = self._arguments(predictors, bp, length_mask_fraction, trajectory_penalty_weight)
        throw = self._objective.solver.throw
        try:
            out = fj.call(self._run, *args[:2], bp, *args[2:], wait=throw)
        except eqx.EquinoxRuntimeError as e:
            if throw and not isinstance(e, RowSolveError):
                self._name_failed_rows(e, args, bp)
            raise
        except Exception as e:
            _explain_backsolve(e, self._objective.solver)
            raise
        *out, self.last_solver_steps = out  # kept on the device: no host sync here
        if self._return_status:
            return tuple(out)
        value = tuple(out[:-1])  # drop the failure flags
        return value[0] if len(value) == 1 else value

    def _name_failed_rows(self, error, args, bp) -> None:
        """Raise `RowSolveError` naming the rows whose solve fails (the error path only).

        Under `vmap` a throwing solve fails the whole bucket without saying which row failed,
        so the bucket is solved again forward-only with `throw=False`, whose per-row flags say.
        That compiles one more kernel, but only once an error has already stopped the call.
        """
        static, dynamic, fraction, weight = args
        solver = dataclasses.replace(self._objective.solver, throw=False)
        objective = dataclasses.replace(self._objective, solver=solver)
        try:
            run = fj.entry(self._diagnose, objective)
            _, failed, _ = fj.call(run, static, dynamic, bp, fraction, weight, wait=False)
            failed = np.asarray(failed)
        except Exception:  # the diagnosis must never hide the original error
            return
        real = np.asarray(bp.row_weights) > 0
        rows = tuple(int(r) for r in np.flatnonzero(failed & real))
        if not rows:
            return
        raise RowSolveError(
            f"{self._where}: the solve failed for row(s) {list(rows)} of {pf.bucket_name(bp)}: "
            f"{solver_reason(error)} (the experiment ids of a bucket's rows are "
            "`dataset.exp_ids[b]`; SolverConfig(throw=False) masks failed rows instead)",
            bucket=bp,
            rows=rows,
        ) from error

    def lower(self, predictors, bp, length_mask_fraction, trajectory_penalty_weight=None):
        """AOT-lower for one bucket shape (`jax.jit`'s `Lowered`; `.compile()` to warm up)."""
        static, dynamic, fraction, weight = self._arguments(
            predictors, bp, length_mask_fraction, trajectory_penalty_weight
        )
        return self._run.lower(static, dynamic, bp, fraction, weight)
