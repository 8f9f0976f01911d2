"""Build your own training loop from the hybrid_kernels kernels.

A harmonic oscillator x'' = -omega^2 x is observed through noisy positions at irregular times,
one experiment per starting position. We recover omega with a hand-written loop over
`dataset.bucket_payloads` that composes the four kernels:

- `build_bucket_step`: (loss, grads) of one bucket, one compile per bucket shape;
- `build_penalty_step`: a custom L2 regulariser, charged once per step outside the bucket loop;
- `build_score_bucket`: a forward-only score of held-out experiments;
- `build_apply_update`: the one optimiser update per step.

The last three run inside one `eqx.filter_jit` (`finish_step`), so each step ends in a single
dispatch.

Run it with `python examples/custom_loop.py` (add `--quick` for a smaller problem).
"""

from __future__ import annotations

import argparse
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import hybrid_kernels as hk

TRUE_OMEGA = 1.0


class Oscillator(eqx.Module):
    """The one trainable quantity: the angular frequency."""

    omega: jax.Array


def simulate(predictors, ts, covariates, y0, solver):
    """`simulate_fn`: integrate one experiment, returning the state [x, v] at `ts`."""
    (osc,) = predictors

    def vector_field(t, y, args):
        return jnp.stack([y[1], -(osc.omega**2) * y[0]])

    return solver.diffeqsolve(diffrax.ODETerm(vector_field), ts, y0).ys


def position(state):
    """`state_to_output`: the observed channel is the position x."""
    return state[:, :1]


def l2_regulariser(predictors, points):
    """A custom penalty: the squared norm of every trainable float leaf (points unused)."""
    leaves = jax.tree_util.tree_leaves(eqx.filter(predictors, eqx.is_inexact_array))
    return sum(jnp.sum(x**2) for x in leaves)


def make_data(n_experiments, seed):
    """Noisy positions x0 * cos(omega t) at t = 0 and 11 to 19 random later times up to 6."""
    rng = np.random.default_rng(seed)
    experiments = []
    for i in range(n_experiments):
        x0 = rng.uniform(0.5, 1.5)
        # The solve starts at each experiment's first time, where y0 holds: observe t = 0.
        later = rng.choice(np.linspace(0.1, 6.0, 60), rng.integers(11, 20), replace=False)
        ts = np.concatenate([[0.0], np.sort(later)])
        xs = x0 * np.cos(TRUE_OMEGA * ts) + rng.normal(0.0, 0.02, ts.shape)
        experiments.append(
            hk.make_experiment(
                covariates={"x0": x0},
                channels={"x": hk.ChannelObs(ts, xs, variance=0.02**2)},
                y0_fn=lambda cov, ch: jnp.stack([cov["x0"], 0.0 * cov["x0"]]),
                exp_id=f"exp{i}",
            )
        )
    return experiments


def main(n_experiments=8, n_steps=300, lr=0.05, seed=0, max_shapes=2, verbose=True):
    """Train omega from 0.8; return a summary dict (final omega, its error, steps, timings)."""
    experiments = make_data(n_experiments + 2, seed)
    train = hk.make_dataset(experiments[:-2], output_channel_names=("x",), max_shapes=max_shapes)
    held_out = hk.make_dataset(experiments[-2:], output_channel_names=("x",), max_shapes=1)

    predictors = (Oscillator(omega=jnp.asarray(0.8)),)
    trainable = hk.trainable_mask(predictors)
    solver = hk.SolverConfig(
        diffrax.Tsit5(),
        rtol=1e-6,
        atol=1e-8,
        max_steps=4096,
        dt0=0.05,
        adjoint=diffrax.DirectAdjoint(),
    )
    optimizer = optax.adam(lr)

    bucket_step = hk.build_bucket_step(simulate, position, solver, hk.masked_mse, trainable)
    score_bucket = hk.build_score_bucket(simulate, position, solver, hk.masked_mse)
    penalty_step = hk.build_penalty_step(l2_regulariser, trainable)
    apply_update = hk.build_apply_update(optimizer, trainable)
    opt_state = optimizer.init(eqx.filter(predictors, trainable))

    # Score only the first half of every series for the first 50 steps: a short horizon keeps
    # the early gradient from being dominated by the phase error at late times.
    def fraction_at(step):
        return 0.5 if step < 50 else 1.0

    weights = {f: hk.bucket_weights(train, "per_observation", f) for f in (0.5, 1.0)}
    penalty_weight = jnp.asarray(1e-5)
    if verbose:
        print(hk.describe_buckets(train))

    # The per-step pieces compose inside one jit: the end of every step is then a single
    # dispatch instead of three, which is most of the library's overhead on a cheap model.
    @eqx.filter_jit
    def finish_step(predictors, opt_state, losses, grads, weights, penalty_weight):
        loss, grad = hk.combine_bucket_grads(losses, grads, weights)
        penalty, penalty_grad = penalty_step(predictors, penalty_weight)
        grad = jax.tree_util.tree_map(jnp.add, grad, penalty_grad)
        predictors, opt_state = apply_update(predictors, grad, opt_state)
        return predictors, opt_state, loss, penalty

    start = time.perf_counter()
    first_step_s = None
    history = []
    for step in range(n_steps):
        fraction = fraction_at(step)
        losses, grads = [], []
        for bp in train.bucket_payloads:  # the Python loop is the dispatcher
            loss, g = bucket_step(predictors, bp, fraction)
            losses.append(loss)
            grads.append(g)
        predictors, opt_state, loss, penalty = finish_step(
            predictors, opt_state, tuple(losses), tuple(grads), weights[fraction], penalty_weight
        )
        history.append(float(loss))
        if first_step_s is None:
            first_step_s = time.perf_counter() - start
        if verbose and (step % 25 == 0 or step == n_steps - 1):
            held = np.mean(
                [float(score_bucket(predictors, bp, 1.0)) for bp in held_out.bucket_payloads]
            )
            omega = float(predictors[0].omega)
            print(
                f"step {step:4d}  fraction {fraction:.1f}  loss {history[-1]:.3e}  "
                f"L2 {float(penalty):.3f}  held-out {held:.3e}  omega {omega:.4f}"
            )
    total_s = time.perf_counter() - start
    omega = float(predictors[0].omega)
    held = np.mean([float(score_bucket(predictors, bp, 1.0)) for bp in held_out.bucket_payloads])
    summary = {
        "omega": omega,
        "relative_error": abs(omega - TRUE_OMEGA) / TRUE_OMEGA,
        "steps": n_steps,
        "final_loss": history[-1],
        "held_out_loss": float(held),
        "first_step_s": first_step_s,
        "steady_step_ms": 1e3 * (total_s - first_step_s) / max(n_steps - 1, 1),
    }
    if verbose:
        print(
            f"\nsummary: omega = {omega:.4f} (true {TRUE_OMEGA}, error "
            f"{100 * summary['relative_error']:.2f} %) after {n_steps} steps; "
            f"held-out MSE {held:.2e}; first step {first_step_s:.1f} s (compiles), then "
            f"{summary['steady_step_ms']:.1f} ms per step"
        )
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer experiments and steps")
    args = parser.parse_args()
    if args.quick:
        main(n_experiments=4, n_steps=150)
    else:
        main()
