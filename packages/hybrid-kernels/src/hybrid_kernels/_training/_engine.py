"""The trainer's compiled kernels, built only from the public kernels, and their caches.

`Engine` holds the kernels of one model, loss, penalty and mask: `bucket_step`,
`score_bucket`, `penalty_step`, and one `Optimizer` (transformation, `apply_update` and the
step's jitted tail from `_step.make_tail`) per optimiser spec.

Kernels live in small caches (the ODE kernels keyed on the model, loss and mask; the penalty
kernel on the penalty and mask; one update tail per optimiser), so the tournament, ensemble
members, a resumed run and repeated calls reuse compiled code instead of rebuilding closures
and recompiling, and changing the penalty or the optimiser never recompiles an ODE kernel.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from hybrid_kernels._dispatch import _strong
from hybrid_kernels._dtypes import default_float
from hybrid_kernels._kernels import (
    build_apply_update,
    build_bucket_step,
    build_penalty_step,
    build_score_bucket,
)
from hybrid_kernels._losses import resolve_loss_fn
from hybrid_kernels._objective import Objective, make_objective, stored_value_and_grad
from hybrid_kernels._penalties import bound_penalty
from hybrid_kernels._training._step import any_solved, make_tail, set_learning_rate
from hybrid_kernels._training.config import OPTIMIZER_REGISTRY, OptaxTrainingConfig

_CACHE_SIZE = 16


class Model(NamedTuple):
    """The user's model: `simulate_fn`, `state_to_output` and the `SolverConfig`."""

    simulate_fn: Callable[..., Any]
    state_to_output: Callable[..., Any]
    solver: Any


class Optimizer(NamedTuple):
    """An optimiser spec made ready: `uses_objective` when its update calls `value_fn`."""

    transformation: optax.GradientTransformation
    injectable: bool
    apply_update: Callable[..., Any]
    tail: Callable[..., Any]
    uses_objective: bool
    stores_value: bool


_MODEL_KERNELS: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_PENALTY_KERNELS: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_OPTIMIZERS: collections.OrderedDict[Any, Any] = collections.OrderedDict()


def _cached(table: collections.OrderedDict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
    try:
        hash(key)
    except TypeError:  # an unhashable callable or solver: no sharing, but still correct
        return build()
    if key in table:
        table.move_to_end(key)
        return table[key]
    value = table[key] = build()
    while len(table) > _CACHE_SIZE:
        table.popitem(last=False)
    return value


def _mask_key(trainable: Any) -> Any:
    if callable(trainable) and not isinstance(trainable, jax.Array):
        return ("filter", trainable)
    leaves, treedef = jax.tree_util.tree_flatten(trainable)
    return (treedef, tuple(bool(x) for x in leaves))


class Engine:
    """The kernels of one model, loss, penalty and mask.

    The pieces are cached separately, so changing the penalty never recompiles the ODE
    kernels and changing the optimiser only builds a new (cheap) update tail.
    """

    def __init__(self, model: Model, trainable: Any, config: OptaxTrainingConfig) -> None:
        simulate_fn, state_to_output, solver = model
        self.trainable = trainable
        self._mask_key = _mask_key(trainable)
        tp_fn, tp_weight = config.trajectory_penalty_fn, config.trajectory_penalty_weight

        def model_kernels() -> tuple[Any, Any]:
            loss_fn = resolve_loss_fn(config.loss, config.channel_idx, config.channel_weights)
            bucket_step = build_bucket_step(
                simulate_fn,
                state_to_output,
                solver,
                loss_fn,
                trainable,
                tp_fn,
                tp_weight,
                return_status=True,
            )
            score_bucket = build_score_bucket(
                simulate_fn, state_to_output, solver, loss_fn, tp_fn, tp_weight, return_status=True
            )
            return bucket_step, score_bucket

        model_key = (
            simulate_fn,
            state_to_output,
            solver,
            self._mask_key,
            config.loss,
            config.channel_idx,
            config.channel_weights,
            tp_fn,
            tp_weight,
        )
        self.bucket_step, self.score_bucket = _cached(_MODEL_KERNELS, model_key, model_kernels)
        self.penalty_fn = bound_penalty if config.penalty_fn is None else config.penalty_fn
        self._objective_for: Any = None
        self._objective: Objective | None = None
        self._stored: tuple[Any, Any, Any] | None = None
        self._report: tuple[Any, ...] | None = None
        self.throws = bool(solver.throw)  # whether a failed solve raises
        self.penalty_step = _cached(
            _PENALTY_KERNELS,
            (self.penalty_fn, self._mask_key),
            lambda: build_penalty_step(self.penalty_fn, trainable),
        )

    def optimizer(self, spec: Any, lr: float) -> Optimizer:
        """The transformation for `spec` (names and factories get an injectable rate)."""
        # The spec itself is kept in the entry, so an id() key cannot be reused while cached.
        spec_key = ("name", spec) if isinstance(spec, str) else ("object", id(spec))
        return _cached(
            _OPTIMIZERS, (self._mask_key, spec_key), lambda: (spec, self._build_optimizer(spec, lr))
        )[1]

    def _build_optimizer(self, spec: Any, lr: float) -> Optimizer:
        if isinstance(spec, optax.GradientTransformation):
            transformation, injectable = spec, False
        else:
            factory = OPTIMIZER_REGISTRY[spec] if isinstance(spec, str) else spec
            try:
                transformation = optax.inject_hyperparams(factory, static_args=_sizes(factory))(
                    learning_rate=lr
                )
            except TypeError as exc:
                raise ValueError(
                    f"optimizer factory {spec!r} failed when called with learning_rate=; a "
                    "factory must accept a keyword argument named learning_rate"
                ) from exc
            injectable = True
        apply_update = build_apply_update(transformation, self.trainable)
        return Optimizer(
            transformation,
            injectable,
            apply_update,
            make_tail(apply_update),
            *calls_value_fn(transformation),
        )

    def stored_step(self, opt: Optimizer, carry: Any, objective: Any) -> tuple | None:
        """The arguments of `opt.tail` read from the line search's state, when it holds the
        value and gradient at `carry.predictors` for `objective` (it does after each of its
        own updates, unless a hook, a phase change or a resume replaced the parameters or
        the state since); `None` when the bucket steps must run.

        Only with `throw=True` solves, where no row can fail silently: this step reports no
        per-row failures and no solver effort (the line search measured them)."""
        last = self._stored
        if not (opt.stores_value and self.throws and last is not None):
            return None
        if not (
            carry.predictors is last[0] and carry.opt_state is last[1] and objective is last[2]
        ):
            return None
        loss, grads, pen, pen_grads = stored_value_and_grad(
            objective, carry.predictors, carry.opt_state
        )
        failed, row_weights, unknown, one = self._stored_report(objective)
        return (loss,), (grads,), failed, row_weights, unknown, one, pen, pen_grads

    def _stored_report(self, objective: Any) -> tuple:
        """The fixed parts of a stored step's report for `objective`: no failed rows, unknown
        solver effort, one weight. Built once per objective (per phase): making them afresh
        was over a third of `stored_step`'s host time (under cProfile, 200 L-BFGS steps of the
        `benchmarks/lbfgs.py` model: 0.40 s in `stored_step`, 0.25 s with them kept)."""
        if self._report is None or self._report[0] is not objective:
            payloads = objective.payloads
            self._report = (
                objective,
                tuple(jnp.zeros(bp.ts.shape[:1], bool) for bp in payloads),
                tuple(bp.row_weights for bp in payloads),
                tuple(jnp.full((bp.ts.shape[0], 2), -1, jnp.int32) for bp in payloads),
                jnp.ones((1,), objective.weights.dtype),
            )
        return self._report[1:]

    def remember(self, opt: Optimizer, out: tuple[Any, Any], objective: Any) -> tuple[Any, Any]:
        """Note the carry a line-search update returned (see `stored_step`); returns `out`."""
        if opt.stores_value:
            carry = out[0]
            self._stored = (carry.predictors, carry.opt_state, objective)
        return out

    def objective(self, payloads: tuple[Any, ...], inputs: Any) -> Objective:
        """The objective a step with `inputs` descends, for optimisers that call `value_fn`;
        built once per phase (per `inputs`). `Objective.for_trials`: under `throw=True`, a
        trial whose solve fails is NaN, which the line search rejects, instead of an error
        that would end the run."""
        if self._objective_for is not inputs:
            kernel = self.bucket_step
            self._objective = make_objective(
                kernel._objective,
                self.trainable,
                payloads,
                inputs.weights,
                fraction=inputs.fraction,
                tp_weight=kernel._tp_weight,
                penalty_fn=self.penalty_fn,
                penalty_weight=inputs.penalty_weight,
                points=inputs.points,
            ).for_trials()
            self._objective_for = inputs
        return self._objective

    def fresh_opt_state(self, opt: Optimizer, predictors: Any, lr: float) -> Any:
        """A new optimiser state for the trainable leaves of `predictors`, at rate `lr`."""
        opt_state = _strong(opt.transformation.init(eqx.filter(predictors, self.trainable)))
        return set_learning_rate(opt_state, lr) if opt.injectable else opt_state

    def score(self, predictors: Any, payloads: tuple[Any, ...], weights: jax.Array) -> jax.Array:
        """The forward-only objective over `payloads` at the full horizon (on the device).

        NaN when every experiment's solve failed (`throw=False`): such a score measured nothing.
        """
        one = jnp.ones((), weights.dtype)
        scored = [self.score_bucket(predictors, bp, one) for bp in payloads]
        losses, failed = tuple(s[0] for s in scored), tuple(s[1] for s in scored)
        row_weights = tuple(bp.row_weights for bp in payloads)
        return _weighted_sum(losses, failed, row_weights, weights)


def check_update(opt: Optimizer, predictors: Any, trainable: Any, where: str) -> None:
    """Run `opt`'s `init` on the trainable leaves of `predictors` and trace one `apply_update`
    abstractly, called as the step calls it (`value` always, `value_fn` for a line search), so
    that a transformation that cannot take them is named here, not from inside the first
    step's trace. `where` names the config entry."""
    params = eqx.filter(predictors, trainable)
    leaves = jax.tree_util.tree_leaves(params)
    value = jnp.zeros((), jnp.result_type(*leaves) if leaves else default_float())
    value_fn = (lambda p: value) if opt.uses_objective else None

    def trial(state: Any) -> Any:
        return opt.apply_update(predictors, params, state, value=value, value_fn=value_fn)

    try:
        # init as the trainer runs it: eagerly (an init may read concrete values)
        eqx.filter_eval_shape(trial, opt.transformation.init(params))
    except Exception as exc:
        raise TypeError(
            f"{where} cannot update the trainable leaves ({type(exc).__name__}: "
            f"{str(exc).rstrip('.')}). The "
            "trainer calls init(params) and update(grads, state, params) on them (with value= "
            "for a transformation that takes extra arguments, and grad= and value_fn= for a "
            "line search); one that "
            "needs other parameters (optax.lookahead's LookaheadParams) or arguments the "
            "trainer does not have (optax.contrib.sophia's obj_fn) fits a custom loop instead "
            "(see the custom-loop guide)"
        ) from exc


def _sizes(factory: Callable[..., Any]) -> tuple[str, ...]:
    """A factory's integer arguments (memory sizes, step counts): passed as they are, since
    `inject_hyperparams` would make them traced arrays that Python control flow cannot read."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(
        p.name for p in parameters if isinstance(p.default, int) and not isinstance(p.default, bool)
    )


def calls_value_fn(transformation: optax.GradientTransformation) -> tuple[bool, bool]:
    """Whether `transformation.update` calls `value_fn` (a line search), found by one abstract
    update on a small trial parameter (the objective is built only for those that do), and
    whether its state then stores the value and gradient it found (as
    `optax.value_and_grad_from_state` reads them)."""
    if not isinstance(transformation, optax.GradientTransformationExtraArgs):
        return False, False
    called = []

    def value_fn(p: Any) -> jax.Array:
        called.append(True)
        return jnp.sum(p["x"] ** 2)

    def trial() -> Any:
        params = {"x": jnp.ones((2,), default_float())}
        state = transformation.init(params)
        value = value_fn(params)
        called.clear()
        return transformation.update(
            params, state, params, value=value, grad=params, value_fn=value_fn
        )

    try:
        _, state = jax.eval_shape(trial)
    except Exception:  # a transformation that cannot run on the trial: not a line search
        return False, False
    try:
        stored = all(optax.tree_utils.tree_get(state, k) is not None for k in ("value", "grad"))
    except KeyError:  # several values: not a state `stored_value_and_grad` can read
        stored = False
    return bool(called), bool(called) and stored


@eqx.filter_jit
def _weighted_sum(losses, failed, row_weights, weights) -> jax.Array:
    total = sum(weights[b].astype(loss.dtype) * loss for b, loss in enumerate(losses))
    return jnp.where(any_solved(failed, row_weights), total, jnp.nan)
