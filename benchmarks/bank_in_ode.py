"""The confluent bank's cost inside an ODE, against a 1-16-16-1 tanh MLP as the learned term.

Workload (issue 24, item 3): the integration example's problem (`examples/hybrid_problem.py`:
`dy/dt = -K y + g(y)`, 36 experiments of 8, 12 and 16 points, float64, Tsit5 with rtol 1e-8,
atol 1e-10), trained through `hybrid_kernels.train_with_optax` (one phase of Adam(W), lr 0.02,
`verbose=False`) with the learned term `g` one of:

- `mlp`: an `eqx.nn.MLP(1, 1, 16, 2, tanh)` (the baseline; weights scaled by 0.1);
- `bank`: the example's bank, 6 ordinary order-0 atoms (8 slots, `max_order=3`,
  `max_pairs=1`), its scales frozen, trained with the example's hook (it retracts `rho` after
  every step);
- `bank+pair`: the same bank after one centred-pair commit (the best merge
  `detect_transitions` finds), made before training;
- `bank+pair/unbounded`: the same, the bank built with `max_pairs=None` (the pair formulas on
  every slot, as every bank evaluated them before `max_pairs`);
- `bank+moments`: the same bank after a truncated-moment commit (the two closest atoms to one
  order-3 moment slot), made before training;
- `bank+moments/unbounded`: the same, the bank built with `max_pairs=None`: what a default
  bank holds after `TransitionHook.growing` merged two atoms (its default `merge_into`);
- `bank/no-pairs`, `bank+moments/no-pairs`: `bank` and `bank+moments` built with
  `max_pairs=0`, a bank that holds no pair and so compiles no pair code.

Every run is a fresh Python process (nothing shared: compile caches, imports), the variants
alternated run by run so that load drift hits all alike. The data are computed once by the
driver and read by each worker, so no worker compiles the true solution.

Measured per run: **first step**, the seconds from just after the imports (model, data and
trainer built inside the window, so the compile is included) to the first loss on the host;
**steady step**, the median step time after a warm-up of a fifth of the steps; both also in
process CPU time (all threads), which other processes' load disturbs much less than wall time;
and the mean accepted solver steps per trajectory (the step time depends on it). Reported:
medians over runs and their ratios to the MLP. Targets: every bank <= 1.0x the MLP's steady
step and <= 1.2x its first step.

Run: `python benchmarks/bank_in_ode.py` (a few minutes), `--quick` for a smoke test (one run
of each, few steps), `--variants` to pick some.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import _fresh

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VARIANTS = (
    "mlp",
    "bank",
    "bank+pair",
    "bank+moments",
    "bank+pair/unbounded",
    "bank+moments/unbounded",
    "bank/no-pairs",
    "bank+moments/no-pairs",
)
LR = 0.02


# -- the worker: one process, one variant -----------------------------------------------------


def _worker(variant: str, data: str, steps: int) -> dict:
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    jax.config.update("jax_enable_x64", True)
    import confluent_bank as cb
    import confluent_bank.optax as cbo
    import hybrid_kernels as hk

    sys.path.insert(0, str(EXAMPLES))
    import hybrid_problem as P

    t_imported, cpu_imported = time.perf_counter(), time.process_time()
    stored = np.load(data)
    experiments = []
    for i in range(int(stored["count"])):
        ts, ys = stored[f"ts{i}"], stored[f"ys{i}"]
        experiments.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, ys)},
                y0_fn=lambda cov, ch, y0=float(ys[0]): jnp.asarray([y0]),
                exp_id=f"exp{i:03d}",
            )
        )
    dataset = hk.make_dataset(
        experiments, output_channel_names=["y"], dtype=jnp.float64, max_shapes=2
    )
    domain = P.data_range(dataset)
    hooks, trainable = None, None
    if variant == "mlp":
        mlp = eqx.nn.MLP(1, 1, 16, 2, activation=jax.nn.tanh, key=jax.random.key(0))
        mlp = jax.tree_util.tree_map(lambda x: x * 0.1 if eqx.is_inexact_array(x) else x, mlp)
        predictors = (mlp,)

        def simulate(predictors, ts, covariates, y0, solver):
            (net,) = predictors

            def vector_field(t, y, args):
                return -P.K * y + net(y)

            return solver.diffeqsolve(diffrax.ODETerm(vector_field), ts, y0).ys

    else:
        max_pairs = {"unbounded": None, "no-pairs": 0}.get(variant.partition("/")[2], 1)
        start = P.initial_bank(jnp.float64, max_pairs=max_pairs)
        bank = _committed(variant, start, domain, cb, cbo, optax)
        predictors, simulate = (bank,), P.simulate
        trainable = P.bank_trainable(predictors)
        hooks = P.transition_hook({}, domain)  # retracts rho after every step, as the tests
    stamps: list[tuple[float, float]] = []
    effort: list[float] = []
    hk.train_with_optax(
        predictors,
        dataset,
        hk.OptaxTrainingConfig(steps=(steps,), lr=(LR,), verbose=False),
        simulate_fn=simulate,
        state_to_output=P.state_to_output,
        solver=P.make_solver(jnp.float64),
        trainable=trainable,
        key=jax.random.key(0),
        ui=_Stamped(hk.TrainingUI(), stamps, effort),
        hooks=hooks,
    )
    warm = _fresh.warm_up(stamps)
    solver_steps = float(np.mean(effort[warm:])) if effort else float("nan")
    return {**_fresh.timings(stamps, (t_imported, cpu_imported)), "solver_steps": solver_steps}


def _committed(variant, bank, domain, cb, cbo, optax):
    """The example's bank, after the variant's commit (made as a trainer's hook makes it)."""
    import numpy as np

    if variant.partition("/")[0] == "bank":
        return bank
    import hybrid_problem as P

    if variant.startswith("bank+pair"):
        proposal = cb.detect_transitions(bank, P.collinearity_score)[0]
    else:
        centres, live = np.asarray(bank.centers), np.flatnonzero(np.asarray(bank.active))
        pairs = [(int(i), int(j)) for k, i in enumerate(live) for j in live[k + 1 :]]
        closest = min(pairs, key=lambda ij: abs(centres[ij[0]] - centres[ij[1]]))
        proposal = bank.propose_cluster(closest, order=bank.max_order, error_budget=1.0)
    state = optax.adamw(LR).init(bank.parameters)
    bank, _, accepted = cb.commit_transition(
        bank,
        proposal,
        state,
        between_steps=True,
        acceptance=lambda *_: True,  # a cost benchmark: the commit's size does not matter
        state_adapter=cbo.commit_adapter(),
    )
    assert accepted and variant.startswith("bank+pair") == (proposal.kind == "centered_pair")
    return bank


class _Stamped(_fresh.Stamped):
    """A display that notes the end of every step and the solver effort."""

    def __init__(self, inner, stamps: list, effort: list) -> None:
        super().__init__(inner, stamps)
        self._effort = effort

    def on_solver_steps(self, *, step: int, per_bucket) -> None:
        # mean accepted steps per trajectory, averaged over buckets
        self._effort.append(sum(b[0] for b in per_bucket) / len(per_bucket))
        self._inner.on_solver_steps(step=step, per_bucket=per_bucket)


# -- the driver ------------------------------------------------------------------------------


def _write_data(path: str) -> None:
    """The example's 36 noise-free experiments (one compile of the true solution, here)."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(EXAMPLES))
    import hybrid_problem as P

    arrays = {}
    experiments = P.make_experiments(P.ProblemSize())
    for i, experiment in enumerate(experiments):
        channel = experiment.channels["y"]
        arrays[f"ts{i}"], arrays[f"ys{i}"] = np.asarray(channel.ts), np.asarray(channel.values)
    np.savez(path, count=len(experiments), **arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of each, few steps")
    parser.add_argument("--runs", type=int, default=None, help="fresh processes per variant")
    parser.add_argument("--steps", type=int, default=None, help="steps per run")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _fresh.print_worker(_worker(args.worker, args.data, args.steps))
        return
    runs = args.runs or (1 if args.quick else 3)
    steps = args.steps or (10 if args.quick else 60)
    variants = ["mlp"] + [v for v in args.variants if v != "mlp"]
    _fresh.load_average("start")
    print(f"{runs} fresh processes per variant, {steps} steps each", flush=True)
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.npz")
        _write_data(data)
        for r in range(runs):
            for variant in variants if r % 2 == 0 else variants[::-1]:  # alternate the order
                res = _fresh.run_worker(__file__, variant, "--data", data, "--steps", str(steps))
                rows[variant].append(res)
                line = _fresh.run_line(r + 1, runs, variant, 13, res)
                print(f"{line}  solver steps {res['solver_steps']:.1f}", flush=True)
    medians = _fresh.medians(rows)
    _fresh.ratio_table(f"median of {runs}", medians, "mlp", extra="solver_steps")
    print()
    _fresh.load_average("end")
    for variant, m in medians.items():
        if variant == "mlp":
            continue
        r = _fresh.ratios(m, medians["mlp"])
        verdict = _fresh.verdict(r, first=1.2, steady=1.0)
        print(
            f"summary ({variant}): {r['first']:.2f}x the MLP's wall time to the first step "
            f"(target <= 1.2; CPU time {r['first_cpu']:.2f}x), {r['steady']:.2f}x per steady "
            f"step (target <= 1.0; CPU time {r['cpu']:.2f}x): {verdict} the wall-time targets"
        )


if __name__ == "__main__":
    main()
