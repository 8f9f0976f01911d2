"""Adapters that carry optax optimizer states through bank transitions (optional extra).

```python
import confluent_bank.optax as cbo

optimizer = cbo.row_warmup(optax.adam(1e-2), steps=200)  # warms in fresh rows
bank, opt_state, ok = cb.commit_transition(
    bank, proposal, opt_state, between_steps=True, acceptance=accept,
    state_adapter=cbo.commit_adapter(),
)
bank, opt_state = cb.permute_bank(
    bank, permutation, opt_state, between_steps=True, state_adapter=cbo.transport_adapter()
)
```

The adapters walk the optax state (chains, `inject_hyperparams`, `masked`,
`multi_transform`, `apply_if_finite`, `conditionally_mask`, `MultiSteps`, `row_warmup`)
down to its moment trees
(`mu`, `nu`, `trace`, ...). Inside each moment tree they find the node shaped like the bank:
the `bank.parameters` dict or a `ConfluentPackBank` (full, or filtered with `None` leaves),
at the root or nested anywhere in a larger model pytree. At a commit its rows are carried
through the transition's change of coordinates (a `TransitionCarry`: first moments
exactly through the Jacobian, second moments by a bound) and the warm-up counters of fresh
coordinates restart; both transports permute the rows and sign-flip the relabelled
`weights`/`scales` rows of odd moments (`mu`, `trace`; never `nu`). Step counts,
hyperparameters and everything outside the bank are returned unchanged, except memory that
any change of coordinates invalidates: `optax.lbfgs` restarts its curvature memory, for the
whole model, and its line search's stored value is marked absent. A state type the
adapters do not know raises `TypeError` naming it; teach them with `parities=`.

Requires `pip install "confluent-bank[optax]"`; `import confluent_bank` never imports optax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
import optax.contrib  # loaded by `import optax` too; named for the states read from it below

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._carry import TransitionCarry
from confluent_bank._host import PARAMETER_NAMES, STATE_NAMES
from confluent_bank._optimizer_state import apply_carry, transport_rows, zero_rows
from confluent_bank._row_warmup import RowWarmupState, row_warmup

__all__ = [
    "KNOWN_STATE_PARITIES",
    "RowWarmupState",
    "commit_adapter",
    "row_warmup",
    "transport_adapter",
]


# Field roles: "odd"/"even" moment trees (linear / quadratic statistics of the gradient),
# "keep" (counts, hyperparameters, keys), "state" (a nested optax state), "states" (a mapping
# or sequence of nested optax states).
_KNOWN_BY_NAME: dict[str, dict[str, str]] = {
    "EmptyState": {},
    "ScaleByScheduleState": {"count": "keep"},
    "AddNoiseState": {"count": "keep", "rng_key": "keep"},
    "TraceState": {"trace": "odd"},
    "ScaleByAdamState": {"count": "keep", "mu": "odd", "nu": "even"},
    "ScaleByAmsgradState": {"count": "keep", "mu": "odd", "nu": "even", "nu_max": "even"},
    "ScaleByBeliefState": {"count": "keep", "mu": "odd", "nu": "even"},
    "ScaleByLionState": {"count": "keep", "mu": "odd"},
    "ScaleByRmsState": {"nu": "even"},
    "ScaleByRssState": {"sum_of_squares": "even"},
    "ScaleByRStdDevState": {"mu": "odd", "nu": "even"},
    "ScaleByAdaDeltaState": {"e_g": "even", "e_x": "even"},
    # Adan: `m` and `g` (the last gradient) are linear in the gradients, `v` in their
    # differences; `n` is quadratic.
    "ScaleByAdanState": {"m": "odd", "v": "odd", "n": "even", "g": "odd", "t": "keep"},
    "EmaState": {"count": "keep", "ema": "odd"},  # an average of updates: linear
    "ZeroNansState": {"found_nan": "keep"},  # one flag per leaf, not per row
    "InjectHyperparamsState": {"count": "keep", "hyperparams": "keep", "inner_state": "state"},
    "InjectStatefulHyperparamsState": {
        "count": "keep",
        "hyperparams": "keep",
        "hyperparams_states": "keep",
        "inner_state": "state",
    },
    "MaskedState": {"inner_state": "state"},
    "ConditionallyMaskState": {"step": "keep", "inner_state": "state"},
    "ConditionallyTransformState": {"inner_state": "state", "step": "keep"},
    "MultiTransformState": {"inner_states": "states"},
    "ApplyIfFiniteState": {
        "notfinite_count": "keep",
        "last_finite": "keep",
        "total_notfinite": "keep",
        "inner_state": "state",
    },
    "MultiStepsState": {
        "mini_step": "keep",
        "gradient_step": "keep",
        "inner_opt_state": "state",
        "acc_grads": "odd",
        "skip_state": "keep",
    },
    # L-BFGS's curvature pairs were measured in the coordinates a transition changes: its
    # memory restarts (the next step is a scaled gradient step, as its first was).
    "ScaleByLBFGSState": {
        "count": "restart",
        "params": "restart",
        "updates": "restart",
        "diff_params_memory": "restart",
        "diff_updates_memory": "restart",
        "weights_memory": "restart",
    },
    # A line search's stored objective and gradient are those of the parameters before the
    # transition: marked absent (value +inf), so `optax.value_and_grad_from_state` recomputes.
    "ScaleByZoomLinesearchState": {
        "learning_rate": "keep",
        "value": "stale",
        "grad": "restart",
        "info": "keep",
    },
    "ScaleByBacktrackingLinesearchState": {
        "learning_rate": "keep",
        "value": "stale",
        "grad": "restart",
        "info": "keep",
    },
}


# States that `optax.contrib` defines. AdEMAMix's two momenta are linear in the gradients,
# `nu`/`n` quadratic.
_CONTRIB_BY_NAME: dict[str, dict[str, str]] = {
    "ScaleByAdemamixState": {
        "count": "keep",
        "count_m2": "keep",
        "m1": "odd",
        "m2": "odd",
        "nu": "even",
    },
    "ScaleBySimplifiedAdEMAMixState": {"t": "keep", "m": "odd", "n": "even"},
}


def _all_kept(kind: type) -> dict[str, str]:
    return {field: "keep" for field in kind._fields}


def _known(module: object, by_name: dict[str, dict[str, str]]) -> dict[type, dict[str, str]]:
    """The state types of `by_name` that this optax version's `module` defines (older ones lack
    some)."""
    return {getattr(module, n): roles for n, roles in by_name.items() if hasattr(module, n)}


# The plateau rule's state holds scalars of the whole run (scale, best value, counters); a
# function-preserving transition leaves the objective where it was, so they stay valid.
_PLATEAU = getattr(optax.contrib, "ReduceLROnPlateauState", None)

KNOWN_STATE_PARITIES: dict[type, dict[str, str]] = (
    _known(optax, _KNOWN_BY_NAME)
    | _known(optax.contrib, _CONTRIB_BY_NAME)
    | ({_PLATEAU: _all_kept(_PLATEAU)} if _PLATEAU is not None else {})
    | {RowWarmupState: {"inner_state": "state", "ramp": "warmup"}}
)
"""The optax state types the adapters understand, mapped to the role of each field:
`"odd"` (a linear gradient statistic: carried linearly, sign-flipped by a tanh relabel),
`"even"` (quadratic or absolute: carried by a bound, never flipped), `"warmup"` (warm-up
counters: restarted for fresh coordinates), `"keep"` (counts, hyperparameters: untouched),
`"state"` (a nested optax state), `"states"` (a mapping or sequence of nested states),
`"restart"` (memory that a change of coordinates invalidates, such as L-BFGS's curvature
pairs: set to zeros, counts to 0, for the whole state, bank or not) or `"stale"` (a stored
objective value: set to `+inf`, which optax's line searches read as not yet computed)."""

_ROLES = frozenset({"odd", "even", "warmup", "keep", "state", "states", "restart", "stale"})

# A function of (bank-shaped node's arrays by block name, parity) returning the new arrays.
_RowOp = Callable[[dict[str, Any], str], dict[str, Any]]


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _is_bank_node(node: Any) -> bool:
    return isinstance(node, ConfluentPackBank) or (
        isinstance(node, Mapping) and set(node) == set(PARAMETER_NAMES)
    )


def _node_arrays(node: Any, bank: Any) -> dict[str, Any] | None:
    """The row-indexed arrays of a bank-shaped node, or None if it belongs to another bank."""
    names = STATE_NAMES if isinstance(node, ConfluentPackBank) else PARAMETER_NAMES
    arrays = {}
    for name in names:
        value = node[name] if isinstance(node, Mapping) else getattr(node, name)
        if not _is_array(value):
            continue  # None (filtered out), optax.MaskedNode, ...
        if tuple(value.shape) != tuple(getattr(bank, name).shape):
            return None
        if value.ndim:
            arrays[name] = value
    return arrays


def _rebuild_node(node: Any, arrays: dict[str, Any]) -> Any:
    if isinstance(node, ConfluentPackBank):
        return dataclasses.replace(node, **arrays)
    merged = {name: arrays.get(name, value) for name, value in node.items()}
    return merged if type(node) is dict else type(node)(merged)


@dataclasses.dataclass(frozen=True)
class _Walk:
    """One pass over an optax state, applying a row operation to every bank-shaped node."""

    bank: Any
    row_op: _RowOp
    path: str | None
    parities: Mapping[type, Mapping[str, str]]
    found: list[str] = dataclasses.field(default_factory=list)
    moment_trees: list[str] = dataclasses.field(default_factory=list)

    def state(self, state: Any, where: str) -> Any:
        roles = self.parities.get(type(state))
        if roles is None:
            if type(state) in (tuple, list) or isinstance(state, dict):  # (named_)chain
                return self.states(state, where)
            kind = type(state)
            raise TypeError(
                f"confluent_bank.optax cannot adapt optimizer state of type "
                f"{kind.__module__}.{kind.__qualname__} (at {where or 'the root'}); pass "
                "parities={type: {field: 'odd'|'even'|'warmup'|'keep'|'state'|'states'|"
                "'restart'|'stale'}} or an explicit adapter function"
            )
        fields = getattr(type(state), "_fields", None)
        if fields is None:
            raise TypeError(f"state type {type(state).__qualname__} is not a NamedTuple")
        missing = [f for f in fields if f not in roles]
        if missing:
            raise TypeError(
                f"no role is known for fields {missing} of {type(state).__qualname__}; pass "
                "parities= with a role for every field"
            )
        updates = {}
        for field in fields:
            role, value, at = roles[field], getattr(state, field), f"{where}.{field}"
            if role in ("odd", "even", "warmup"):
                updates[field] = self.moments(value, role, at)
            elif role == "state":
                updates[field] = self.state(value, at)
            elif role == "states":
                updates[field] = self.states(value, at)
            elif role == "restart":
                updates[field] = jax.tree.map(jnp.zeros_like, value)
            elif role == "stale":
                updates[field] = jax.tree.map(lambda x: jnp.full_like(x, jnp.inf), value)
        return state._replace(**updates) if updates else state

    def states(self, value: Any, where: str) -> Any:
        if isinstance(value, Mapping):
            items = {k: self.state(v, f"{where}[{k!r}]") for k, v in value.items()}
            return items if type(value) is dict else type(value)(items)
        return type(value)(self.state(v, f"{where}[{i}]") for i, v in enumerate(value))

    def moments(self, tree: Any, parity: str, where: str) -> Any:
        self.moment_trees.append(where)
        matches: list[str] = []

        def visit(key_path: Any, node: Any) -> Any:
            if not _is_bank_node(node):
                return node
            arrays = _node_arrays(node, self.bank)
            key = jax.tree_util.keystr(key_path)
            if arrays is None or (self.path is not None and key != self.path):
                return node
            matches.append(key)
            return _rebuild_node(node, self.row_op(arrays, parity)) if arrays else node

        result = jax.tree_util.tree_map_with_path(visit, tree, is_leaf=_is_bank_node)
        if len(matches) > 1:
            raise ValueError(
                f"{where} holds several nodes shaped like the bank, at {matches}; pass "
                "path=... (one of these key strings) to choose the bank being transformed"
            )
        self.found.extend(matches)
        return result

    def run(self, state: Any) -> Any:
        result = self.state(state, "")
        if self.moment_trees and not self.found:
            wanted = "" if self.path is None else f" at path {self.path!r}"
            raise ValueError(
                f"no node shaped like the bank ({self.bank.max_packs} slots){wanted} was "
                f"found in the optimizer state's moment trees {self.moment_trees}; the params "
                "given to optax must contain bank.parameters or the (filtered) bank"
            )
        return result


def _parities(extra: Mapping[type, Mapping[str, str]] | None) -> dict[type, dict[str, str]]:
    table = {kind: dict(roles) for kind, roles in KNOWN_STATE_PARITIES.items()}
    for kind, roles in (extra or {}).items():
        if not isinstance(kind, type):
            raise TypeError(f"parities keys must be state types, got {kind!r}")
        bad = {field: role for field, role in roles.items() if role not in _ROLES}
        if bad:
            raise ValueError(f"unknown roles {bad} for {kind.__qualname__}; use {sorted(_ROLES)}")
        table[kind] = dict(roles)
    return table


@dataclasses.dataclass(frozen=True)
class _ResetAdapter:
    path: str | None
    parities: Mapping[type, Mapping[str, str]]

    def __call__(self, state: Any, bank: Any, slots: tuple[int, ...]) -> Any:
        size = bank.max_packs

        def reset(arrays: dict[str, Any], parity: str) -> dict[str, Any]:
            del parity  # a fresh slot forgets every statistic (warm-up counters restart)
            return zero_rows(arrays, tuple(slots), size)

        return _Walk(bank, reset, self.path, self.parities).run(state)


@dataclasses.dataclass(frozen=True)
class _CarryAdapter(_ResetAdapter):
    def carry_transition(self, state: Any, bank: Any, carry: TransitionCarry) -> Any:
        def move(arrays: dict[str, Any], parity: str) -> dict[str, Any]:
            return apply_carry(arrays, carry, parity)

        return _Walk(bank, move, self.path, self.parities).run(state)


@dataclasses.dataclass(frozen=True)
class _TransportAdapter:
    path: str | None
    parities: Mapping[type, Mapping[str, str]]

    def __call__(
        self,
        state: Any,
        bank: Any,
        permutation: tuple[int, ...] | None,
        sign_slots: tuple[int, ...],
    ) -> Any:
        size = bank.max_packs

        def transport(arrays: dict[str, Any], parity: str) -> dict[str, Any]:
            return transport_rows(arrays, permutation, sign_slots, size, flip=parity == "odd")

        return _Walk(bank, transport, self.path, self.parities).run(state)


def _check_path(path: str | None) -> str | None:
    if path is not None and not isinstance(path, str):
        raise TypeError(f"path must be a key string such as \"['bank']\", got {path!r}")
    return path


def commit_adapter(
    *,
    path: str | None = None,
    parities: Mapping[type, Mapping[str, str]] | None = None,
    transport: bool = True,
) -> Callable[[Any, Any, tuple[int, ...]], Any]:
    """An `OptimizerStateAdapter` for optax states, for `commit_transition(state_adapter=...)`.

    By default a `TransitionStateAdapter`: `commit_transition` hands it the proposal's
    `TransitionCarry`, and it carries every moment tree (`mu`, `nu`, `trace`, ...) of the
    bank-shaped node through the transition's change of coordinates (see `TransitionCarry`):
    odd moments exactly through the Jacobian, even ones by the
    Cauchy–Schwarz bound; fresh coordinates (a birth's slot, a pair's `directions`) start at
    zero and their `row_warmup` counters restart. Step counts and everything else are kept
    (but `optax.lbfgs` restarts its memory, see the module docstring).
    Called directly as `adapter(state, bank, slots)` (without a carry), or with
    `transport=False`, it zeroes the affected rows instead (the earlier behaviour).

    **Arguments:**

    - `path`: where the bank sits inside the params pytree, as `jax.tree_util.keystr` writes
      it (e.g. `"['bank']"`, `".bank"`, `"[0]"`; `""` when the params are the bank's own
      parameters dict). Needed only when several nodes have the bank's shapes.
    - `parities`: extra or overriding state types, `{StateType: {field: role}}` with roles
      as in `KNOWN_STATE_PARITIES`.
    - `transport`: carry the moments through the transition (default) or zero the rows.

    **Returns:** a callable `(state, candidate_bank, slots) -> state`, with a
    `carry_transition(state, candidate_bank, carry)` method when `transport` is true.

    Calling it raises `TypeError` naming an unknown state type, and `ValueError` when no
    moment tree holds the bank or one holds several candidates and `path` is not given.
    """
    if not isinstance(transport, bool):
        raise TypeError(f"transport must be True or False, got {transport!r}")
    kind = _CarryAdapter if transport else _ResetAdapter
    return kind(_check_path(path), _parities(parities))


def transport_adapter(
    *, path: str | None = None, parities: Mapping[type, Mapping[str, str]] | None = None
) -> Callable[[Any, Any, tuple[int, ...] | None, tuple[int, ...]], Any]:
    """An `ExactTransportAdapter` for optax states, for `permute_bank`/`relabel_tanh_sign`.

    Permutes the rows of the bank-shaped node in every moment tree, and for a tanh relabel
    negates the relabelled `weights`/`scales` rows of odd moment trees (`mu`, `trace`) but
    not of even ones (`nu`). Step counts and everything else are kept (but `optax.lbfgs`
    restarts its memory).

    **Arguments:**

    - `path`: as for `commit_adapter`.
    - `parities`: as for `commit_adapter`.

    **Returns:** a callable `(state, candidate_bank, permutation, sign_slots) -> state`.
    """
    return _TransportAdapter(_check_path(path), _parities(parities))
