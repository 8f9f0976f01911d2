"""Issue 24: on the integration tests' standard problem, a bank grown from 2 atoms by
`TransitionHook.growing` (its defaults, `max_active=6`: collided atoms merge into a moment
slot) reaches the accuracy of the hand-scheduled bank of `conftest.standard_run` (six
hand-placed atoms, a merge at step 80, a birth at 100, a cluster at 120), trained on the
same data with the same configuration."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import hybrid_problem as P

G_TOLERANCE = 0.05  # test_end_to_end's bound on the hand-scheduled bank's max |bank − g|
MERGES = ("cluster_to_moments", "centered_pair")


@pytest.fixture
def grown(grown_run) -> tuple[Any, Any, Any]:
    return grown_run.history, grown_run.bank, grown_run.hook


def test_the_grown_bank_grew_from_two_atoms_with_no_schedule(grown):
    _, bank, hook = grown
    births = [e for e in hook.events if e.kind == "zero_output_birth" and e.accepted]
    assert len(births) >= 2 and all(e.score > 0 for e in births)
    assert 2 < int(bank.active.sum()) <= 6


def test_no_birth_comes_at_the_check_right_after_a_birth(grown):
    # Under the trainer's plain Adam a newborn bumps the loss for a few steps; until the
    # policy waited a check, the bump after the birth at 220 counted as a plateau at 240.
    _, _, hook = grown
    steps = sorted({e.step for e in hook.events if e.kind == "zero_output_birth"})
    gaps = [later - earlier for earlier, later in itertools.pairwise(steps)]
    assert gaps and min(gaps) >= 2 * hook.every


def test_the_grown_bank_reaches_the_hand_scheduled_banks_loss(grown, standard_run):
    history, _, _ = grown
    assert len(history) == len(standard_run.history)
    assert history[-1] <= standard_run.history[-1]


RMS_MARGIN = 1.05  # one start is one draw: see the docstring below


def test_the_grown_bank_learns_g_as_well_as_the_hand_scheduled_bank(grown, standard_run):
    """Accuracy over the observed range is the RMS error of `g`; the grown bank's may be at
    most 5 % above the hand-scheduled bank's. The largest error sits at one end of the range,
    where one or two observations pin `g`, and which end depends on the optimizer state after
    the merge. The runs are chaotic: with the two starting atoms moved by −0.05, 0, 0.05 and
    0.1, the grown bank ended at RMS 0.0097, 0.0097, 0.0134 and 0.0090 with its default moment
    merge, and at 0.0095, 0.0095, 0.0135 and 0.0090 with `merge_into="pair"` (2026-12-06; no
    atoms collided from the last start), against 0.0098 for the hand-scheduled bank, whose
    own max error moved from 0.039 to 0.029 when a pair's fresh `directions` got its seed
    (2026-12-05). This start's loss is 0.13x the hand-scheduled bank's, its RMS 0.99x, its
    max error 0.97x."""
    _, bank, _ = grown
    domain = standard_run.domain
    grown_rms = P.g_rms_error(bank, domain)
    assert grown_rms <= RMS_MARGIN * P.g_rms_error(standard_run.bank, domain)


def test_the_grown_bank_meets_the_end_to_end_tolerance_for_g(grown, standard_run):
    assert P.g_error(grown[1], standard_run.domain) < G_TOLERANCE


def test_training_goes_on_smoothly_after_the_policys_merges(grown):
    """The steps after a merge, not only its instant: for 20 steps after each accepted merge
    the loss stays below twice the objective at the merge (measured: it fell from 2.5e-4 to
    1.0e-4 within 3 steps of the moment merge at step 80)."""
    history, _, hook = grown
    merges = [e for e in hook.events if e.accepted and e.kind in MERGES]
    assert merges  # two of the newborns collide on this problem (their slope is frozen)
    for event in merges:
        after = list(history)[event.step : event.step + 20]
        assert len(after) == 20 and max(after) <= 2 * event.loss_before
