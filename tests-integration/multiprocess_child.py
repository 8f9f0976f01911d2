"""One process of the multi-process tests (run by `_launch`, not collected).

Joins `jax.distributed` on the coordinator it is given (a single process with `--processes 1`
skips that), trains a short float64 run of the standard problem with a confluent bank inside
the ODE and planned transitions, predicts every experiment and scores it (per channel and per
experiment: every process should get the global result), with `--grow` then grows a bank
from two atoms by the growing hook on the same data, and writes what the tests compare
to `<out>/result-<process id>.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

# A commit needs a few steps of training first; both commits are function-preserving.
PLAN = {6: "birth", 12: "pair"}
STEPS = (10, 10)
GROW_EVERY = 4  # with --grow: births at steps 8 and 16 (the check after a birth waits)
HEARTBEAT_SECONDS = 10  # how long a lost peer goes unnoticed by the coordination service


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--process-local", action="store_true")
    parser.add_argument("--gloo", action="store_true", help="join the runtime even when alone")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--bank-file", default=None)
    parser.add_argument("--die-at", type=int, default=None, help="process 1 exits at this step")
    parser.add_argument("--jumps", action="store_true", help="give each experiment state jumps")
    parser.add_argument("--grow", action="store_true", help="then grow a bank from two atoms")
    return parser.parse_args()


class _Die:
    """A hook that kills process 1 at `step`, as a crashed machine would (no cleanup)."""

    def __init__(self, inner, step: int):
        self.inner, self.step = inner, step
        self.events = inner.events

    def between_steps(self, step, predictors, opt_state):
        if step == self.step and jax.process_index() == 1:
            sys.stdout.flush()
            os._exit(17)
        return self.inner.between_steps(step, predictors, opt_state)


def _value_range(experiments) -> tuple[float, float]:
    values = [np.asarray(e.channels["y"].values) for e in experiments]
    return float(min(v.min() for v in values)), float(max(v.max() for v in values))


def _with_jumps(hk, experiments):
    """Sample withdrawals (`y <- 0.95 y`): one for the first half of the experiments, nine for
    the second, so process-local halves pad to different jump counts unless they agree."""
    out = []
    for i, e in enumerate(experiments):
        n = 1 if i < len(experiments) // 2 else 9
        jumps = [hk.StateJump(0.2 + 0.15 * k + 0.01 * i, 0, scale=0.95) for k in range(n)]
        y0 = np.asarray(e.y0)
        out.append(
            hk.make_experiment(
                covariates={},
                channels=e.channels,
                y0_fn=lambda cov, ch, y0=y0: y0,
                exp_id=e.exp_id,
                jumps=jumps,
            )
        )
    return out


def _grow(dataset, domain) -> dict:
    """The same training, from two atoms grown by `TransitionHook.growing`: its decisions
    come from the objective of the global dataset, on every process."""
    import jax.numpy as jnp

    import confluent_bank as cb

    import hybrid_problem as P

    start = P.two_broad_atoms(jnp.float64)
    hook = P.growing_hook(
        dataset, start, dtype=jnp.float64, domain=domain,
        every=GROW_EVERY, plateau=math.inf, max_active=None,
    )  # fmt: skip
    history, bank = P.run_standard(
        dataset, dtype=jnp.float64, hooks=hook, bank=start, steps=STEPS, lr=(0.05, 0.02)
    )
    return dict(
        grown_history=[float(x) for x in history],
        grown_events=[(e.step, e.kind, e.accepted) for e in hook.events],
        grown_digest=cb.snapshot_digest(bank.portable_snapshot()),
    )


def main() -> None:
    args = _arguments()
    if args.processes > 1 or args.gloo:
        jax.distributed.initialize(
            args.coordinator,
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=60,
            heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
        )
    import jax.numpy as jnp

    import confluent_bank as cb
    import hybrid_kernels as hk

    import hybrid_problem as P

    # Tiny: one bucket shape, so one compiled kernel, on a shared 2-core CI machine.
    size = P.ProblemSize(n_experiments=8, lengths=(8, 12))

    every = P.make_experiments(size)
    if args.jumps:
        every = _with_jumps(hk, every)
    # The domain of the transition policy is global, so every process decides alike.
    domain = _value_range(every)
    experiments = every
    if args.process_local:
        # Contiguous halves: the same rows land on the same devices as in the full-list run.
        n, p, count = len(every), jax.process_index(), jax.process_count()
        experiments = every[p * n // count : (p + 1) * n // count]
    dataset = P.hk.make_dataset(
        experiments,
        output_channel_names=["y"],
        dtype=jnp.float64,
        max_shapes=1,
        **({"process_local": True} if args.process_local else {}),
    )
    hook = P.transition_hook(PLAN, domain, error_budget=1e-3)
    hooks = hook if args.die_at is None else _Die(hook, args.die_at)
    overrides = dict(steps=STEPS, lr=(0.05, 0.02), log_every=1, verbose=args.verbose)
    if args.checkpoint:
        overrides.update(checkpoint_path=args.checkpoint, checkpoint_every=args.checkpoint_every)
    started = time.monotonic()
    result: dict = {"process": jax.process_index(), "processes": jax.process_count()}
    try:
        history, bank = P.run_standard(dataset, dtype=jnp.float64, hooks=hooks, **overrides)
    except Exception as error:
        result.update(error=f"{type(error).__name__}: {error}", seconds=time.monotonic() - started)
        Path(args.out, f"result-{args.process_id}.json").write_text(json.dumps(result))
        raise
    if args.bank_file:
        cb.save_checkpoint(args.bank_file, bank)
        result["reloaded_digest"] = cb.snapshot_digest(
            cb.load_checkpoint(args.bank_file).portable_snapshot()
        )
        # A run folder (several files written as one unit) goes through the same single writer.
        run = Path(args.bank_file).with_name("run")
        solver, config = P.make_solver(jnp.float64), P.standard_config()
        hk.save_run(run, bank, solver=solver, config=config)
        result["run_digest"] = cb.snapshot_digest(
            hk.load_run(run, bank).predictors.portable_snapshot()
        )
    # Called on every process: the rows spread over the processes are gathered.
    predictions = hk.predict_dataset(
        (bank,), dataset, P.simulate, P.state_to_output, P.make_solver(jnp.float64)
    )
    # Dense curves read rows one by one: the buckets are gathered first, on every process.
    dense = hk.predict_dense(
        (bank,), dataset, P.simulate, P.state_to_output, P.make_solver(jnp.float64), n_points=5
    )
    result["dense"] = [np.asarray(pred).tolist() for _, pred in dense]
    if args.process_local:
        try:
            hk.split_dataset_by_ids(dataset, [dataset.experiments[0].exp_id])
        except ValueError as error:
            result["split_error"] = str(error)
    per_experiment = hk.metrics_table(
        hk.predictions_table(dataset, predictions), by=("experiment", "variable")
    )
    result.update(
        metrics={name: m._asdict() for name, m in hk.compute_metrics(predictions, dataset).items()},
        experiment_metrics=per_experiment[["experiment", "n", "mse"]].values.tolist(),
        devices=jax.device_count(),
        local_devices=jax.local_device_count(),
        history=[float(x) for x in history],
        events=[(e.step, e.kind, e.accepted) for e in hook.events],
        digest=cb.snapshot_digest(bank.portable_snapshot()),
        exp_ids=[list(ids) for ids in dataset.exp_ids],
        seconds=time.monotonic() - started,
    )
    if args.grow:
        result.update(_grow(dataset, domain))
    Path(args.out, f"result-{args.process_id}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
