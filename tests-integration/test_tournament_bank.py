"""A tournament whose predictor is a confluent bank: hybrid-kernels' `reinitialise` restarts
the bank through its own duck-typed `reinitialise(key)`, so every start is a valid bank."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb
import hybrid_kernels as hk

import hybrid_problem as P

# The slot layout, and the scales the problem's mask freezes.
STRUCTURE = ("active", "modes", "orders", "slot_ids", "scales")
ATTEMPTS = 3


@pytest.fixture(scope="module")
def tournament():
    dataset = P.make_dataset(
        P.ProblemSize(n_experiments=4, lengths=(8,)), dtype=jnp.float64, max_shapes=1
    )
    start = (P.initial_bank(jnp.float64),)
    ui = hk.RecordingUI()
    history, trained = hk.train_with_optax(
        start,
        dataset,
        P.standard_config(steps=(2,), lr=(0.01,), tournament_attempts=ATTEMPTS, tournament_steps=1),
        simulate_fn=P.simulate,
        state_to_output=P.state_to_output,
        solver=P.make_solver(jnp.float64),
        trainable=P.bank_trainable(start),
        key=jax.random.key(0),
        ui=ui,
    )
    return start[0], history, trained[0], ui


def test_every_tournament_attempt_scores_a_finite_loss(tournament):
    *_, ui = tournament
    texts = [e["text"] for e in ui.of("on_message") if "tournament attempt" in e["text"]]
    assert len(texts) == ATTEMPTS and all("score" in t and "failed" not in t for t in texts)


def test_the_trained_bank_keeps_the_structure_of_the_start(tournament):
    start, history, trained, _ = tournament
    assert isinstance(trained, cb.ConfluentPackBank) and np.all(np.isfinite(list(history)))
    for name in STRUCTURE:
        np.testing.assert_array_equal(getattr(trained, name), getattr(start, name), name)


def test_hybrid_kernels_reinitialise_uses_the_banks_own_method():
    # With every float block trainable, a generic redraw would scramble the geometry (a
    # negative rho, inactive slots with weight); the bank's own method keeps it.
    bank = P.initial_bank(jnp.float64)
    mask = hk.trainable_mask((bank,))
    fresh = hk.reinitialise((bank,), mask, jax.random.key(7))[0]
    for name in ("scales", "rho", "directions", "direction_bias"):
        np.testing.assert_array_equal(getattr(fresh, name), getattr(bank, name), name)
    inactive = ~np.asarray(bank.active)
    np.testing.assert_array_equal(np.asarray(fresh.weights)[inactive], 0.0)
    assert not np.array_equal(fresh.centers, bank.centers)
