"""The growing policy's options, checked where the user passes them: each message names
`TransitionHook.growing` and the argument, so a wrong value fails at construction, not at the
first check hundreds of steps into training."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np


def _name(argument: str) -> str:
    return f"TransitionHook.growing: {argument}"


def positive_int(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{_name(argument)} must be a positive integer, got {value!r}")
    return int(value)


def non_negative(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{_name(argument)} must be a finite number >= 0, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{_name(argument)} must be a finite number >= 0, got {value!r}")
    return number


def choice(value: Any, argument: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        names = " or ".join(repr(a) for a in allowed)
        raise ValueError(f"{_name(argument)} must be {names}, got {value!r}")
    return str(value)


def flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_name(argument)} must be True or False, got {value!r}")
    return value


def slopes(value: Sequence[float] | None) -> tuple[float, ...] | None:
    """`scales`: `None` (relative to each domain's width) or finite numbers > 0."""
    if value is None:
        return None
    if not (
        value and all(isinstance(s, numbers.Real) and math.isfinite(s) and s > 0 for s in value)
    ):
        raise ValueError(f"{_name('scales')} must be finite numbers > 0, got {value!r}")
    return tuple(float(s) for s in value)


def orders(value: Sequence[int]) -> tuple[int, ...]:
    if not value or not all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in value
    ):
        raise ValueError(f"{_name('orders')} must be integers >= 0, got {value!r}")
    return tuple(int(n) for n in value)


def objective(value: Any) -> Any:
    if not callable(value):
        raise TypeError(f"{_name('objective')} must be callable, got {value!r}")
    return value


def objective_value(value: Any) -> float:
    """What the objective returned, as a float: a scalar, or the error names the objective."""
    if np.shape(value) != ():
        raise ValueError(
            f"{_name('objective')} must return a scalar (shape ()), got shape "
            f"{np.shape(value)}; reduce it (jnp.mean, jnp.sum) inside the objective"
        )
    return float(value)


NOT_TRACEABLE = (
    "TransitionHook.growing: objective must be differentiable with jax.grad (the candidates "
    "are scored by its gradient with respect to their weights), but tracing it failed: build "
    "it from jax operations on the predictors, with no float(), np.asarray() or Python "
    "branching on their values"
)
