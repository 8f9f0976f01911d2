"""Forward-mode sensitivities through a confluent bank inside the ODE, across a commit.

A commit between steps changes the bank's values (a slot is born), never its shapes, so the
forward-mode bucket step must keep its one trace and still agree with reverse mode.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import confluent_bank as cb
import confluent_bank.optax as cb_optax
import hybrid_kernels as hk

import hybrid_problem as P

AGREE = 1e-10  # relative, float64
SIZE = P.ProblemSize(n_experiments=3, lengths=(6,))


class Recorder:
    """`simulate_fn` that records the sensitivity each trace resolved."""

    def __init__(self):
        self.seen = set()

    def __call__(self, predictors, ts, covariates, y0, solver):
        self.seen.add(solver.sensitivity)
        return P.simulate(predictors, ts, covariates, y0, solver)


def flat(grads):
    return np.asarray(ravel_pytree(eqx.filter(grads, eqx.is_inexact_array))[0])


@pytest.fixture(scope="module")
def problem():
    dataset = P.make_dataset(SIZE, dtype=jnp.float64)
    bank = P.initial_bank(jnp.float64)
    trainable = P.bank_trainable((bank,))
    solver = P.make_solver(jnp.float64)
    counter = P.TraceCounter(P.simulate)
    steps = {
        mode: hk.build_bucket_step(
            counter if mode == "forward" else P.simulate,
            P.state_to_output,
            dataclasses.replace(solver, sensitivity=mode),
            hk.masked_mse,
            trainable,
        )
        for mode in ("forward", "reverse")
    }
    return dataset.bucket_payloads[0], bank, trainable, steps, counter


def birth(bank, trainable):
    """Commit a zero-output atom into the first free slot, carrying an Adam state."""
    free = int(np.flatnonzero(~np.asarray(bank.active))[0])
    proposal = bank.propose_birth(free, cb.RefinedPack(0, 0.3, 0.0, P.SCALE))
    opt_state = optax.adam(1e-2).init(eqx.filter((bank,), trainable))
    new_bank, _, accepted = cb.commit_transition(
        bank,
        proposal,
        opt_state,
        between_steps=True,
        acceptance=lambda b, p: True,
        state_adapter=cb_optax.commit_adapter(),
    )
    assert accepted
    return new_bank


def assert_agree(forward, reverse):
    (lf, gf), (lr, gr) = forward, reverse
    assert float(lf) == pytest.approx(float(lr), rel=1e-13)
    gf, gr = flat(gf), flat(gr)
    assert np.linalg.norm(gf - gr) <= AGREE * np.linalg.norm(gr)


def test_forward_and_reverse_agree_through_the_bank(problem):
    bp, bank, _, steps, _ = problem
    assert_agree(steps["forward"]((bank,), bp, 1.0), steps["reverse"]((bank,), bp, 1.0))


def test_forward_mode_agrees_after_a_commit_without_retracing(problem):
    bp, bank, trainable, steps, counter = problem
    steps["forward"]((bank,), bp, 1.0)
    traces = counter.count
    committed = birth(bank, trainable)
    assert int(np.sum(np.asarray(committed.active))) == int(np.sum(np.asarray(bank.active))) + 1
    forward = steps["forward"]((committed,), bp, 1.0)
    assert counter.count == traces
    assert_agree(forward, steps["reverse"]((committed,), bp, 1.0))


def test_auto_picks_reverse_for_the_bank(problem):
    bp, bank, trainable, _, _ = problem
    recorder = Recorder()
    step = hk.build_bucket_step(
        recorder, P.state_to_output, P.make_solver(jnp.float64), hk.masked_mse, trainable
    )
    step.lower((bank,), bp, 1.0)  # the choice is made when the kernel is traced
    assert recorder.seen == {"reverse"}
