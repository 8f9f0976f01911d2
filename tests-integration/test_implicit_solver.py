"""A bank inside a stiff ODE solved by an implicit solver that `simulate_fn` calls itself.

A fast reversible binding `A ⇌ B` (rates 200 and 100 per hour) feeds a slow conversion
`B → C` at an unknown rate `softplus(bank(B))`; `C` decays at a trained `kd`; a logged feed
(a step input) adds to `A`; `A + B` and `C` are observed. The user calls
`diffrax.diffeqsolve` with `Kvaerno5`, whose Newton steps take the vector field's Jacobian in
forward mode; training differentiates through them. The bank holds an ordinary atom and a
centred pair, so the pair's formulas are in that Jacobian too.
"""

from __future__ import annotations

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import confluent_bank as cb
import confluent_bank.optax as cb_optax
import hybrid_kernels as hk

KF, KB, KD = 200.0, 100.0, 0.1
FEED_TIMES = (0.0, 2.0, 5.0)
TOLERANCES = {"rtol": 1e-8, "atol": 1e-10}
MAX_STEPS = 4096  # Tsit5, the explicit reference, needs many small steps on this stiff system


class Decay(eqx.Module):
    log_kd: jax.Array


def true_rate(b):
    return 0.8 * b / (0.5 + b)


def simulate_with(method):
    """A `simulate_fn`, `[T] -> [T, 3]` (the states `A, B, C`), that solves with `method`."""

    def simulate(predictors, ts, covariates, y0, solver):
        decay, bank = predictors
        feed = covariates["u"]

        def vector_field(t, y, args):
            a, b, c = y[0], y[1], y[2]
            bind = KF * a - KB * b
            rate = jax.nn.softplus(bank.forward(b)) if bank is not None else true_rate(b)
            return jnp.stack([feed(t) - bind, bind - rate, rate - jnp.exp(decay.log_kd) * c])

        controller = diffrax.ClipStepSizeController(
            diffrax.PIDController(**TOLERANCES), jump_ts=feed.jump_ts
        )
        return diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            method,
            ts[0],
            ts[-1],
            None,
            y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=controller,
            max_steps=MAX_STEPS,
        ).ys

    return simulate


simulate = simulate_with(diffrax.Kvaerno5())


def observe(states):
    """`[T, 3] -> [T, 2]`: total substrate `A + B` and product `C`."""
    return jnp.stack([states[..., 0] + states[..., 1], states[..., 2]], axis=-1)


def experiments() -> list[hk.Experiment]:
    """Three runs of 9 readings each (one bucket shape), observed from the true model. Two
    are read just after a feed switch (2.02 and 5.01), so the loss and its gradient include
    the solver's steps right after an event."""
    out = []
    ts = jnp.asarray([0.0, 0.4, 1.1, 2.02, 2.6, 4.0, 5.01, 6.3, 8.0])
    for i, (start, feeds) in enumerate([(1.0, (0.0, 0.6, 0.3)), (2.0, (0.5, 0.0, 1.0)),
                                        (3.0, (0.2, 0.4, 0.0))]):  # fmt: skip
        table = hk.piecewise_constant(FEED_TIMES, feeds)
        signal = hk.InputSignal(diffrax.LinearInterpolation(*map(jnp.asarray, table.knots())))
        y0 = jnp.asarray([start, 0.0, 0.0])
        states = simulate((Decay(jnp.log(jnp.asarray(KD))), None), ts, {"u": signal}, y0, None)
        values = np.asarray(observe(states))
        out.append(
            hk.make_experiment(
                covariates={},
                inputs={"u": table},
                channels={
                    "S": hk.ChannelObs(ts, jnp.asarray(values[:, 0])),
                    "C": hk.ChannelObs(ts, jnp.asarray(values[:, 1])),
                },
                y0_fn=lambda cov, ch, y0=y0: y0,
                exp_id=f"run{i}",
            )
        )
    return out


def start_bank():
    """An ordinary atom and a centred pair (direction slope 0.5, so `η` varies with `B`)."""
    packs = [cb.RefinedPack(0, c, w, 2.0) for c, w in [(0.4, -0.8), (1.6, 0.3), (1.0, 0.2)]]
    bank = cb.init_confluent_bank(packs, max_packs=4, max_order=3, dtype=jnp.float64)
    proposal = bank.propose_pair(0, 1)
    bank, _, accepted = cb.commit_transition(
        bank,
        proposal,
        optax.adam(0.01).init(eqx.filter(bank, eqx.is_inexact_array)),
        between_steps=True,
        acceptance=lambda b, p: True,
        state_adapter=cb_optax.commit_adapter(),
    )
    assert accepted
    return eqx.tree_at(lambda b: b.directions, bank, bank.directions.at[0].set(0.5))


@pytest.fixture(scope="module")
def problem():
    jax.config.update("jax_enable_x64", True)
    dataset = hk.make_dataset(experiments(), output_channel_names=["S", "C"], dtype=jnp.float64)
    predictors = (Decay(jnp.log(jnp.asarray(0.3))), start_bank())
    trainable = hk.trainable_mask(predictors)
    solver = hk.SolverConfig(diffrax.Kvaerno5(), max_steps=MAX_STEPS, dt0=None, **TOLERANCES)
    return dataset, predictors, trainable, solver


def test_the_banks_pair_is_active_and_its_direction_varies(problem):
    _, (_, bank), _, _ = problem
    active = np.asarray(bank.active)
    assert sorted(np.asarray(bank.modes)[active].tolist()) == [0, 1]
    assert active[0] and int(bank.modes[0]) == 1 and float(bank.directions[0]) == 0.5


def flat(tree):
    return np.asarray(ravel_pytree(eqx.filter(tree, eqx.is_inexact_array))[0])


def test_the_gradient_through_newton_steps_is_the_explicit_solvers(problem):
    # Finite differences of an implicit solve are noisy at its Newton tolerance (measured for
    # log_kd: 0.2904, 0.2948, 0.29433 for steps of 1e-6, 1e-5, 1e-4, against 0.294331), so
    # the reference is the same loss solved by Tsit5, which takes no Jacobian of the field.
    dataset, predictors, trainable, solver = problem
    payload = dataset.bucket_payloads[0]
    results = {}
    for name, method in [("Kvaerno5", diffrax.Kvaerno5()), ("Tsit5", diffrax.Tsit5())]:
        config = dataclasses.replace(solver, solver=method)
        step = hk.build_bucket_step(
            simulate_with(method), observe, config, hk.masked_mse, trainable
        )
        results[name] = step(predictors, payload, 1.0)
    (implicit_loss, implicit), (explicit_loss, explicit) = results["Kvaerno5"], results["Tsit5"]
    assert float(implicit_loss) == pytest.approx(float(explicit_loss), rel=1e-6)
    implicit, explicit = flat(implicit), flat(explicit)
    assert np.count_nonzero(explicit) >= 6  # the decay, the atom's and the pair's coordinates
    assert np.linalg.norm(implicit - explicit) <= 1e-5 * np.linalg.norm(explicit)


def test_training_through_the_implicit_solver_recovers_the_decay(problem):
    dataset, predictors, trainable, solver = problem
    history, (decay, _) = hk.train_with_optax(
        predictors,
        dataset,
        hk.OptaxTrainingConfig(steps=(30,), lr=(0.05,), optimizer=(optax.adam,), verbose=False),
        simulate_fn=simulate,
        state_to_output=observe,
        solver=solver,
        trainable=trainable,
        key=jax.random.key(0),
    )
    assert np.all(np.isfinite(list(history)))
    assert history[-1] < 0.05 * history[0]
    assert abs(float(jnp.exp(decay.log_kd)) - KD) < 0.25 * abs(0.3 - KD)
