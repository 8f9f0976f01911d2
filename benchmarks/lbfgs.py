"""Adam then L-BFGS: `train_with_optax` against a hand-written optax L-BFGS loop.

Workload: the Lotka–Volterra universal differential equation of the SciML tutorial. One
trajectory of 21 noise-free points on [0, 5] (alpha 1.3, beta 0.9, gamma 0.8, delta 1.8); the
model keeps the linear terms and learns the interaction with a 2-8-8-2 tanh MLP
(`dx = 1.3 x + nn(x, y)_0`, `dy = -1.8 y + nn(x, y)_1`), float64, Tsit5, mean squared error.

- `train_with_optax`: one run, phases `("adam", "lbfgs")`; the L-BFGS phase is timed from its
  own step events (the L-BFGS update is compiled by an earlier warm-up run, so it is not
  timed).
- `hand-written loop`: the same number of L-BFGS steps from the same Adam end point (the
  trainer's, with `restore_best=False`), written as optax documents it on the same objective
  (`hk.build_objective(...).for_trials()`, what the trainer's line search calls): `optax.lbfgs()`,
  `optax.value_and_grad_from_state`, one `eqx.filter_jit` step, and one `float(value)` per
  step (as the trainer's `log_every=1`).

Both final parameters are scored with an independent objective written directly with
`diffrax.diffeqsolve`: the two final losses must agree to 1e-8 relative. The two runs take
bitwise-identical steps for the first ten or so L-BFGS steps; after that, rounding differences
between the differently compiled programs (about 1e-13 relative at step 20) grow by roughly
30x per step on this far-from-converged problem (2e-10 at step 30, percent level by step 100),
so the agreement is checked after 25 steps. The step-time ratio is reported, not asserted.

Run: `python benchmarks/lbfgs.py` (a few minutes, most of it compiling) or `--quick`
(fewer steps, one repeat).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hybrid_kernels as hk  # noqa: E402

ALPHA, BETA, GAMMA, DELTA = 1.3, 0.9, 0.8, 1.8
U0 = np.array([0.44249296, 4.6280594])
TS = np.linspace(0.0, 5.0, 21)
RTOL, ATOL, DT0, MAX_STEPS = 1e-8, 1e-10, 0.01, 4096


class UDE(eqx.Module):
    nn: eqx.nn.MLP


def ude_field(nn):
    def vf(t, y, args):
        known = jnp.stack([ALPHA * y[0], -DELTA * y[1]])
        return known + nn(y)

    return vf


def simulate(predictors, ts, covariates, y0, solver):
    (p,) = predictors
    return solver.diffeqsolve(diffrax.ODETerm(ude_field(p.nn)), ts, y0).ys


def identity(state):
    return state


def truth() -> np.ndarray:
    def lv(t, y, args):
        x, z = y[0], y[1]
        return jnp.stack([ALPHA * x - BETA * x * z, -DELTA * z + GAMMA * x * z])

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lv),
        diffrax.Tsit5(),
        t0=TS[0],
        t1=TS[-1],
        dt0=DT0,
        y0=jnp.asarray(U0),
        saveat=diffrax.SaveAt(ts=jnp.asarray(TS)),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
        max_steps=100_000,
    )
    return np.asarray(sol.ys)


def make_data(ys: np.ndarray) -> hk.Dataset:
    exp = hk.make_experiment(
        covariates={},
        channels={
            "x": hk.ChannelObs(TS, ys[:, 0], 1e-4),
            "y": hk.ChannelObs(TS, ys[:, 1], 1e-4),
        },
        y0_fn=lambda c, ch: U0,
        exp_id="lv",
    )
    return hk.make_dataset([exp], output_channel_names=["x", "y"])


def make_model() -> tuple:
    nn = eqx.nn.MLP(2, 2, 8, 2, activation=jnp.tanh, key=jax.random.key(0))
    nn = jax.tree.map(lambda x: x * 0.1 if eqx.is_inexact_array(x) else x, nn)
    predictors = (UDE(nn),)
    solver = hk.SolverConfig(
        solver=diffrax.Tsit5(), rtol=RTOL, atol=ATOL, dt0=DT0, max_steps=MAX_STEPS
    )
    return predictors, solver


def direct_objective(ys: np.ndarray):
    """The objective written directly with diffrax, to score both end points."""
    ts, data, y0 = jnp.asarray(TS), jnp.asarray(ys), jnp.asarray(U0)

    def objective(predictors):
        (p,) = predictors
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(ude_field(p.nn)),
            diffrax.Tsit5(),
            t0=ts[0],
            t1=ts[-1],
            dt0=DT0,
            y0=y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            max_steps=MAX_STEPS,
        )
        return jnp.mean((sol.ys - data) ** 2)

    return objective


def hand_lbfgs(start, objective, steps: int) -> tuple[object, float]:
    """The hand-written L-BFGS loop from `start`; returns its end point and s / step."""
    params, static = eqx.partition(start, eqx.is_inexact_array)

    def value_fn(params):
        return objective(eqx.combine(params, static))

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(value_fn)

    @eqx.filter_jit
    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=value_fn)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    # Compile, not timed: the state optax's init builds and the one an update returns differ
    # in weak types, so the step compiles twice.
    jax.block_until_ready(step(*step(params, state)[:2]))
    start_time = time.perf_counter()
    for _ in range(steps):
        params, state, value = step(params, state)
        float(value)
    jax.block_until_ready(params)
    return eqx.combine(params, static), (time.perf_counter() - start_time) / steps


class Stamps(hk.TrainingUI):
    """Times every step as the trainer reports it (after its one read per step)."""

    def __init__(self) -> None:
        self.times: list[tuple[int, float]] = []

    def on_step_end(self, **kwargs) -> None:
        self.times.append((kwargs["phase_idx"], time.perf_counter()))


def trainer(predictors, dataset, solver, adam: int, lbfgs: int) -> tuple:
    """Adam then L-BFGS through the trainer: `(history, end point, s / L-BFGS step)`."""
    config = hk.OptaxTrainingConfig(
        steps=(adam, lbfgs) if lbfgs else (adam,),
        lr=(1e-2, 1.0) if lbfgs else (1e-2,),
        optimizer=("adam", "lbfgs") if lbfgs else ("adam",),
        restore_best=False,
        verbose=False,
    )
    stamps = Stamps()
    history, end = hk.train_with_optax(
        predictors,
        dataset,
        config,
        simulate_fn=simulate,
        state_to_output=identity,
        solver=solver,
        key=jax.random.key(0),
        ui=stamps,
    )
    if not lbfgs:
        return history, end, float("nan")
    last_adam = [t for phase, t in stamps.times if phase == 0][-1]
    return history, end, (stamps.times[-1][1] - last_adam) / lbfgs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one repeat")
    parser.add_argument("--lbfgs-steps", type=int, default=None, help="L-BFGS steps per run")
    args = parser.parse_args()
    adam, lbfgs, repeats = (100, 25, 1) if args.quick else (400, 25, 5)
    lbfgs = args.lbfgs_steps or lbfgs
    ys = truth()
    dataset = make_data(ys)
    predictors, solver = make_model()
    objective = eqx.filter_jit(direct_objective(ys))
    same = hk.build_objective(
        dataset, simulate_fn=simulate, state_to_output=identity, solver=solver
    ).for_trials()
    print(f"Lotka-Volterra UDE: 1 trajectory, {len(TS)} points, 2-8-8-2 tanh MLP, float64")
    print("compiling (trainer: adam and lbfgs; hand-written loop) ...", flush=True)
    t0 = time.perf_counter()
    trainer(predictors, dataset, solver, 2, 2)
    print(f"  compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    _, adam_end, _ = trainer(predictors, dataset, solver, adam, 0)
    print(f"adam end point after {adam} steps: loss {float(objective(adam_end)):.6e}", flush=True)

    per_step: dict[str, list[float]] = {"hand-written loop": [], "train_with_optax": []}
    finals: dict[str, float] = {}
    for r in range(repeats):
        _, trained, seconds = trainer(predictors, dataset, solver, adam, lbfgs)
        per_step["train_with_optax"].append(seconds)
        finals["train_with_optax"] = float(objective(trained))
        hand_end, seconds = hand_lbfgs(adam_end, same, lbfgs)
        per_step["hand-written loop"].append(seconds)
        finals["hand-written loop"] = float(objective(hand_end))
        print(
            f"  repeat {r + 1}/{repeats}: "
            + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms/step" for k, v in per_step.items()),
            flush=True,
        )

    base = min(per_step["hand-written loop"])
    print(f"\n| loop | ms / L-BFGS step (best of {repeats}) | median | ratio | final loss |")
    print("| --- | --- | --- | --- | --- |")
    for name, values in per_step.items():
        best, median = min(values), statistics.median(values)
        print(
            f"| {name} | {best * 1e3:.2f} | {median * 1e3:.2f} | {best / base:.3f}x | "
            f"{finals[name]:.10e} |"
        )
    ratio = min(per_step["train_with_optax"]) / base
    a, b = finals["train_with_optax"], finals["hand-written loop"]
    rel = abs(a - b) / max(abs(b), np.finfo(float).tiny)
    verdict = "within" if rel <= 1e-8 else "OUTSIDE"
    print(
        f"\nsummary: after {adam} Adam steps, {lbfgs} L-BFGS steps through train_with_optax "
        f"cost {ratio:.3f}x the hand-written optax loop per step (best of {repeats}); final "
        f"losses {a:.6e} and {b:.6e} differ by {rel:.1e} relative, {verdict} 1e-8; "
        f"jax {jax.__version__}, {jax.devices()[0].platform}"
    )


if __name__ == "__main__":
    main()
