"""State jumps: bucket-step time against the number of jumps (doses) per experiment.

Workload: 4 subjects of a two-compartment pharmacokinetic model over one year (365 days),
sampled 40 times each, with 1, 10, 100 or 1000 bolus doses per subject (the most: about 3 a
day) at evenly spaced, subject-specific times; the elimination rate is trained. Tsit5 with
the default adjoint (`RecursiveCheckpointAdjoint`). Each count is its own dataset, so its own
padded jump shape (8, 16, 128, 1024 slots) and its own compile. Two sensitivities: forward
(what `"auto"` picks for this one scalar) and reverse (what a neural network gets).

Measured: the steady-state time of one `build_bucket_step` call (best of the repeats, after a
warm-up), its ratio to the 1-dose case of the same sensitivity measured in the same run, and
the cost per padded slot. Linear cost means the ratio grows at most in proportion to the
slots; the compile time must not grow with the count (one scan body whatever the count).

Run: `python benchmarks/jumps.py` (a few minutes on a 2-core CPU) or `--quick` (1, 10 and
100 doses, fewer repeats: a smoke test).
"""

from __future__ import annotations

import argparse
import statistics
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import hybrid_kernels as hk

jax.config.update("jax_enable_x64", True)

K12, K21, KEL = 0.3, 0.2, 0.5
DAYS = 365.0
N_SUBJECTS = 4
N_SAMPLES = 40


class Rate(eqx.Module):
    k: jax.Array


def simulate(predictors, ts, covariates, y0, solver):
    (kel,) = predictors

    def vf(t, y, args):
        return jnp.stack([-(kel.k + K12) * y[0] + K21 * y[1], K12 * y[0] - K21 * y[1]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def central(full):
    return full[:, :1]


def make_data(n_doses: int) -> hk.Dataset:
    rng = np.random.default_rng(0)
    ts = np.linspace(0.0, DAYS, N_SAMPLES)
    exps = []
    for i in range(N_SUBJECTS):
        times = np.linspace(0.0, DAYS, n_doses, endpoint=False) + 0.1 * i  # subject-specific
        jumps = [hk.StateJump(float(t), 0, add=1.0) for t in times]
        exps.append(
            hk.make_experiment(
                covariates={},
                channels={"C": hk.ChannelObs(ts, rng.uniform(0.1, 1.0, ts.size))},
                y0_fn=lambda c, ch: np.zeros(2),
                exp_id=f"s{i}",
                jumps=jumps,
            )
        )
    return hk.make_dataset(exps, output_channel_names=["C"])


def measure(step, predictors, bp, steps: int) -> float:
    """Seconds per bucket step (steady state)."""
    start = time.perf_counter()
    for _ in range(steps):
        out = step(predictors, bp, 1.0)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer counts: a smoke test")
    args = parser.parse_args()
    counts, steps, repeats = ((1, 10, 100), 3, 2) if args.quick else ((1, 10, 100, 1000), 5, 5)
    predictors = (Rate(jnp.asarray(0.4)),)
    steps_by_mode = {}
    for mode in ("forward", "reverse"):
        solver = hk.SolverConfig(
            solver=diffrax.Tsit5(),
            rtol=1e-6,
            atol=1e-9,
            max_steps=4096,
            dt0=None,
            sensitivity=mode,
        )
        steps_by_mode[mode] = hk.build_bucket_step(simulate, central, solver, hk.masked_mse, True)
    rows: dict[tuple[int, str], tuple[int, float, float, float]] = {}
    for n in counts:
        (bp,) = make_data(n).bucket_payloads
        slots = bp.jumps.ts.shape[1]
        for mode, step in steps_by_mode.items():
            print(f"{n} doses per subject ({slots} slots), {mode}: compiling ...", flush=True)
            t0 = time.perf_counter()
            jax.block_until_ready(step(predictors, bp, 1.0))
            compile_s = time.perf_counter() - t0
            times = []
            for r in range(repeats):
                times.append(measure(step, predictors, bp, steps))
                print(f"  repeat {r + 1}/{repeats}: {times[-1] * 1e3:.1f} ms / step", flush=True)
            rows[n, mode] = (slots, compile_s, min(times), statistics.median(times))

    print(
        "\n| doses / subject | slots | sensitivity | compile + first step (s) | ms / step (best) "
        "| median | ratio to 1 dose | ms per slot |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (n, mode), (slots, compile_s, best, median) in rows.items():
        base = rows[counts[0], mode][2]
        print(
            f"| {n} | {slots} | {mode} | {compile_s:.1f} | {best * 1e3:.1f} | {median * 1e3:.1f} "
            f"| {best / base:.2f}x | {best / slots * 1e3:.3f} |"
        )
    top = counts[-1]
    slot_growth = rows[top, "forward"][0] / rows[counts[0], "forward"][0]
    parts = []
    for mode in steps_by_mode:
        growth = rows[top, mode][2] / rows[counts[0], mode][2]
        verdict = "at most linear" if growth <= 1.1 * slot_growth else "MORE than linear"
        parts.append(f"{mode} {growth:.1f}x ({verdict})")
    print(
        f"\nsummary: {top} doses per subject cost " + ", ".join(parts) + " the 1-dose step for "
        f"{slot_growth:.0f}x the padded slots; {N_SUBJECTS} subjects x {N_SAMPLES} samples, "
        f"{steps} steps x {repeats} repeats, jax {jax.__version__}, {jax.devices()[0].platform}"
    )


if __name__ == "__main__":
    main()
