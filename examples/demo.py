"""The main job: a confluent bank learns the unknown term of an ODE, with transitions.

    dy/dt = -K y + g(y),   g unknown, learned by a ConfluentPackBank inside the vector field

Many experiments (several initial states and time-axis lengths, so several bucket shapes) are
fitted with ``hybrid_kernels.train_with_optax``. Between optimiser steps
``confluent_bank.TransitionHook`` commits bank transitions: the two most collinear atoms merge
exactly into a centred pair, a zero-output atom is born in a free slot, the tightest remaining
pair of atoms becomes one moment slot under an error budget, and the pair is offered its
derivative limit (accepted only if provably within the budget). The optax Adam state is
carried through every commit; nothing recompiles.

    python examples/demo.py                 # about 30 s on a 2-core CPU
    python examples/demo.py --scale 8       # more experiments, longer horizons (for a GPU)
    DEMO_SCALE=8 nox -s demo                # the same through nox
    python examples/demo.py --processes 2   # two local processes joined by jax.distributed

With ``--processes N`` the demo starts N workers of itself on 127.0.0.1 (CPU, gloo
collectives), each loading only its own share of the experiments (``process_local=True``).
Process 0 prints and writes the outputs; see the docs page "Several processes and machines".

Writes ``demo-output/``: ``fit.png``, ``learned_term.png``, ``history.png``, ``summary.json``
and ``bank.json`` (the trained bank's validated checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

import confluent_bank as cb
import hybrid_kernels as hk

import hybrid_problem as P


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=int,
        default=int(os.environ.get("DEMO_SCALE", "1")),
        help="multiply the number of experiments and the horizon (env DEMO_SCALE; default 1)",
    )
    parser.add_argument("--steps", type=int, default=400, help="optimiser steps in all")
    parser.add_argument("--float32", action="store_true", help="train in float32")
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="output folder")
    parser.add_argument(
        "--processes", type=int, default=1, help="train as this many local JAX processes"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "host:port,id"
    return parser.parse_args()


def _launch_workers(n: int) -> None:
    """Run this script as `n` workers joined on 127.0.0.1; exit with the first failure."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    workers = [
        subprocess.Popen([sys.executable, *sys.argv, "--worker", f"{coordinator},{i}"], env=env)
        for i in range(n)
    ]
    codes = [w.wait() for w in workers]
    failed = [c for c in codes if c != 0]
    raise SystemExit(failed[0] if failed else 0)


def _join(worker: str, n: int) -> None:
    coordinator, process_id = worker.rsplit(",", 1)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=n, process_id=int(process_id))


def _value_range(experiments) -> tuple[float, float]:
    values = [np.asarray(e.channels["y"].values) for e in experiments]
    return float(min(v.min() for v in values)), float(max(v.max() for v in values))


def _plan(steps: int) -> dict[int, str]:
    at = lambda fraction: max(1, round(fraction * steps))  # noqa: E731
    return {at(0.35): "pair", at(0.45): "birth", at(0.55): "cluster", at(0.8): "derivative"}


def _plot_learned_term(bank, domain, path: Path) -> None:
    import matplotlib.pyplot as plt

    y = jnp.linspace(domain[0] - 0.25, domain[1] + 0.25, 400, dtype=bank.centers.dtype)
    terms = np.asarray(bank.slot_terms(y))
    active = np.asarray(bank.active)
    modes = np.asarray(bank.modes)
    names = {0: "ordinary", 1: "centred pair", 2: "moments"}
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    for i in np.flatnonzero(active):
        ax.plot(y, terms[i], lw=1, alpha=0.35, label=f"slot {i}: {names[int(modes[i])]}")
    ax.plot(y, P.true_g(y), "k--", lw=2.2, label="true g(y)")
    ax.plot(y, bank.forward(y), color="C3", lw=2.2, label="bank(y)")
    ax.axvspan(*domain, color="0.92", zorder=-1, label="observed range")
    ax.set_xlabel("y")
    ax.set_ylabel("g(y)")
    ax.set_title("Learned term: the bank against the true g, each slot's atom faint")
    ax.legend(fontsize=7, ncol=2, loc="best")
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _plot_history(history, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax = hk.plot_history(history)  # marks the hook's events (history.events)
    ax.set_title("Training loss, transitions marked")
    ax.figure.savefig(path, dpi=130)
    plt.close(ax.figure)


def _summary_table(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="demo summary", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("experiments / bucket shapes", f"{summary['experiments']} / {summary['buckets']}")
    table.add_row("processes / devices", f"{summary['processes']} / {len(summary['devices'])}")
    table.add_row("loss at start", f"{summary['loss_start']:.3e}")
    table.add_row("loss at end (best)", f"{summary['loss_best']:.3e}")
    table.add_row("loss reduction", f"{summary['loss_start'] / summary['loss_best']:.0f}x")
    table.add_row("max |bank(y) - g(y)| on data", f"{summary['g_error']:.3e}")
    committed = [e["kind"] for e in summary["transitions"] if e["accepted"]]
    rejected = [e["kind"] for e in summary["transitions"] if not e["accepted"]]
    table.add_row("transitions committed", ", ".join(committed) or "none")
    table.add_row("transitions rejected", ", ".join(rejected) or "none")
    table.add_row("simulate_fn traces (compiles)", str(summary["simulate_traces"]))
    table.add_row("wall time", f"{summary['wall_time_s']:.1f} s")
    Console().print(table)


def main() -> None:
    args = _arguments()
    if args.processes > 1 and args.worker is None:
        _launch_workers(args.processes)
    if args.worker is not None:
        _join(args.worker, args.processes)
    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.float32 if args.float32 else jnp.float64
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    size = P.ProblemSize(
        n_experiments=32 * args.scale,
        lengths=tuple(n * args.scale for n in (8, 12, 16, 20)),
        t_end=3.0 * (1 + 0.25 * (args.scale - 1)),
    )
    lead = jax.process_index() == 0
    if lead:
        print(f"devices: {jax.devices()}  dtype: {jnp.dtype(dtype).name}  scale: {args.scale}")
    experiments = P.make_experiments(size)
    domain = _value_range(experiments)  # from every experiment, so all processes agree
    n, me, count = len(experiments), jax.process_index(), jax.process_count()
    mine = experiments[me * n // count : (me + 1) * n // count]
    dataset = hk.make_dataset(
        mine, output_channel_names=["y"], dtype=dtype, max_shapes=2, process_local=count > 1
    )
    if count == 1:
        print(hk.describe_buckets(dataset))

    hook = P.transition_hook(_plan(args.steps), domain, error_budget=1e-3)
    simulate = P.TraceCounter(P.simulate)
    first = args.steps // 2
    history, bank = P.run_standard(
        dataset,
        dtype=dtype,
        hooks=hook,
        simulate_fn=simulate,
        steps=(first, args.steps - first),
        verbose=True,
        log_every=5,
    )
    wall = time.perf_counter() - started

    # The last optimiser step may leave a spread slightly negative; save_checkpoint then saves
    # bank.retract(), which represents the same function.
    cb.save_checkpoint(out / "bank.json", bank)  # every process calls; 0 writes
    if not lead:
        return
    if count > 1:
        # plot_fit on the global dataset would gather it, a collective every process joins;
        # process 0 plots alone from a local copy instead (the trained bank is replicated).
        bank = jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, bank)
        local = hk.make_row_mesh(jax.local_devices())
        dataset = P.make_dataset(size, dtype=dtype, mesh=local)
    solver = P.make_solver(dtype)
    fig = hk.plot_fit(
        (bank,),
        dataset,
        simulate_fn=P.simulate,
        state_to_output=P.state_to_output,
        solver=solver,
        exp_ids=[ids[0] for ids in dataset.exp_ids] + [ids[-1] for ids in dataset.exp_ids],
    )
    fig.savefig(out / "fit.png", dpi=110)
    _plot_learned_term(bank, domain, out / "learned_term.png")
    _plot_history(history, out / "history.png")
    predictions = hk.predict_dataset((bank,), dataset, P.simulate, P.state_to_output, solver)
    metrics = hk.compute_metrics(predictions, dataset)

    summary = {
        "experiments": size.n_experiments,
        "buckets": len(dataset.bucket_payloads),
        "dtype": jnp.dtype(dtype).name,
        "processes": jax.process_count(),
        "devices": [str(d) for d in jax.devices()],
        "loss_start": float(history[0]),
        "loss_best": float(min(history)),
        "g_error": P.g_error(bank, domain),
        "domain": list(domain),
        "transitions": [
            {name: e[name] for name in ("step", "kind", "accepted", "max_change")}
            for e in history.events
        ],
        "metrics": {name: m._asdict() for name, m in metrics.items()},
        "simulate_traces": simulate.count,
        "wall_time_s": wall,
        "bank_checkpoint": str(out / "bank.json"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _summary_table(summary)
    Console().print(hk.rich_metrics_table(metrics, title="fit metrics (every experiment)"))
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}/")
    if not any(e["accepted"] for e in history.events):
        raise SystemExit("no transition was committed")


if __name__ == "__main__":
    main()
