"""A newborn's line search survives trial weights at which the user's own solve gives up.

The growing hook sets a newborn's weight by trying a few weights; a large one can make the
model's ODE too stiff for the solver's `max_steps`, and `diffrax.diffeqsolve` under its default
`throw=True` then raises (an `EquinoxRuntimeError` through `eqx.filter_jit`, a `ValueError`
through a plain `jax.jit`) where a line search needs a value. The trial counts as a blow-up.

The model is an oscillator `y'' = -(1 + bank(y)) y`: the solver's step count grows with the
stiffness the bank adds, so `max_steps` sits between what the truth needs and what the line
search's second trial (the parabola's minimum) needs.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import confluent_bank as cb

T = 10.0
TS = jnp.linspace(0.0, T, 41)
MAX_STEPS = 110  # the truth takes 74 steps; a bank weight of 30 takes 120


def _solve(bank, max_steps):
    def field(t, z, args):
        y, v = z
        return jnp.stack([v, -(1.0 + bank.forward(y)) * y])

    return diffrax.diffeqsolve(
        diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, T, 0.05, jnp.asarray([1.0, 0.0]),
        saveat=diffrax.SaveAt(ts=TS),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=max_steps,
    ).ys[:, 0]  # fmt: skip


@pytest.fixture(scope="module")
def data():
    truth = cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 3.0, 2.0)], max_packs=4, max_order=0)
    return _solve(truth, 4096)


@pytest.mark.parametrize("jit", [eqx.filter_jit, jax.jit], ids=["filter_jit", "jax_jit"])
def test_a_trial_weight_that_exhausts_max_steps_is_a_blow_up(data, jit):
    compiled = jit(lambda bank: jnp.mean((_solve(bank, MAX_STEPS) - data) ** 2))
    trials = []

    def objective(bank):
        weight = bank.weights[1]
        if isinstance(weight, jax.core.Tracer):  # the scoring pass
            return compiled(bank)
        try:
            value = float(compiled(bank))
        except Exception as error:
            trials.append((float(weight), type(error).__name__))
            raise
        trials.append((float(weight), value))
        return value

    start = cb.init_confluent_bank([cb.RefinedPack(0, -1.0, 0.0, 1.0)], max_packs=4, max_order=0)
    hook = cb.TransitionHook.growing(objective, (-1.0, 1.0), every=1, plateau=np.inf, births=1)
    bank, state = start, optax.adam(1e-2).init(start.parameters)
    for step in (1, 2):
        bank, state = hook.between_steps(step, bank, state)
    (_, first), (_, second) = trials[-2:]
    assert isinstance(first, float) and isinstance(second, str)  # the parabola's trial raised
    newborn = hook.events[-1]
    assert (newborn.kind, newborn.accepted) == ("newborn_weight", True)
    assert float(bank.weights[1]) == newborn.score == trials[-2][0]
    assert newborn.loss_after == first < newborn.loss_before
