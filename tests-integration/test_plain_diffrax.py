"""A `simulate_fn` that calls `diffrax.diffeqsolve` itself trains under the default solver config.

The habit many users bring: diffrax called directly, with its own step-size controller and its
default adjoint (`RecursiveCheckpointAdjoint`, a `custom_vjp`), never `solver.diffeqsolve`.
With a rate and a confluent bank's weights trainable (five scalars), `sensitivity="auto"`
first chooses forward mode, cannot run it, and trains in reverse mode, saying so once.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb
import hybrid_kernels as hk

import hybrid_problem as P

SIZE = P.ProblemSize(n_experiments=4, lengths=(8,))
FROZEN = [
    "centers",
    "scales",
    "rho",
    "odd_moments",
    "directions",
    "direction_bias",
    "moment_coefficients",
]


class Rate(eqx.Module):
    k: jax.Array


def plain_simulate(predictors, ts, covariates, y0, solver):
    """`-k y + bank(y)`, solved by diffrax directly: no `adjoint=solver.adjoint`."""
    rate, bank = predictors

    def vector_field(t, y, args):
        return -rate.k * y + bank.forward(y)

    return diffrax.diffeqsolve(
        diffrax.ODETerm(vector_field),
        diffrax.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=None,
        y0=y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
        max_steps=512,
    ).ys


def start(weights):
    """The problem's true sigmoid pair (`P.true_g`) with other weights, in a bank of four."""
    packs = [
        cb.RefinedPack(0, P.C1, weights[0], P.SCALE),
        cb.RefinedPack(0, P.C2, weights[1], P.SCALE),
    ]
    return cb.init_confluent_bank(packs, max_packs=4, max_order=3, dtype=jnp.float64)


@pytest.fixture(scope="module")
def run():
    predictors = (Rate(jnp.asarray(0.3)), start((0.6, -0.4)))
    trainable = hk.trainable_mask(predictors)
    trainable = hk.freeze_paths(
        trainable, [f"1.{name}" for name in FROZEN] + ["1.moment_coefficients"]
    )
    ui = hk.RecordingUI()
    history, trained = hk.train_with_optax(
        predictors,
        P.make_dataset(SIZE, dtype=jnp.float64),
        hk.OptaxTrainingConfig(steps=(150,), lr=(0.05,), verbose=False),
        simulate_fn=plain_simulate,
        state_to_output=P.state_to_output,
        # The README's quick-start config: sensitivity="auto", the default adjoint.
        solver=hk.SolverConfig(diffrax.Tsit5(), rtol=1e-8, atol=1e-10, max_steps=512, dt0=None),
        trainable=trainable,
        key=jax.random.key(0),
        ui=ui,
    )
    return history, trained, ui


def test_plain_diffrax_trains_under_the_default_solver_config(run):
    history, trained, _ = run
    assert np.all(np.isfinite(list(history)))
    assert history[0] / history[-1] >= 100.0
    # The rate and the bank's weights trade off over the data's range: the rate need only
    # move most of the way from 0.3 to the truth.
    assert abs(float(trained[0].k) - P.K) < 0.25 * abs(0.3 - P.K)


def test_the_reverse_mode_fallback_is_announced_once(run):
    _, _, ui = run
    notices = [m["text"] for m in ui.of("on_message") if "uses reverse mode" in m["text"]]
    assert len(notices) == 1
