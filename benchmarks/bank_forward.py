"""Bank forward/gradient benchmark: the vectorised `ConfluentPackBank` against a slot-by-slot loop.

For `max_packs` in (4, 16, 64) and `max_order` in (3, 8), float64, on 1024 points, it measures
compile time and steady-state time of `jit(forward)` and of `jit(grad)` (of `Σ forward(z)²` with
respect to the trainable parameters), for

- the package: slots are an array axis, one tower for all slots, masked sums over constant
  coefficient arrays;
- a baseline written here in the reference's style: a Python loop over slots, one Horner tower
  per slot differentiated by autodiff, a loop over orders, series terms and moment terms, and a
  sequential sum. Each baseline measurement runs in a subprocess with a time limit, because its
  compile time grows with the capacity (the reference did not finish compiling a 64-slot gradient
  in 25 minutes).

Every ratio is baseline / package, measured in the same run. Targets (issue 3): gradient compile
under 5 s at 64 slots, order 8; steady-state gradient at least 10x faster than the baseline.

`--simple` measures issue 10 (item 5) instead: value and gradient (`jax.value_and_grad` of
`Σ forward(z)²`) over 4096 points, float64, for `max_packs` in (4, 16, 64), of

- a plain sum of the same number of sigmoids, `Σ_i w_i σ(s_i (z − c_i))`, written here;
- the bank holding that order-0 bank (one series per slot), and a mixed bank (ordinary, pair and
  moment slots: the series and the pair formulas);
- the previous forward (every slot through the tower rows, pairs and moments, without the
  run-time branch), built here from the package's private pieces, on both banks.

Targets: order-0 bank ≤ 2x the plain sum; the mixed bank no slower than the previous forward.

Run: `python benchmarks/bank_forward.py` (several minutes), `--simple`, or `--quick` (a smoke
test of either).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import confluent_bank as cb  # noqa: E402
import confluent_bank._forward as forward_module  # noqa: E402
from confluent_bank._activations import riccati_coefficients  # noqa: E402

POINTS = 1024


def make_bank(max_packs: int, max_order: int) -> cb.ConfluentPackBank:
    """All slots active, modes cycling ordinary / pair / moments, orders cycling 0..N."""
    p = max_packs
    bank = cb.init_confluent_bank([], max_packs=p, max_order=max_order)
    rng = np.random.default_rng(0)
    rows = {
        "centers": rng.uniform(-1, 1, p),
        "weights": rng.normal(size=p),
        "scales": rng.uniform(0.5, 1.5, p),
        "rho": np.where(np.arange(p) % 2 == 0, 1e-6, 0.05),
        "odd_moments": rng.normal(size=p),
        "directions": 0.2 * rng.normal(size=p),
        "moment_coefficients": rng.normal(size=(p, max_order + 1)),
        "orders": np.arange(p) % (max_order + 1),
        "modes": np.arange(p) % 3,
        "active": np.ones(p, dtype=bool),
    }
    blocks = {k: jnp.asarray(v, dtype=getattr(bank, k).dtype) for k, v in rows.items()}
    return bank.__class__(**{**{n: getattr(bank, n) for n in cb.STATE_NAMES}, **blocks},
                          max_order=bank.max_order, base=bank.base)  # fmt: skip


# --- the slot-by-slot baseline (reference style) ------------------------------------------


def _loop_tower(z, order):
    s = jax.nn.sigmoid(z)
    rows = [s]
    for n in range(1, order + 1):
        coefficients = [float(c) for c in riccati_coefficients("sigmoid", n)]
        acc = jnp.full_like(z, coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = acc * s + c
        rows.append(acc)
    return jnp.stack(rows)


def _loop_pair(z, rho, eta, m0, m1, tower):
    p = jnp.where(rho >= 0, rho, 0.0)
    near = p * eta**2 <= 0.01**2
    h = jnp.sqrt(jnp.where(near, 1.0, p))
    u = jnp.where(near, 1.0, jnp.abs(h * eta))
    plus, minus, cross = jax.nn.sigmoid(z + u), jax.nn.sigmoid(z - u), jax.nn.sigmoid(u - z)
    a_f = (plus + minus) * 0.5
    b_f = eta * plus * cross * (-jnp.expm1(-2 * u) / (2 * u))
    r, e = jnp.where(near, p, 0.0), jnp.where(near, eta, 0.0)
    a_s, b_s = jnp.zeros_like(z), jnp.zeros_like(z)
    for k in range(6):
        a_s = a_s + tower[2 * k] * (r**k * e ** (2 * k)) / math.factorial(2 * k)
        b_s = b_s + tower[2 * k + 1] * (r**k * e ** (2 * k + 1)) / math.factorial(2 * k + 1)
    return m0 * jnp.where(near, a_s, a_f) + m1 * jnp.where(near, b_s, b_f)


def loop_forward(bank, z):
    """The reference's formulation: everything unrolled per slot, summed in slot order."""
    out = jnp.zeros_like(z)
    for i in range(bank.max_packs):
        argument = bank.scales[i] * (z - bank.centers[i])
        tower = _loop_tower(argument, max(bank.max_order, 11))
        ordinary = jnp.zeros_like(z)
        for order in range(bank.max_order + 1):
            value = bank.weights[i] * bank.scales[i] ** order * tower[order]
            ordinary = ordinary + jnp.where(bank.orders[i] == order, value, 0.0)
        eta = bank.directions[i] * z + bank.direction_bias[i]
        pair = _loop_pair(argument, bank.rho[i], eta, bank.weights[i], bank.odd_moments[i], tower)
        moments = jnp.zeros_like(z)
        for k in range(bank.max_order + 1):
            moments = moments + bank.moment_coefficients[i, k] * tower[k]
        mode = bank.modes[i]
        value = jnp.where(mode == 0, ordinary, jnp.where(mode == 1, pair, moments))
        out = out + jnp.where(bank.active[i], value, 0.0)
    return out


# --- issue 10: a simple bank against a plain sum of sigmoids ---------------------------------


def order_zero_bank(max_packs: int) -> cb.ConfluentPackBank:
    """Every slot an ordinary order-0 atom: the bank a plain sum of sigmoids is compared with."""
    rng = np.random.default_rng(1)
    packs = [
        cb.RefinedPack(0, c, w, s)
        for c, w, s in zip(
            rng.uniform(-1, 1, max_packs),
            rng.normal(size=max_packs),
            rng.uniform(0.5, 1.5, max_packs),
            strict=True,
        )
    ]
    return cb.init_confluent_bank(packs, max_packs=max_packs, max_order=3)


def plain_sum(parameters, z):
    """`Σ_i w_i σ(s_i (z − c_i))`: what the order-0 bank computes, with nothing else."""
    per_slot = (slice(None), None)
    c, w, s = parameters["centers"], parameters["weights"], parameters["scales"]
    return jnp.sum(w[per_slot] * jax.nn.sigmoid(s[per_slot] * (z - c[per_slot])), axis=0)


def previous_forward(bank, z):
    """The forward before issue 10: every slot through the tower rows and all three kinds'
    formulas (`_all_terms`), no run-time branch, no remat, no limits."""
    per_slot = (slice(None),) + (None,) * z.ndim
    terms = forward_module._all_terms(bank, z)
    terms = jnp.where(bank.active[per_slot], terms, jnp.zeros_like(terms))
    return forward_module._slot_order_sum(terms)


def value_and_grad_program(forward, bank, z):
    def objective(parameters):
        return jnp.sum(forward(bank.with_parameters(parameters), z) ** 2)

    return jax.jit(jax.value_and_grad(objective)), (bank.parameters,)


def run_simple(quick: bool) -> None:
    points = 64 if quick else 4096
    capacities = (4,) if quick else (4, 16, 64)
    budget = 0.1 if quick else 2.0
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, float64, {points} points; "
          "value and gradient of sum(forward(z)^2) w.r.t. the parameters")  # fmt: skip
    rows = []
    for max_packs in capacities:
        z = jnp.linspace(-2.0, 2.0, points)
        simple, mixed = order_zero_bank(max_packs), make_bank(max_packs, 3)
        plain = jax.jit(jax.value_and_grad(lambda p: jnp.sum(plain_sum(p, z) ** 2)))
        programs_ = {
            "plain": (
                plain,
                ({k: simple.parameters[k] for k in ("centers", "weights", "scales")},),
            ),
            "simple": value_and_grad_program(cb.bank_forward, simple, z),
            "simple_previous": value_and_grad_program(previous_forward, simple, z),
            "mixed": value_and_grad_program(cb.bank_forward, mixed, z),
            "mixed_previous": value_and_grad_program(previous_forward, mixed, z),
        }
        for function, args in programs_.values():
            jax.block_until_ready(function(*args))
        # Interleaved rounds, best of each: the machine may be shared, and a background load
        # then slows every program of one round alike.
        best = dict.fromkeys(programs_, math.inf)
        deadline = time.perf_counter() + budget * len(programs_)
        rounds = 0
        while rounds < 3 or (time.perf_counter() < deadline and rounds < 200):
            for name, (function, args) in programs_.items():
                start = time.perf_counter()
                jax.block_until_ready(function(*args))
                best[name] = min(best[name], time.perf_counter() - start)
            rounds += 1
        rows.append({"P": max_packs, **best})
        print(
            f"  P={max_packs}: " + ", ".join(f"{k} {fmt(v)}" for k, v in best.items()), flush=True
        )

    print("\n| P | plain sum | order-0 bank | ratio | previous | mixed bank | previous | ratio |")
    print("|" + " --- |" * 8)
    for r in rows:
        print(f"| {r['P']} | {fmt(r['plain'])} | {fmt(r['simple'])} "
              f"| {r['simple'] / r['plain']:.2f}x | {fmt(r['simple_previous'])} "
              f"| {fmt(r['mixed'])} | {fmt(r['mixed_previous'])} "
              f"| {r['mixed'] / r['mixed_previous']:.2f}x |")  # fmt: skip
    worst_simple = max(r["simple"] / r["plain"] for r in rows)
    worst_mixed = max(r["mixed"] / r["mixed_previous"] for r in rows)
    print("\nSummary:" + (" (--quick: a smoke test, not a measurement)" if quick else ""))
    verdict = "MET" if worst_simple <= 2 else "NOT MET"
    print(f"  order-0 bank / plain sum: {worst_simple:.2f}x (worst) -> target <= 2x {verdict}")
    verdict = "MET" if worst_mixed <= 1 else "NOT MET"
    print(f"  mixed bank / previous forward: {worst_mixed:.2f}x (worst) -> target <= 1x {verdict}")


# --- measurement ---------------------------------------------------------------------------


def programs(forward, bank, z):
    def objective(parameters):
        return jnp.sum(forward(bank.with_parameters(parameters), z) ** 2)

    return {
        "forward": (jax.jit(forward), (bank, z)),
        "grad": (jax.jit(jax.grad(objective)), (bank.parameters,)),
    }


def measure(function, args, budget_s):
    """(compile seconds, median steady-state seconds)."""
    start = time.perf_counter()
    compiled = function.lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 200):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times)


def run_baseline(max_packs, max_order, points, kind, budget_s, timeout_s):
    """One baseline measurement in a subprocess; None when it exceeds the time limit."""
    command = [sys.executable, __file__, "--_baseline", str(max_packs), str(max_order),
               str(points), kind, str(budget_s)]  # fmt: skip
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=True
        )
    except subprocess.TimeoutExpired:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def _baseline_child(args):
    max_packs, max_order, points, kind, budget_s = args
    bank = make_bank(int(max_packs), int(max_order))
    z = jnp.linspace(-2.0, 2.0, int(points))
    function, call_args = programs(loop_forward, bank, z)[kind]
    print(json.dumps(measure(function, call_args, float(budget_s))))


def fmt(seconds):
    if seconds is None:
        return "timeout"
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"


def ratio(baseline, ours):
    return "n/a" if baseline is None else f"{baseline / ours:.1f}x"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke test")
    parser.add_argument(
        "--baseline-timeout", type=float, default=None, help="seconds per baseline measurement"
    )
    parser.add_argument(
        "--simple", action="store_true", help="issue 10: simple banks against a plain sum"
    )
    parser.add_argument("--_baseline", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._baseline:
        _baseline_child(args._baseline)
        return
    if args.simple:
        run_simple(args.quick)
        return
    sizes = [(2, 1)] if args.quick else [(p, n) for n in (3, 8) for p in (4, 16, 64)]
    points = 32 if args.quick else POINTS
    budget = 0.1 if args.quick else 1.0
    timeout = args.baseline_timeout or (30.0 if args.quick else 180.0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, float64, {points} points; "
          f"baseline limit {timeout:.0f} s per measurement")  # fmt: skip
    rows = []
    for index, (max_packs, max_order) in enumerate(sizes, 1):
        print(f"[{index}/{len(sizes)}] max_packs={max_packs} max_order={max_order} ...", flush=True)
        bank = make_bank(max_packs, max_order)
        z = jnp.linspace(-2.0, 2.0, points)
        row = {"P": max_packs, "N": max_order}
        for kind, (function, call_args) in programs(cb.bank_forward, bank, z).items():
            row[kind] = measure(function, call_args, budget)
            row[f"{kind}_base"] = run_baseline(max_packs, max_order, points, kind, budget, timeout)
            ours, base = row[kind], row[f"{kind}_base"]
            print(
                f"    {kind:7s} compile {fmt(ours[0])} (baseline {fmt(base and base[0])}), "
                f"steady {fmt(ours[1])} (baseline {fmt(base and base[1])})",
                flush=True,
            )
        rows.append(row)

    header = ("| P | N | forward compile | forward steady | base steady | ratio | grad compile "
              "| base compile | grad steady | base steady | ratio |")  # fmt: skip
    print("\n" + header)
    print("|" + " --- |" * 11)
    for row in rows:
        fwd, gr = row["forward"], row["grad"]
        fb, gb = row["forward_base"], row["grad_base"]
        print(f"| {row['P']} | {row['N']} | {fmt(fwd[0])} | {fmt(fwd[1])} | {fmt(fb and fb[1])} "
              f"| {ratio(fb and fb[1], fwd[1])} | {fmt(gr[0])} | {fmt(gb and gb[0])} "
              f"| {fmt(gr[1])} | {fmt(gb and gb[1])} | {ratio(gb and gb[1], gr[1])} |")  # fmt: skip

    largest = max(rows, key=lambda r: (r["P"], r["N"]))
    compile_ok = largest["grad"][0] < 5.0
    speedups = [r["grad_base"][1] / r["grad"][1] for r in rows if r["grad_base"] is not None]
    print("\nSummary:" + (" (--quick: a smoke test, not a measurement)" if args.quick else ""))
    verdict = "MET" if compile_ok else "NOT MET"
    print(
        f"  gradient compile at P={largest['P']}, N={largest['N']}: "
        f"{fmt(largest['grad'][0])} -> target < 5 s {verdict}"
    )
    if speedups:
        worst = min(speedups)
        verdict = "MET" if worst >= 10 else "NOT MET"
        print(
            f"  steady-state gradient speed-up over the loop baseline: {worst:.1f}x (worst) to "
            f"{max(speedups):.1f}x -> target >= 10x {verdict}"
        )
    timeouts = [f"P={r['P']},N={r['N']}" for r in rows if r["grad_base"] is None]
    if timeouts:
        print(f"  baseline gradient did not compile within {timeout:.0f} s at: "
              f"{', '.join(timeouts)}")  # fmt: skip


if __name__ == "__main__":
    main()
