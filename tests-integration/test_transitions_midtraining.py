"""Bank transitions committed between optimiser steps, with the optax adapter."""

import numpy as np

import hybrid_problem as P

EXACT_TOLERANCE = 1e-13  # float64: exact commits change only the rounding of stored values


def _events(run, kind):
    return [e for e in run.hook.events if e.kind == P.PLAN_KINDS[kind]]


def test_every_planned_transition_was_proposed(standard_run):
    kinds = [e.kind for e in standard_run.hook.events]
    assert kinds == [P.PLAN_KINDS[P.STANDARD_PLAN[s]] for s in sorted(P.STANDARD_PLAN)]


def test_exact_transitions_are_always_accepted(standard_run):
    assert all(e.accepted for kind in ("pair", "birth") for e in _events(standard_run, kind))


def test_the_trainer_records_every_event_in_the_history(standard_run):
    recorded = [(e["step"], e["kind"], e["accepted"]) for e in standard_run.history.events]
    assert recorded == [(e.step, e.kind, e.accepted) for e in standard_run.hook.events]


def test_pair_merge_leaves_the_function_unchanged(standard_run):
    (event,) = _events(standard_run, "pair")
    assert event.max_change <= EXACT_TOLERANCE


def test_birth_leaves_the_function_unchanged(standard_run):
    (event,) = _events(standard_run, "birth")
    assert event.max_change <= EXACT_TOLERANCE


def test_cluster_to_moments_stays_within_its_error_budget(standard_run):
    # Accepted: the change is within the budget. Rejected: the bank is returned unchanged.
    (event,) = _events(standard_run, "cluster")
    assert event.max_change <= (1e-3 if event.accepted else 0.0)


def test_loss_does_not_jump_at_a_commit(standard_run):
    for event in standard_run.hook.events:
        # MSE moves by at most 2 sqrt(loss) |df| + |df|^2 when the function moves by |df|.
        bound = 2 * np.sqrt(event.loss_before) * event.max_change + event.max_change**2
        assert abs(event.loss_after - event.loss_before) <= bound + 1e-14, event


def test_commits_do_not_retrace_simulate_fn(standard_run):
    # One trace per bucket shape for the training kernel, none for any of the commits.
    assert standard_run.simulate.count == len(standard_run.dataset.bucket_payloads)


def test_committed_structure_is_visible_in_the_trained_bank(standard_run):
    modes = set(np.asarray(standard_run.bank.modes)[np.asarray(standard_run.bank.active)])
    (cluster,) = _events(standard_run, "cluster")
    assert 1 in modes  # the centred pair survives training
    assert (2 in modes) == cluster.accepted  # and so does the moment slot, if one was made
