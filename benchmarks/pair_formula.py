"""The centred pair's formulas against an ordinary slot's series, per evaluation, at the
trainer's sizes (issue 24, item 3).

Inside an ODE the bank is evaluated thousands of times per gradient on small arrays (the
integration example: 8 slots x 18 states), so what a slot kind costs is the cost of its
formulas at that size. This benchmark measures, per evaluation, the value and its `vjp` with
respect to every input (as reverse-mode training evaluates them), in float64, inside one
jitted `fori_loop` (every input perturbed per iteration, so nothing is hoisted out), for
`P` lanes of 18 points:

- *ordinary series*: the package's one series per slot (`_activations._SERIES`, `max_order=3`),
  which every ordinary and moment slot takes (the baseline);
- *two sigmoids*: `σ(z + u) + σ(z − u)` with `u = √ρ·η`, the least any exact formula for a pair
  has to evaluate (a floor, not a pair: it is not accurate near the collision);
- *pair, near side* and *pair, far side*: each of the pair's two formulas alone
  (`_atoms._near_pair`, `_atoms._finite_pair`);
- *pair, as the bank evaluates it*: `_atoms._pair_terms` with the tower rows the bank passes
  (both sides at every point, the safe stand-ins, the selects and the exact value at `ρη² = 0`).

Printed: microseconds per evaluation and the ratio to the ordinary series at the same `P`,
measured in the same run. The pair's `ρ` is drawn so that half of the points are near the
collision and half are not (the formulas' cost does not depend on it: both sides run
everywhere).

Run: `python benchmarks/pair_formula.py` (about a minute), `--quick` for fewer repeats.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from confluent_bank import _atoms
from confluent_bank._activations import _SERIES, sigma_tower_rows

jax.config.update("jax_enable_x64", True)

POINTS = 18  # the integration example's largest bucket of states, as the probes used
LOOP = 2000
MAX_ORDER = 3


def _inputs(lanes: int) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(0), 4)
    z = 2.0 * jax.random.normal(keys[0], (lanes, POINTS))
    eta = jax.random.normal(keys[1], (lanes, POINTS))
    # ρη² on both sides of the series radius (0.01² by default).
    rho = jnp.where(jax.random.bernoulli(keys[2], 0.5, (lanes, 1)), 1e-6, 0.05)
    coefficients = jax.random.normal(keys[3], (MAX_ORDER + 1, lanes, 1))
    return z, rho, eta, coefficients


def _ordinary(z, rho, eta, coefficients):
    del rho, eta
    return _SERIES["sigmoid"](coefficients, z)


def _two_sigmoids(z, rho, eta, coefficients):
    u = jnp.sqrt(rho) * eta
    return coefficients[0] * (jax.nn.sigmoid(z + u) + jax.nn.sigmoid(z - u))


def _near(z, rho, eta, coefficients):
    a, b = _atoms._near_pair("sigmoid", z, _atoms.retract_spread(rho) * eta**2, eta, 6)
    return coefficients[0] * a + coefficients[1] * b


def _far(z, rho, eta, coefficients):
    u = jnp.abs(jnp.sqrt(_atoms.retract_spread(rho)) * eta)
    a, b = _atoms._finite_pair("sigmoid", z, u, eta)
    return coefficients[0] * a + coefficients[1] * b


def _pair(z, rho, eta, coefficients):
    tower = sigma_tower_rows("sigmoid", z, 1)
    a, b = _atoms._pair_terms("sigmoid", z, rho, eta, tower)
    return coefficients[0] * a + coefficients[1] * b


FORMULAS: dict[str, Callable] = {
    "ordinary series": _ordinary,
    "two sigmoids": _two_sigmoids,
    "pair, near side": _near,
    "pair, far side": _far,
    "pair, as the bank evaluates it": _pair,
}


def _per_evaluation(formula: Callable, lanes: int, repeats: int) -> float:
    """Microseconds per value-and-vjp of `formula` on `lanes` x 18 points (best of `repeats`)."""
    inputs = _inputs(lanes)

    @jax.jit
    def loop(inputs):
        def body(_, carry):
            shift = carry * 1e-12
            moved = tuple(x + shift for x in inputs)
            value, vjp = jax.vjp(formula, *moved)
            cotangents = vjp(jnp.ones_like(value))
            return carry + sum(jnp.sum(c) for c in cotangents) * 1e-12 + jnp.sum(value) * 1e-12

        return jax.lax.fori_loop(0, LOOP, body, jnp.zeros((), jnp.float64))

    jax.block_until_ready(loop(inputs))  # compile
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(loop(inputs))
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / LOOP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 2 if args.quick else 7
    lane_counts = (1, 8)
    results: dict[tuple[str, int], float] = {}
    for lanes in lane_counts:
        for name, formula in FORMULAS.items():
            results[name, lanes] = _per_evaluation(formula, lanes, repeats)
            print(f"  P={lanes}  {name:32s} {results[name, lanes]:7.2f} us", flush=True)
    print()
    header = " | ".join(f"P={p} (us) | ratio" for p in lane_counts)
    print(f"| formula, value and vjp | {header} |")
    print("| --- |" + " --- | --- |" * len(lane_counts))
    for name in FORMULAS:
        cells = " | ".join(
            f"{results[name, p]:.2f} | {results[name, p] / results['ordinary series', p]:.1f}x"
            for p in lane_counts
        )
        print(f"| {name} | {cells} |")
    print()
    pair, base = "pair, as the bank evaluates it", "ordinary series"
    print(
        f"summary: the pair's formulas cost {results[pair, 8] / results[base, 8]:.1f}x the "
        f"ordinary series on 8 lanes and {results[pair, 1] / results[base, 1]:.1f}x on one lane "
        f"(floor, two sigmoids: {results['two sigmoids', 8] / results[base, 8]:.1f}x and "
        f"{results['two sigmoids', 1] / results[base, 1]:.1f}x)"
    )


if __name__ == "__main__":
    main()
