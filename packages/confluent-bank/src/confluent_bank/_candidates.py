"""Birth candidates: the atoms a growing bank may birth, all scored in one gradient.

A zero-weight atom changes nothing, and the derivative of the objective with respect to its
weight is the first-order gain of birthing it. Appending every candidate to the bank as an
active zero-weight slot gives all those derivatives in one reverse pass through the
objective (the bank's forward is elementwise over slots, so the extra slots cost one wider
forward); the objective's value is unchanged, since each candidate adds an exact zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._forward import bank_slot_terms
from confluent_bank._growing_options import NOT_TRACEABLE
from confluent_bank._records import SlotMode


def _candidate_bank(bank: ConfluentPackBank, pool: Mapping[str, np.ndarray]) -> ConfluentPackBank:
    """`bank` with the pool's atoms appended as active, zero-weight ordinary slots."""
    count = len(pool["centers"])
    dtype, integer = bank.centers.dtype, bank.orders.dtype

    def extend(name: str, tail: Any) -> jax.Array:
        block = getattr(bank, name)
        return jnp.concatenate([block, jnp.asarray(tail, dtype=block.dtype)])

    zeros = np.zeros(count)
    return dataclasses.replace(
        bank,
        centers=extend("centers", pool["centers"]),
        weights=extend("weights", zeros),
        scales=extend("scales", pool["scales"]),
        rho=extend("rho", zeros),
        odd_moments=extend("odd_moments", zeros),
        directions=extend("directions", zeros),
        direction_bias=extend("direction_bias", np.ones(count)),
        moment_coefficients=jnp.concatenate(
            [bank.moment_coefficients, jnp.zeros((count, bank.max_order + 1), dtype)]
        ),
        orders=extend("orders", pool["orders"]),
        ages=extend("ages", np.zeros(count, dtype=np.int64)),
        active=extend("active", np.ones(count, dtype=bool)),
        modes=extend("modes", np.full(count, SlotMode.ORDINARY)),
        slot_ids=jnp.concatenate(
            [bank.slot_ids, bank.max_packs + jnp.arange(count, dtype=integer)]
        ),
    )


class CandidateScorer:
    """Candidate atoms on a grid over the domain, and their scores for one bank.

    **Arguments:**

    - `domain`: `(lo, hi)`.
    - `n_centers`: centres evenly spread over the domain, ends included.
    - `scales`: input slopes; `orders`: derivative orders.
    - `n_points`: grid size of the RMS norm `‖φ‖` over the domain.
    """

    def __init__(
        self,
        domain: tuple[float, float],
        n_centers: int,
        scales: tuple[float, ...],
        orders: tuple[int, ...],
        n_points: int,
    ) -> None:
        grid = np.linspace(domain[0], domain[1], n_centers)
        c, s, n = np.meshgrid(grid, np.asarray(scales, float), np.asarray(orders), indexing="ij")
        self.candidates = {
            "centers": c.ravel(),
            "scales": s.ravel(),
            "orders": n.ravel().astype(np.int64),
        }
        self.domain = domain
        self.n_points = n_points
        self._norms: dict[tuple[Any, str, int], np.ndarray] = {}

    def _pool(self, bank: ConfluentPackBank) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The candidates this bank can hold (order ≤ max_order) and their RMS over the domain."""
        keep = self.candidates["orders"] <= bank.max_order
        pool = {name: value[keep] for name, value in self.candidates.items()}
        key = (bank.centers.dtype, bank.base, bank.max_order)
        if key not in self._norms:
            # The candidates alone, each with weight 1: their terms are the atoms φ_j.
            probe = _candidate_bank(dataclasses.replace(bank, active=bank.active & False), pool)
            probe = dataclasses.replace(probe, weights=probe.weights.at[bank.max_packs :].set(1))
            grid = jnp.linspace(*self.domain, self.n_points, dtype=bank.centers.dtype)
            terms = bank_slot_terms(probe, grid)[bank.max_packs :]
            self._norms[key] = np.sqrt(np.mean(np.asarray(terms) ** 2, axis=1))
        return pool, self._norms[key]

    def scores(
        self, objective: Callable[[Any], Any], leaves: list[tuple[Any, Any]], treedef: Any, i: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(|∂objective/∂w_j| / ‖φ_j‖, ∂objective/∂w_j)` for every candidate `j`, `[C]` each.

        Both come from one gradient evaluation. `leaves` (key path, leaf) and `treedef`
        rebuild the predictors; the bank is `leaves[i]`. Candidates of an order above the
        bank's `max_order` score 0 (and their gradient is 0).
        """
        bank = leaves[i][1]
        pool, norms = self._pool(bank)
        grown = _candidate_bank(bank, pool)

        def loss(weights: jax.Array) -> jax.Array:
            pieces = [leaf for _, leaf in leaves]
            full = jnp.concatenate([bank.weights, weights])
            pieces[i] = dataclasses.replace(grown, weights=full)
            return jnp.asarray(objective(treedef.unflatten(pieces))).reshape(())

        zero = jnp.zeros(len(pool["centers"]), dtype=bank.weights.dtype)
        try:
            gradient = np.asarray(jax.grad(loss)(zero))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as e:
            raise TypeError(NOT_TRACEABLE) from e
        scores = np.abs(gradient) / np.where(norms > 0, norms, np.inf)
        keep = self.candidates["orders"] <= bank.max_order
        full, raw = np.zeros(len(keep)), np.zeros(len(keep))
        full[keep], raw[keep] = scores, gradient
        finite = np.isfinite(full) & np.isfinite(raw)
        return np.where(finite, full, 0.0), np.where(finite, raw, 0.0)
