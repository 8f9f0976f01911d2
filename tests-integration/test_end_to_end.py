"""A confluent bank as the unknown term of an ODE, trained end to end by train_with_optax."""

import jax
import jax.numpy as jnp
import numpy as np

import confluent_bank as cb

import hybrid_problem as P

G_TOLERANCE = 0.05  # max |bank(y) - g(y)| over the observed range, after 400 steps


def test_dataset_has_many_experiments_in_several_buckets(standard_run):
    rows = sum(
        int(np.sum(np.asarray(bp.row_weights))) for bp in standard_run.dataset.bucket_payloads
    )
    assert rows >= 32
    assert len(standard_run.dataset.bucket_payloads) >= 2


def test_training_loss_falls_at_least_100x(standard_run):
    history = list(standard_run.history)
    assert np.all(np.isfinite(history))
    assert history[0] / min(history) >= 100.0


def test_learned_term_matches_the_true_term_over_the_data(standard_run):
    assert P.g_error(standard_run.bank, standard_run.domain) < G_TOLERANCE


def test_learned_term_is_far_better_than_the_initial_bank(standard_run):
    before = P.g_error(P.initial_bank(jnp.float64), standard_run.domain)
    assert P.g_error(standard_run.bank, standard_run.domain) < before / 5


def test_frozen_scales_never_move(standard_run):
    trained = np.asarray(standard_run.bank.scales)
    active = np.asarray(standard_run.bank.active)
    assert np.all(trained[active] == P.SCALE)


def test_trained_bank_is_still_a_valid_checkpointable_bank(standard_run):
    restored = cb.bank_from_checkpoint(standard_run.bank.checkpoint())
    assert cb.snapshot_digest(restored.portable_snapshot()) == cb.snapshot_digest(
        standard_run.bank.portable_snapshot()
    )
    z = jnp.linspace(*standard_run.domain, 64)
    assert jnp.array_equal(restored.forward(z), standard_run.bank.forward(z))


def test_trained_bank_forward_is_jittable(standard_run):
    z = jnp.linspace(*standard_run.domain, 16)
    assert jnp.allclose(
        jax.jit(cb.bank_forward)(standard_run.bank, z), standard_run.bank.forward(z)
    )
