"""Training-kernel benchmark: hybrid_kernels against a hand-written floor and the exact policy.

Workloads: 64 experiments with 50/100/200 points ("three lengths"), and 64 experiments of 64
distinct lengths between 50 and 200 ("distinct lengths"). Models: logistic growth with one
rate, an oscillator whose damping is a 1-16-16-1 MLP of the velocity (322 scalars), a 4-rate
Lotka-Volterra model, and a confluent bank of 8 slots inside an ODE (88 scalars; needs the
`confluent-bank` package too).

Measured, each against a baseline timed in the same run:

- steady-state full step (every bucket's (loss, grads), the combination, a penalty, one
  update) against (a) the floor: a hand-written `eqx.filter_jit(eqx.filter_value_and_grad(...))`
  of a vmapped diffrax solve per bucket plus one jitted optax update;
- time to the first full step (trace + compile + run) on the distinct-length data, against
  (b) the "exact" bucket policy (one compiled shape per distinct length);
- the forward-only score sweep, against the steady-state full step;
- time to the first step in a second process with JAX's persistent compilation cache, against
  the first process (kernels built with `SolverConfig(throw=False)`);
- `sensitivity`: ours with `SolverConfig(sensitivity="auto")` (and, with `--sensitivities`,
  forced "forward"/"reverse") against the floor with diffrax's default adjoint
  (`RecursiveCheckpointAdjoint`, the reference of these ratios) and with `DirectAdjoint`:
  cold first full step (fresh processes) and steady full step, with the mode "auto" chose;
- `crossover`: forward against reverse `bucket_step` as the trainable scalars grow (the
  oscillator with a 1-w-1 damping MLP), which is where "auto" switches.

Run: `python benchmarks/kernels.py` (about 20 minutes on a 2-core CPU) or `--quick` (a smoke
test of a minute or two: compiling even the smallest ODE kernel takes seconds). `--parts`
picks measurements, `--max-shapes` the padded policy's bound, `--adjoint recursive` diffrax's
default adjoint instead of `DirectAdjoint`, `--exact-shapes 64` compiles every exact shape
instead of extrapolating from a sample. Every first-step time comes from a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import hybrid_kernels as hk

# --- models ------------------------------------------------------------------------------


class Logistic(eqx.Module):
    rate: jax.Array


class DampedOscillator(eqx.Module):
    omega: jax.Array
    damping: eqx.nn.MLP


def logistic_simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors

    def vf(t, y, args):
        return p.rate * y * (1 - y / covariates["capacity"])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def oscillator_simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors

    def vf(t, y, args):
        x, v = y[0], y[1]
        return jnp.stack([v, -(p.omega**2) * x - p.damping(v[None])[0]])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def first_component(state):
    return state[:, :1]


def logistic_model():
    def experiment(i, n_points, rng):
        cap = rng.uniform(1.0, 2.0)
        ts = np.linspace(0.0, 10.0, n_points)
        ys = cap / (1 + (cap / 0.1 - 1) * np.exp(-0.8 * ts)) + rng.normal(0, 0.01, n_points)
        return hk.make_experiment(
            covariates={"capacity": cap},
            channels={"y": hk.ChannelObs(ts, ys)},
            y0_fn=lambda cov, ch: jnp.array([0.1]),
            exp_id=f"e{i}",
        )

    return experiment, (Logistic(jnp.asarray(0.5)),), logistic_simulate


def oscillator_model():
    def experiment(i, n_points, rng):
        x0 = rng.uniform(0.5, 1.5)
        ts = np.linspace(0.0, 10.0, n_points)
        xs = x0 * np.exp(-0.1 * ts) * np.cos(ts) + rng.normal(0, 0.01, n_points)
        return hk.make_experiment(
            covariates={"x0": x0},
            channels={"x": hk.ChannelObs(ts, xs)},
            y0_fn=lambda cov, ch: jnp.stack([cov["x0"], 0.0 * cov["x0"]]),
            exp_id=f"e{i}",
        )

    mlp = eqx.nn.MLP(1, 1, 16, 2, activation=jax.nn.tanh, key=jax.random.key(0))
    mlp = jax.tree_util.tree_map(lambda x: x * 0.1 if eqx.is_inexact_array(x) else x, mlp)
    return experiment, (DampedOscillator(jnp.asarray(0.8), mlp),), oscillator_simulate


class LotkaVolterra(eqx.Module):
    alpha: jax.Array
    beta: jax.Array
    gamma: jax.Array
    delta: jax.Array


def lotka_volterra_simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors

    def vf(t, y, args):
        prey, predator = y[0], y[1]
        return jnp.stack(
            [
                p.alpha * prey - p.beta * prey * predator,
                p.delta * prey * predator - p.gamma * predator,
            ]
        )

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def lotka_volterra_model():
    def experiment(i, n_points, rng):
        x0 = rng.uniform(0.8, 1.2)
        ts = np.linspace(0.0, 10.0, n_points)
        xs = x0 * (1 + 0.3 * np.sin(1.1 * ts)) + rng.normal(0, 0.01, n_points)
        return hk.make_experiment(
            covariates={"x0": x0},
            channels={"x": hk.ChannelObs(ts, xs)},
            y0_fn=lambda cov, ch: jnp.stack([cov["x0"], 0.5 + 0.0 * cov["x0"]]),
            exp_id=f"e{i}",
        )

    rates = LotkaVolterra(*(jnp.asarray(v) for v in (1.1, 0.4, 0.4, 0.1)))
    return experiment, (rates,), lotka_volterra_simulate


def bank_simulate(predictors, ts, covariates, y0, solver):
    (bank,) = predictors

    def vf(t, y, args):
        return -0.6 * y + bank.forward(y)

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def bank_model():
    import confluent_bank as cb  # the benchmark's one use of the other package

    def experiment(i, n_points, rng):
        x0 = rng.uniform(-2.0, 2.0)
        ts = np.linspace(0.0, 3.0, n_points)
        xs = x0 * np.exp(-0.4 * ts) + rng.normal(0, 0.01, n_points)
        return hk.make_experiment(
            covariates={"x0": x0},
            channels={"x": hk.ChannelObs(ts, xs)},
            y0_fn=lambda cov, ch: jnp.reshape(cov["x0"], (1,)),
            exp_id=f"e{i}",
        )

    centres, weights = np.linspace(-1.5, 1.5, 6), 0.05 * np.array([1, -1, 1, -1, 1, -1.0])
    packs = [
        cb.RefinedPack(0, float(c), float(w), 2.0) for c, w in zip(centres, weights, strict=True)
    ]
    bank = cb.init_confluent_bank(packs, max_packs=8, max_order=3)
    return experiment, (bank,), bank_simulate


class Width(eqx.Module):
    omega: jax.Array
    damping: eqx.nn.MLP


def width_model(width):
    """The oscillator with a 1-`width`-1 damping MLP: `3 * width + 2` trainable scalars."""

    def model():
        experiment, _, _ = oscillator_model()
        mlp = eqx.nn.MLP(1, 1, width, 1, activation=jax.nn.tanh, key=jax.random.key(0))
        mlp = jax.tree_util.tree_map(lambda x: x * 0.1 if eqx.is_inexact_array(x) else x, mlp)
        return experiment, (DampedOscillator(jnp.asarray(0.8), mlp),), oscillator_simulate

    return model


MODELS = {
    "logistic": logistic_model,
    "oscillator": oscillator_model,
    "lotka_volterra": lotka_volterra_model,
    "bank": bank_model,
}
BENCH_MODELS = tuple(MODELS)
PARTS = ("steady", "distinct", "cache", "sensitivity", "crossover")
QUICK = {
    "models": ["logistic"],
    "n_experiments": 4,
    "lengths": [5, 10, 20],
    "reps": 3,
    "exact_shapes": 2,
    "max_shapes": 1,
    # The cache test is two more cold processes, the crossover a dozen more compiles.
    "parts": ["steady", "distinct", "sensitivity"],
}
CROSSOVER_WIDTHS = (1, 2, 4, 6, 10, 21)  # 5, 8, 14, 20, 32 and 65 trainable scalars
for _w in CROSSOVER_WIDTHS:
    MODELS[f"width{_w}"] = width_model(_w)


def make_experiments(model, lengths, seed=0):
    experiment, _, _ = MODELS[model]()
    rng = np.random.default_rng(seed)
    return [experiment(i, n, rng) for i, n in enumerate(lengths)]


ADJOINTS = {"direct": diffrax.DirectAdjoint, "recursive": diffrax.RecursiveCheckpointAdjoint}


def solver_config(adjoint="direct", throw=True, sensitivity="auto"):
    return hk.SolverConfig(
        diffrax.Tsit5(),
        rtol=1e-5,
        atol=1e-7,
        max_steps=4096,
        dt0=0.01,
        adjoint=ADJOINTS[adjoint](),
        throw=throw,
        sensitivity=sensitivity,
    )


class Recorded:
    """`simulate_fn` that records the sensitivity each trace resolved (what "auto" chose)."""

    def __init__(self, fn):
        self.fn, self.modes = fn, set()

    def __call__(self, predictors, ts, covariates, y0, solver):
        self.modes.add(solver.sensitivity)
        return self.fn(predictors, ts, covariates, y0, solver)


def n_trainable(predictors):
    leaves = jax.tree_util.tree_leaves(eqx.filter(predictors, eqx.is_inexact_array))
    return int(sum(x.size for x in leaves))


def l2(predictors, points):
    leaves = jax.tree_util.tree_leaves(eqx.filter(predictors, eqx.is_inexact_array))
    return sum(jnp.sum(x**2) for x in leaves)


# --- the two ways to write a step ---------------------------------------------------------


def ours(model, dataset, solver):
    """A full step composed from hybrid_kernels' public kernels; returns (step, score_sweep).

    Composed as the custom-loop guide recommends: one `bucket_step` dispatch per bucket, then
    the per-step pieces (`combine_bucket_grads`, `penalty_step`, `apply_update`) called inside
    one `eqx.filter_jit`, so the step ends in a single dispatch, as the floor's does.
    """
    _, predictors, simulate = MODELS[model]()
    trainable = hk.trainable_mask(predictors)
    optimizer = optax.adam(1e-3)
    recorded = Recorded(simulate)
    bucket_step = hk.build_bucket_step(recorded, first_component, solver, hk.masked_mse, trainable)
    score_bucket = hk.build_score_bucket(simulate, first_component, solver, hk.masked_mse)
    penalty_step = hk.build_penalty_step(l2, trainable)
    apply_update = hk.build_apply_update(optimizer, trainable)
    weights = hk.bucket_weights(dataset, "per_bucket")
    state = {"p": predictors, "opt": optimizer.init(eqx.filter(predictors, trainable))}
    penalty_weight = jnp.asarray(1e-6)
    fraction = jnp.asarray(1.0, dtype=jnp.result_type(float))  # made once, not per call

    @eqx.filter_jit
    def tail(predictors, losses, grads, opt_state):
        loss, grads = hk.combine_bucket_grads(losses, grads, weights)
        _, pgrads = penalty_step(predictors, penalty_weight)
        grads = jax.tree_util.tree_map(jnp.add, grads, pgrads)
        return loss, *apply_update(predictors, grads, opt_state)

    def step():
        results = [bucket_step(state["p"], bp, fraction) for bp in dataset.bucket_payloads]
        losses, grads = tuple(r[0] for r in results), tuple(r[1] for r in results)
        loss, state["p"], state["opt"] = tail(state["p"], losses, grads, state["opt"])
        jax.block_until_ready((loss, state["p"], state["opt"]))  # as the floor: everything
        return loss

    def sweep():
        losses = [score_bucket(state["p"], bp, fraction) for bp in dataset.bucket_payloads]
        return jax.block_until_ready(losses)

    step.modes = recorded.modes  # filled when bucket_step is traced
    return step, sweep


def floor(model, dataset, solver):
    """The hand-written floor: filter_jit(filter_value_and_grad) per bucket, one jitted update."""
    _, predictors, simulate = MODELS[model]()
    optimizer = optax.adam(1e-3)

    @eqx.filter_jit
    @eqx.filter_value_and_grad
    def bucket_loss(params, bp):
        full = jax.vmap(lambda t, c, y: simulate(params, t, c, y, solver))(
            bp.ts, bp.covariates, bp.y0
        )
        pred = full[..., :1]
        sq = jnp.where(bp.mask, (pred - bp.y_observed) ** 2, 0.0)
        return sq.sum() / jnp.maximum(bp.mask.sum(), 1)

    @eqx.filter_jit
    def update(params, grads, opt_state):
        grads = jax.tree_util.tree_map(lambda *g: sum(g) / len(g), *grads)
        pen = eqx.filter_grad(lambda p: 1e-6 * l2(p, ()))(params)
        grads = jax.tree_util.tree_map(jnp.add, grads, pen)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state

    state = {"p": predictors, "opt": optimizer.init(eqx.filter(predictors, eqx.is_inexact_array))}

    def step():
        results = [bucket_loss(state["p"], bp) for bp in dataset.bucket_payloads]
        grads = tuple(r[1] for r in results)
        state["p"], state["opt"] = update(state["p"], grads, state["opt"])
        # Wait for everything, the update included: work left running would be timed in the
        # next (interleaved) variant's step instead of this one.
        jax.block_until_ready((results, state["p"], state["opt"]))
        return results[0][0]

    return step


# --- measurement --------------------------------------------------------------------------


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def log(msg):
    print(msg, flush=True)


def three_lengths(args):
    return [args.lengths[i % 3] for i in range(args.n_experiments)]


def distinct_lengths(args):
    lengths = np.linspace(min(args.lengths), max(args.lengths), args.n_experiments)
    lengths = lengths.round().astype(int).tolist()
    assert len(set(lengths)) == len(lengths), "the distinct workload needs distinct lengths"
    return lengths


def dataset_for(model, lengths, policy, max_shapes):
    channel = ("y",) if model == "logistic" else ("x",)  # every other model observes "x"
    return hk.make_dataset(
        make_experiments(model, lengths),
        output_channel_names=channel,
        bucket_policy=policy,
        max_shapes=max_shapes,
    )


def first_step_child(spec):
    """In a fresh process: build the kernels and run one full step; print the seconds taken.

    A fresh process per measurement is the only fair cold start: in one process, JAX's
    in-memory caches would hand a later measurement work an earlier one already did.
    """
    if spec.get("cache_dir"):
        jax.config.update("jax_compilation_cache_dir", spec["cache_dir"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    data = dataset_for(spec["model"], spec["lengths"], spec["policy"], spec["max_shapes"])
    if spec.get("pick") is not None:
        data = eqx.tree_at(
            lambda d: d.bucket_payloads, data, tuple(data.bucket_payloads[i] for i in spec["pick"])
        )
    solver = solver_config(
        spec["adjoint"], throw=spec.get("throw", True), sensitivity=spec.get("sensitivity", "auto")
    )
    start = time.perf_counter()
    if spec.get("kind") == "floor":
        step, modes = floor(spec["model"], data, solver), ["reverse"]
    else:
        step, _ = ours(spec["model"], data, solver)
        modes = step.modes
    step()
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "n_shapes": len(data.bucket_payloads), "modes": sorted(modes)}
    print(json.dumps(out))


def cold_first_step(**spec):
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_steady(model, args, rows):
    common = {"model": model, "adjoint": args.adjoint, "max_shapes": args.max_shapes}
    three = three_lengths(args)
    log(f"\n[{model}] three lengths {sorted(set(three))}, {args.n_experiments} experiments")
    data = dataset_for(model, three, "padded", args.max_shapes)
    solver = solver_config(args.adjoint)
    step, sweep = ours(model, data, solver)
    base = floor(model, data, solver)
    log("  compiling ours and the floor in this process ...")
    for _ in range(3):  # compile, then settle both
        step(), base(), sweep()
    ours_t, floor_t, sweep_t = [], [], []
    for _ in range(args.reps):  # interleaved, so load on a shared CPU hits both alike
        ours_t.append(timed(step))
        floor_t.append(timed(base))
        sweep_t.append(timed(sweep))
    ours_ms, floor_ms = 1e3 * statistics.median(ours_t), 1e3 * statistics.median(floor_t)
    sweep_ms = 1e3 * statistics.median(sweep_t)
    log(
        f"  steady full step: ours {ours_ms:.2f} ms, floor {floor_ms:.2f} ms "
        f"-> {ours_ms / floor_ms:.2f}x the floor; score sweep {sweep_ms:.2f} ms "
        f"({sweep_ms / ours_ms:.2f}x a step)"
    )
    cold = cold_first_step(lengths=three, policy="padded", **common)
    log(f"  first full step, cold process: {cold['seconds']:.2f} s ({cold['n_shapes']} shapes)")
    rows.append(
        {
            "model": model,
            "workload": "three lengths",
            "first_step_s": cold["seconds"],
            "n_shapes": cold["n_shapes"],
            "steady_ms": ours_ms,
            "floor_ms": floor_ms,
            "sweep_ms": sweep_ms,
        }
    )


def bench_distinct(model, args, rows):
    common = {"model": model, "adjoint": args.adjoint, "max_shapes": args.max_shapes}
    distinct = distinct_lengths(args)
    log(f"[{model}] {len(distinct)} distinct lengths {distinct[0]}..{distinct[-1]}")
    # Ours is timed before and after the exact policy and averaged, so a change in the load
    # of a shared machine during the run does not favour either side.
    before = cold_first_step(lengths=distinct, policy="padded", **common)
    log(f"  ours (padded): first step {before['seconds']:7.2f} s ({before['n_shapes']} shapes)")
    n_exact = len(distinct)
    if args.exact_shapes >= n_exact or args.exact_shapes < 2:
        exact = cold_first_step(lengths=distinct, policy="exact", **common)
        t_exact, note = exact["seconds"], ""
    else:
        # Every exact shape adds one compile of the same program to a fixed cost (the
        # penalty, combine and update kernels). Time a single shape and an even sample of
        # k shapes in cold processes, fit fixed + k * per_shape, and extrapolate to all.
        pick = np.linspace(0, n_exact - 1, args.exact_shapes).round().astype(int).tolist()
        one = cold_first_step(lengths=distinct, policy="exact", pick=pick[:1], **common)
        exact = cold_first_step(lengths=distinct, policy="exact", pick=pick, **common)
        per_shape = (exact["seconds"] - one["seconds"]) / (exact["n_shapes"] - 1)
        t_exact = one["seconds"] + per_shape * (n_exact - 1)
        note = (
            f" (extrapolated: 1 shape {one['seconds']:.1f} s, {exact['n_shapes']} shapes "
            f"{exact['seconds']:.1f} s, {per_shape:.2f} s per extra shape)"
        )
    after = cold_first_step(lengths=distinct, policy="padded", **common)
    padded = {"seconds": (before["seconds"] + after["seconds"]) / 2, "n_shapes": after["n_shapes"]}
    log(f"  exact        : first full step {t_exact:7.2f} s ({n_exact} shapes){note}")
    log(
        f"  ours (padded): again {after['seconds']:.2f} s, mean {padded['seconds']:.2f} s "
        f"-> ours is {padded['seconds'] / t_exact:.2f}x the exact policy"
    )
    rows.append(
        {
            "model": model,
            "workload": "distinct lengths",
            "first_step_s": padded["seconds"],
            "n_padded_shapes": padded["n_shapes"],
            "exact_first_step_s": t_exact,
            "exact_measured_shapes": exact["n_shapes"],
            "n_exact_shapes": n_exact,
            "exact_extrapolated": args.exact_shapes < n_exact,
        }
    )


def bench_cache(model, args, rows):
    log(f"[{model}] persistent compilation cache, SolverConfig(throw=False), two processes")
    with tempfile.TemporaryDirectory() as cache_dir:
        times = []
        for attempt in ("first", "second"):
            result = cold_first_step(
                model=model,
                adjoint=args.adjoint,
                max_shapes=args.max_shapes,
                lengths=three_lengths(args),
                policy="padded",
                throw=False,
                cache_dir=cache_dir,
            )
            times.append(result["seconds"])
            log(f"  {attempt} process: first full step {times[-1]:7.2f} s")
        entries = len(os.listdir(cache_dir))
    log(f"  second / first = {times[1] / times[0]:.2f} ({entries} cache entries)")
    rows.append({"model": model, "workload": "cache", "first_s": times[0], "second_s": times[1]})


def bench_sensitivity(model, args, rows):
    """Ours with each of `args.sensitivities` against the floor with diffrax's default adjoint
    (`RecursiveCheckpointAdjoint`, the reference of every ratio) and with `DirectAdjoint`."""
    three = three_lengths(args)
    # One bucket per length (three shapes, as the measurements): the cost model would
    # pad this data into a single shape.
    data = dataset_for(model, three, "exact", None)
    n = n_trainable(MODELS[model]()[1])
    log(f"\n[{model}] sensitivities, {n} trainable scalars, {args.n_experiments} experiments")
    steps = {f"floor {a}": floor(model, data, solver_config(a)) for a in ("recursive", "direct")}
    for mode in args.sensitivities:
        step, _ = ours(model, data, solver_config("recursive", sensitivity=mode))
        steps[f"ours {mode}"] = step
    for _ in range(3):  # compile, then settle every variant
        for fn in steps.values():
            fn()
    times = {k: [] for k in steps}
    for _ in range(args.reps):  # interleaved, so load on a shared CPU hits every variant alike
        for k, fn in steps.items():
            times[k].append(timed(fn))
    steady = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    cold = {}
    common = {"model": model, "lengths": three, "policy": "exact", "max_shapes": None}
    for adjoint in ("recursive", "direct"):
        cold[f"floor {adjoint}"] = cold_first_step(kind="floor", adjoint=adjoint, **common)
    for mode in args.sensitivities:
        cold[f"ours {mode}"] = cold_first_step(adjoint="recursive", sensitivity=mode, **common)
    ref_steady, ref_cold = steady["floor recursive"], cold["floor recursive"]["seconds"]
    for k in steps:
        chosen = f" (chose {'/'.join(cold[k]['modes'])})" if k.startswith("ours") else ""
        log(
            f"  {k:<16} first step {cold[k]['seconds']:7.2f} s "
            f"({cold[k]['seconds'] / ref_cold:.2f}x)  steady {steady[k]:8.2f} ms "
            f"({steady[k] / ref_steady:.2f}x){chosen}"
        )
        rows.append(
            {
                "model": model,
                "workload": "sensitivity",
                "variant": k,
                "n_trainable": n,
                "modes": cold[k]["modes"],
                "first_step_s": cold[k]["seconds"],
                "steady_ms": steady[k],
                "cold_ratio": cold[k]["seconds"] / ref_cold,
                "steady_ratio": steady[k] / ref_steady,
            }
        )


def bench_crossover(args, rows):
    """Forward against reverse bucket steps as the number of trainable scalars grows (the
    oscillator with a 1-w-1 damping MLP, one bucket shape): where `"auto"` should switch."""
    lengths = [max(args.lengths)] * args.n_experiments
    log(f"\n[crossover] {args.n_experiments} experiments of {lengths[0]} points, one shape")
    one = jnp.asarray(1.0, dtype=jnp.result_type(float))
    for width in args.crossover_widths:
        model = f"width{width}"
        MODELS.setdefault(model, width_model(width))
        (bp,) = dataset_for(model, lengths, "padded", 1).bucket_payloads
        _, predictors, simulate = MODELS[model]()
        n = n_trainable(predictors)
        calls, first, reps = {}, {}, {"forward": [], "reverse": []}
        for mode in reps:
            solver = solver_config("recursive", sensitivity=mode)
            step = hk.build_bucket_step(simulate, first_component, solver, hk.masked_mse, True)
            calls[mode] = lambda step=step: jax.block_until_ready(step(predictors, bp, one))
            first[mode] = timed(calls[mode])  # trace + compile + run, in this process
        for _ in range(args.reps):  # interleaved, as in the other parts
            for mode, call in calls.items():
                reps[mode].append(timed(call))
        result = {m: (first[m], 1e3 * statistics.median(reps[m])) for m in reps}
        (ff, fs), (rf, rs) = result["forward"], result["reverse"]
        log(
            f"  {n:4d} scalars: first call forward {ff:6.2f} s, reverse {rf:6.2f} s "
            f"({ff / rf:.2f}x); steady forward {fs:8.2f} ms, reverse {rs:8.2f} ms ({fs / rs:.2f}x)"
        )
        rows.append(
            {
                "model": model,
                "workload": "crossover",
                "n_trainable": n,
                "forward_first_s": ff,
                "reverse_first_s": rf,
                "forward_steady_ms": fs,
                "reverse_steady_ms": rs,
            }
        )


SENSITIVITY_TARGETS = {  # (cold first step, steady full step) against the default-adjoint floor
    "logistic": (0.65, 1.0),
    "lotka_volterra": (0.65, 0.9),
    "oscillator": (None, 1.05),
    "bank": (None, 1.05),
}


def summary(rows):
    log("\nsummary (targets on this CPU)")
    ok_all = True
    for r in rows:
        if r["workload"] == "three lengths":
            ratio, target = r["steady_ms"] / r["floor_ms"], 1.1
            what = "steady full step / floor"
        elif r["workload"] == "distinct lengths":
            ratio, target = r["first_step_s"] / r["exact_first_step_s"], 0.25
            what = "first step / exact policy" + (" (extrap.)" if r["exact_extrapolated"] else "")
        elif r["workload"] == "cache":
            ratio, target = r["second_s"] / r["first_s"], 0.5
            what = "first step, 2nd process / 1st"
        elif r["workload"] == "sensitivity" and r["variant"] == "ours auto":
            cold_target, steady_target = SENSITIVITY_TARGETS.get(r["model"], (None, None))
            if cold_target is not None:
                ok = r["cold_ratio"] <= cold_target
                ok_all &= ok
                log(
                    f"  {r['model']:<10} {'auto: first step / default-adjoint floor':<38} "
                    f"{r['cold_ratio']:5.2f}  (target <= {cold_target})  "
                    f"{'met' if ok else 'NOT met'}"
                )
            if steady_target is None:
                continue
            ratio, target = r["steady_ratio"], steady_target
            what = f"auto ({'/'.join(r['modes'])}): steady / floor"
        else:
            continue
        ok = ratio <= target
        ok_all &= ok
        log(
            f"  {r['model']:<10} {what:<38} {ratio:5.2f}  (target <= {target})  "
            f"{'met' if ok else 'NOT met'}"
        )
    return ok_all


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with `--quick`'s smaller problem filled in where no option was named."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny problem: a smoke test")
    parser.add_argument("--models", nargs="+", default=list(BENCH_MODELS), choices=list(MODELS))
    parser.add_argument("--n-experiments", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs=3, default=[50, 100, 200])
    parser.add_argument("--reps", type=int, default=20, help="timed steady-state steps")
    parser.add_argument(
        "--exact-shapes",
        type=int,
        default=8,
        help="exact-policy shapes actually compiled; the rest are extrapolated (64: all)",
    )
    parser.add_argument(
        "--max-shapes",
        type=int,
        default=None,
        help="padded policy's max_shapes (default: None, the cost model picks the shapes)",
    )
    parser.add_argument("--adjoint", choices=list(ADJOINTS), default="direct")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=None,
        choices=list(PARTS),
        help=f"which measurements to run (default: all; --quick: {', '.join(QUICK['parts'])})",
    )
    parser.add_argument(
        "--sensitivities",
        nargs="+",
        default=["auto"],
        choices=["auto", "forward", "reverse"],
        help="the `SolverConfig.sensitivity` values the sensitivity part times (GPU: all three)",
    )
    parser.add_argument(
        "--crossover-widths",
        type=int,
        nargs="+",
        default=list(CROSSOVER_WIDTHS),
        help="damping-MLP widths of the crossover sweep (3 * width + 2 trainable scalars)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        # A smaller problem for every option left at its default; the options named win (so
        # `nox -s gpu -- --quick` still times the sensitivity part it names).
        for name, value in QUICK.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.parts = args.parts or list(PARTS)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        first_step_child(json.loads(args.child))
        return
    log(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, x64={jax.config.jax_enable_x64}, "
        f"{args.adjoint} adjoint, padded policy max_shapes={args.max_shapes}"
    )
    rows = []
    parts = {
        "steady": bench_steady,
        "distinct": bench_distinct,
        "cache": bench_cache,
        "sensitivity": bench_sensitivity,
    }
    for model in args.models:
        for part in args.parts:
            if part in parts:
                parts[part](model, args, rows)
    if "crossover" in args.parts:
        bench_crossover(args, rows)
    summary(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
