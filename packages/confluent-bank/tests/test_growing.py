"""TransitionHook.growing: the library's own birth, merge, removal and stop decisions."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb
import confluent_bank._growing as growing

optax = pytest.importorskip("optax")
import confluent_bank.optax as cbo  # noqa: E402

DOMAIN = (-3.0, 3.0)
X = jnp.linspace(*DOMAIN, 61)
SCALE = 2.0


def _target(center):
    return 0.7 * jax.nn.sigmoid(SCALE * (X - center))


def _objective(target):
    return lambda bank: jnp.mean((bank.forward(X) - target) ** 2)


def _bank(packs, capacity=6):
    return cb.init_confluent_bank(packs, max_packs=capacity, max_order=2)


def _adam_state(bank):
    return optax.adam(1e-2).init(bank.parameters)


def _check(hook, bank, steps):
    """Call the hook at `steps` without training in between; returns the bank."""
    state = _adam_state(bank)
    for step in steps:
        bank, state = hook.between_steps(step, bank, state)
    return bank


ZERO_PAIR = [cb.RefinedPack(0, -2.9, 0.0, 1.0), cb.RefinedPack(0, 2.9, 0.0, 1.0)]
ONE_BIRTH = {"births": 1, "line_search": False}  # one exact birth per check, weight left at 0


def test_birth_is_at_the_grid_point_nearest_the_missing_atom():
    # The residual is exactly one candidate-shaped atom centred at 0.43; the grid has a
    # point at 0.45 (41 points over (-3, 3)), so that candidate is the best aligned.
    hook = cb.TransitionHook.growing(
        _objective(_target(0.43)), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), **ONE_BIRTH
    )
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("zero_output_birth", True, (2,))
    assert float(bank.centers[2]) == pytest.approx(0.45)
    assert float(bank.scales[2]) == SCALE and float(bank.weights[2]) == 0.0


def test_birth_score_is_the_normalised_weight_gradient():
    objective = _objective(_target(0.43))
    hook = cb.TransitionHook.growing(
        objective, DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), **ONE_BIRTH
    )
    start = _bank(ZERO_PAIR)
    bank = _check(hook, start, [1, 2])
    center = float(bank.centers[2])

    def with_weight(w):  # the born atom with weight w, built by hand
        return dataclasses.replace(
            start,
            centers=start.centers.at[2].set(center),
            scales=start.scales.at[2].set(SCALE),
            weights=start.weights.at[2].set(w),
            active=start.active.at[2].set(True),
        )

    gradient = jax.grad(lambda w: objective(with_weight(w)))(0.0)
    grid = jnp.linspace(*DOMAIN, hook.n_points)
    norm = jnp.sqrt(jnp.mean(jax.nn.sigmoid(SCALE * (grid - center)) ** 2))
    assert hook.events[0].score == pytest.approx(float(abs(gradient) / norm), rel=1e-9)


def _atom(center):
    """The candidate atom at `center` (slope SCALE) on the objective's points."""
    return jax.nn.sigmoid(SCALE * (X - center))


def test_a_newborn_weight_is_set_by_a_line_search_along_its_gradient():
    # The objective is quadratic in the newborn weight, so the parabola through the value,
    # the gradient and one trial point has the exact least-squares weight as its minimum.
    target = _target(0.43)
    objective = _objective(target)
    hook = cb.TransitionHook.growing(
        objective, DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=1
    )
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    birth, weight = hook.events
    assert (birth.kind, birth.accepted, birth.max_change) == ("zero_output_birth", True, 0.0)
    assert (weight.kind, weight.accepted, weight.slots) == ("newborn_weight", True, (2,))
    atom = _atom(float(bank.centers[2]))
    best = float(jnp.sum(atom * target) / jnp.sum(atom * atom))
    assert float(bank.weights[2]) == pytest.approx(best, rel=1e-9)
    assert weight.score == float(bank.weights[2])
    assert weight.loss_after == pytest.approx(float(objective(bank)), rel=1e-12)
    assert weight.loss_after < weight.loss_before == birth.loss_before
    grid = jnp.linspace(*DOMAIN, hook.n_points)
    change = abs(best) * float(jnp.max(jax.nn.sigmoid(SCALE * (grid - float(bank.centers[2])))))
    assert weight.max_change == pytest.approx(change, rel=1e-9)


def test_the_line_search_keeps_weight_zero_when_no_weight_lowers_the_objective():
    from confluent_bank._newborn import newborn_weight

    calls = []

    def worse(weight):
        calls.append(weight)
        return 1.0 + weight**2  # any move from 0 is worse: the gradient was wrong

    assert newborn_weight(worse, 1.0, 0.5) == (0.0, 1.0)
    assert calls == [-2.0, -0.5, -0.125, -0.03125]  # the trial point, then three quarters
    assert newborn_weight(lambda weight: float("nan"), 1.0, 0.5) == (0.0, 1.0)
    assert newborn_weight(worse, 1.0, 0.0) == (0.0, 1.0) and len(calls) == 4


def test_the_line_search_backtracks_from_a_trial_that_blows_up_instead_of_a_tiny_weight():
    from confluent_bank._newborn import newborn_weight

    def blows_up(weight):
        # Quadratic near 0, but past 0.3 the model is unstable (an ODE whose solution
        # explodes): a parabola through the trial point 1 would give a weight of 5e-13.
        return 1.0 - weight + weight**2 / 2 if weight <= 0.3 else 1e12

    weight, value = newborn_weight(blows_up, 1.0, -1.0)
    assert weight == 0.25  # the first quarter; the parabola's minimum (1) blows up too
    assert value == blows_up(0.25) < 1.0


def test_the_line_search_takes_a_quarter_step_after_a_non_finite_trial():
    from confluent_bank._newborn import newborn_weight

    calls = []

    def unstable(weight):
        calls.append(weight)
        return 1.0 - weight + weight**2 / 2 if weight <= 0.3 else float("inf")

    assert newborn_weight(unstable, 1.0, -1.0) == (0.25, 1.0 - 0.25 + 0.25**2 / 2)
    assert calls == [1.0, 0.25, 1.0]  # a quarter, then the parabola's minimum (no better)


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_a_trial_weight_whose_objective_raises_counts_as_a_blow_up(error):
    # A newborn weight can make the model's ODE unsolvable, and diffrax under throw=True
    # (a user's own diffeqsolve) raises instead of returning inf: an EquinoxRuntimeError,
    # or a ValueError through a plain jax.jit. A predator-prey fit through the trainer died
    # there, inside the line search (under a policy variant that birthed later).
    target = _target(0.43)
    objective = _objective(target)
    trials = []

    def fragile(bank):
        weight = bank.weights[2]
        if not isinstance(weight, jax.core.Tracer):  # the scoring pass traces it at 0
            trials.append(float(weight))
            if abs(float(weight)) > 0.5:
                raise error("The maximum number of solver steps was reached.")
        return objective(bank)

    hook = cb.TransitionHook.growing(
        fragile, DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=1
    )
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    trial, parabola = trials[-2:]  # the parabola's minimum (the best weight) raised
    assert 0 < trial <= 0.5 < parabola
    assert float(bank.weights[2]) == trial and hook.events[-1].accepted


def test_the_line_search_refuses_a_decrease_smaller_than_armijos():
    from confluent_bank._newborn import newborn_weight

    # Every trial lowers the objective, but by rounding only: no weight is worth it.
    assert newborn_weight(lambda weight: 1.0 - 1e-15, 1.0, -1.0) == (0.0, 1.0)


def test_newborns_get_real_weights_where_a_large_weight_destabilises_the_model():
    # Past |f| = 0.15 the model "explodes" (an ODE whose solution blows up): the first trial
    # weight of every candidate lands there. The parabola through it used to give weights
    # near 1e-15 that lowered the objective by rounding only, and three copies of the first
    # newborn were born at one check.
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)

    def objective(bank):
        f = bank.forward(X)
        return jnp.where(jnp.max(jnp.abs(f)) > 0.15, 1e12, jnp.mean((f - target) ** 2))

    hook = cb.TransitionHook.growing(
        objective, DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=3
    )
    _check(hook, _bank(ZERO_PAIR), [1, 2])
    weights = [e for e in hook.events if e.kind == "newborn_weight"]
    assert len(weights) == 3
    for event in weights:
        assert abs(event.score) > 1e-3
        assert event.loss_after < 0.9 * event.loss_before


def test_several_atoms_are_born_in_one_check_while_their_scores_stay_large():
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=2
    )
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    births = [e for e in hook.events if e.kind == "zero_output_birth"]
    assert [e.step for e in births] == [2, 2] and int(np.sum(np.asarray(bank.active))) == 4
    assert births[1].score >= births[0].score / 2  # the rule that let the second one in
    # Each birth is scored after the previous newborn's line search: a fresh gradient.
    assert births[1].loss_before < births[0].loss_before


def test_no_further_birth_in_a_check_once_the_best_score_halves():
    # The target is one candidate atom: born and line-searched, it leaves no residual, so
    # the next best score is far below half the first and the check births nothing more.
    target = 0.7 * _atom(0.45)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=3
    )
    _check(hook, _bank(ZERO_PAIR), [1, 2])
    assert [e.kind for e in hook.events] == ["zero_output_birth", "newborn_weight"]


def test_one_birth_per_check_with_births_1():
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=1
    )
    _check(hook, _bank(ZERO_PAIR), [1, 2])
    assert [e.kind for e in hook.events] == ["zero_output_birth", "newborn_weight"]


@pytest.mark.parametrize("line_search", [False, True])
def test_a_newborn_left_at_weight_zero_ends_the_checks_births(line_search, monkeypatch):
    # Left at 0 (no line search, or one that found no lower objective) the newborn changes
    # nothing, so every score is as it was and a second birth would copy the first.
    if line_search:
        monkeypatch.setattr(growing, "newborn_weight", lambda loss_at, value, g: (0.0, value))
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=3,
        line_search=line_search,
    )  # fmt: skip
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    kinds = ["zero_output_birth", "newborn_weight"] if line_search else ["zero_output_birth"]
    assert [e.kind for e in hook.events] == kinds
    assert int(np.sum(np.asarray(bank.active))) == 3


def test_a_line_search_that_finds_no_lower_objective_is_a_refused_event(monkeypatch):
    monkeypatch.setattr(growing, "newborn_weight", lambda loss_at, value, g: (0.0, value))
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=3
    )
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2])
    birth, search = hook.events
    assert (search.kind, search.accepted, search.slots) == ("newborn_weight", False, birth.slots)
    assert (search.score, search.max_change) == (0.0, 0.0)
    assert search.loss_after == search.loss_before == birth.loss_after
    assert float(bank.weights[2]) == 0.0


def _ramped_checks(hook, bank, steps, warmup):
    """Call the hook at `steps` with `row_warmup(adam, warmup)` making one zero-gradient
    update after each check (enough to advance its ramps); returns the bank."""
    optimizer = cbo.row_warmup(optax.adam(1e-2), steps=warmup)
    state = optimizer.init(bank.parameters)
    for step in steps:
        bank, state = hook.between_steps(step, bank, state)
        zeros = jax.tree.map(jnp.zeros_like, bank.parameters)
        _, state = optimizer.update(zeros, state, bank.parameters)
    return bank


# Two atoms that stay (a removal restarts its freed rows' ramps too).
KEPT_PAIR = [cb.RefinedPack(0, -2.9, 0.3, 1.0), cb.RefinedPack(0, 2.9, -0.3, 1.0)]


def test_births_wait_until_the_newborns_ramp_is_done():
    target = 0.7 * _atom(0.43) - 0.6 * _atom(-1.6)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=1
    )
    _ramped_checks(hook, _bank(KEPT_PAIR), range(1, 9), warmup=3)
    births = [e.step for e in hook.events if e.kind == "zero_output_birth"]
    # Born at 2; its rows restart at 0 and count 1, 2 at checks 3, 4; warm (3) at check 5.
    assert births == [2, 5, 8]


def test_a_stop_waits_until_the_newborns_ramp_is_done():
    # The newborn stays at weight 0 and so cannot pay off: the first check at which it is
    # warm (and at least two checks old) stops growth; while it ramps in, nothing is decided.
    kept = _bank(KEPT_PAIR)
    target = kept.forward(X) + 1e-3 * _atom(0.43)
    hook = cb.TransitionHook.growing(
        _objective(target), DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), births=1,
        line_search=False, prune_checks=100,
    )  # fmt: skip
    _ramped_checks(hook, kept, range(1, 12), warmup=5)
    assert [(e.step, e.kind) for e in hook.events] == [
        (2, "zero_output_birth"),
        (7, "stop_growing"),
    ]


def test_ramping_in_reads_row_warmup_counters():
    from confluent_bank._newborn import ramping_in

    bank = _bank(ZERO_PAIR)
    optimizer = cbo.row_warmup(optax.adam(1e-2), steps=2)
    state = optimizer.init(bank.parameters)
    assert not ramping_in(state) and not ramping_in(optax.adam(1e-2).init(bank.parameters))
    born = state._replace(ramp={**state.ramp, "weights": state.ramp["weights"].at[2].set(0)})
    assert ramping_in(born) and ramping_in((optax.EmptyState(), born))
    zeros = jax.tree.map(jnp.zeros_like, bank.parameters)
    for expected in (True, False):
        _, born = optimizer.update(zeros, born, bank.parameters)
        assert ramping_in(born) == expected


def test_colliding_atoms_are_merged_into_a_pair_with_merge_into_pair():
    packs = [cb.RefinedPack(0, 0.0, 1.0, 1.0), cb.RefinedPack(0, 0.01, -0.5, 1.0)]
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=2, merge_into="pair"
    )
    start = _bank(packs)
    bank = _check(hook, start, [1])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("centered_pair", True, (0, 1))
    assert event.score == pytest.approx(0.01)
    assert int(bank.modes[0]) == cb.SlotMode.PAIR and not bool(bank.active[1])
    assert event.max_change <= 1e-13  # a pair merge is exact


@pytest.mark.parametrize(
    ("merge_into", "kind"), [("pair", "centered_pair"), ("moments", "cluster_to_moments")]
)
def test_only_the_colliding_pair_is_merged_among_far_atoms(merge_into, kind):
    packs = [
        cb.RefinedPack(0, 0.0, 1.0, 1.0),
        cb.RefinedPack(0, 1.5, 0.4, 1.0),
        cb.RefinedPack(0, 0.01, -0.5, 1.0),
        cb.RefinedPack(0, -1.0, 0.3, 1.0),
    ]
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=4, merge_into=merge_into
    )
    _check(hook, _bank(packs), [1])
    merges = [e for e in hook.events if e.kind == kind]
    assert [(e.accepted, e.slots) for e in merges] == [(True, (0, 2))]
    assert merges[0].score <= hook.merge_distance


def test_far_apart_atoms_are_not_merged():
    packs = [cb.RefinedPack(0, 0.0, 1.0, 1.0), cb.RefinedPack(0, 0.5, -0.5, 1.0)]
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=2)
    _check(hook, _bank(packs), [1])
    assert hook.events == []


def test_atoms_at_one_centre_with_different_slopes_are_not_merged():
    # A centred pair shares one slope: atoms of slopes 1 and 2 have not collided.
    packs = [cb.RefinedPack(0, 0.0, 1.0, 1.0), cb.RefinedPack(0, 0.0, -0.5, 2.0)]
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=2)
    _check(hook, _bank(packs), [1])
    assert hook.events == []


COLLIDED = [cb.RefinedPack(0, 0.0, 1.0, 1.0), cb.RefinedPack(0, 0.01, -0.5, 1.0)]


def _near_zero_budget(bank, prune_tol=1e-3, n_points=401):
    grid = jnp.linspace(*DOMAIN, n_points)
    return prune_tol * float(jnp.max(jnp.abs(bank.forward(grid))))


def test_colliding_atoms_are_merged_into_one_moment_slot_by_default():
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=2)
    start = _bank(COLLIDED)
    bank = _check(hook, start, [1])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("cluster_to_moments", True, (0, 1))
    assert event.score == pytest.approx(0.01)
    assert int(bank.modes[0]) == cb.SlotMode.MOMENTS and not bool(bank.active[1])
    grid = jnp.linspace(*DOMAIN, 401)
    change = float(jnp.max(jnp.abs(bank.forward(grid) - start.forward(grid))))
    assert 0 < change <= _near_zero_budget(start)  # a truncation, within a removal's budget
    assert event.loss_after == pytest.approx(float(_objective(_target(0.0))(bank)), rel=1e-12)


def test_a_moment_merge_takes_the_lowest_order_within_the_budget():
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=2, merge_into="moments"
    )
    start = _bank(COLLIDED)
    order = int(_check(hook, start, [1]).orders[0])
    accept, budget = cb.within_error_budget(DOMAIN), _near_zero_budget(start)
    assert 0 < order < start.max_order  # order 0 drops the pair's difference: too coarse here
    lower = start.propose_cluster((0, 1), order=order - 1, error_budget=budget)
    assert not accept(start, lower)


def _chain(*centers_and_weights):
    return [cb.RefinedPack(0, c, w, 1.0) for c, w in centers_and_weights]


def test_atoms_joined_through_collisions_merge_into_one_moment_slot():
    # 0 and 0.02 are 0.02 apart, within merge_distance too; 0.01 joins them either way.
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=3)
    start = _bank(_chain((0.0, 1.0), (0.01, -0.5), (0.02, 0.8)))
    bank = _check(hook, start, [1])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("cluster_to_moments", True, (0, 1, 2))
    assert event.score == pytest.approx(0.02)  # the group's largest distance
    assert np.asarray(bank.active).tolist() == [True] + [False] * 5
    assert 0 < event.max_change <= _near_zero_budget(start)


def test_a_group_beyond_the_budget_merges_its_closest_pair_alone():
    # At order <= 1 the three atoms (0.05 across) do not fit the budget; the closest two,
    # 0.001 apart, do, and the third stays as it was.
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=3)
    start = cb.init_confluent_bank(
        _chain((0.0, 1.0), (0.001, -0.5), (0.05, 0.8)), max_packs=6, max_order=1
    )
    bank = _check(hook, start, [1])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("cluster_to_moments", True, (0, 1))
    assert event.score == pytest.approx(0.001)
    assert np.asarray(bank.active).tolist() == [True, False, True] + [False] * 3
    assert int(bank.modes[2]) == cb.SlotMode.ORDINARY
    assert float(bank.centers[2]) == 0.05 and float(bank.weights[2]) == 0.8


def test_births_after_a_moment_merge_start_from_the_objective_after_it():
    objective = _objective(_target(1.5))
    hook = cb.TransitionHook.growing(objective, DOMAIN, every=1, plateau=np.inf, **ONE_BIRTH)
    state = _adam_state(_bank(COLLIDED))
    hook.between_steps(1, _bank(ZERO_PAIR), state)  # a first check: the plateau's reference
    bank, _ = hook.between_steps(2, _bank(COLLIDED), state)
    merge, birth = hook.events[-2:]
    assert (merge.kind, birth.kind) == ("cluster_to_moments", "zero_output_birth")
    assert merge.loss_after != merge.loss_before  # a truncation moves the objective a little
    assert birth.loss_before == merge.loss_after == pytest.approx(float(objective(bank)))


def test_a_collision_no_moment_order_holds_within_the_budget_becomes_an_exact_pair():
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=2, merge_into="moments"
    )
    start = cb.init_confluent_bank(COLLIDED, max_packs=6, max_order=0)  # order 0 only: too coarse
    bank = _check(hook, start, [1])
    (event,) = hook.events
    assert (event.kind, event.accepted, event.slots) == ("centered_pair", True, (0, 1))
    assert int(bank.modes[0]) == cb.SlotMode.PAIR and event.max_change <= 1e-13


def test_a_bank_built_without_pairs_merges_into_moments():
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, every=1, max_active=2)
    bank = _check(
        hook, cb.init_confluent_bank(COLLIDED, max_packs=6, max_order=2, max_pairs=0), [1]
    )
    assert [(e.kind, e.accepted) for e in hook.events] == [("cluster_to_moments", True)]
    assert int(bank.modes[0]) == cb.SlotMode.MOMENTS and bank.max_pairs == 0


def test_a_pair_merge_policy_on_a_bank_built_without_pairs_is_refused_by_name():
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=2, merge_into="pair"
    )
    bank = cb.init_confluent_bank(COLLIDED, max_packs=6, max_order=2, max_pairs=0)
    with pytest.raises(ValueError, match=r"merge_into='pair' .* bank at \[0\] .*max_pairs=0"):
        hook.between_steps(1, (bank,), _adam_state(bank))


def test_an_atom_near_zero_for_prune_checks_checks_is_removed():
    packs = [cb.RefinedPack(0, 0.0, 1.0, 1.0), cb.RefinedPack(0, 1.0, 1e-7, 1.0)]
    hook = cb.TransitionHook.growing(
        _objective(_target(0.0)), DOMAIN, every=1, max_active=2, prune_checks=2,
        line_search=False,
    )  # fmt: skip
    start = _bank(packs)
    once = _check(hook, start, [1])
    assert hook.events == [] and bool(once.active[1])
    bank = _check(hook, once, [2])
    event = hook.events[0]  # the freed slot may then take a birth
    assert (event.kind, event.accepted, event.slots) == ("remove_near_zero", True, (1,))
    assert event.score == pytest.approx(1e-7)
    assert float(bank.weights[1]) == 0.0 and int(bank.transition_version) >= 1
    assert 0 < event.max_change <= event.score


def test_growth_stops_when_the_last_birth_did_not_improve_the_objective():
    # Without training between checks the objective never improves: one birth fills
    # max_active, and two checks later the policy judges it and stops.
    hook = cb.TransitionHook.growing(
        _objective(_target(0.43)), DOMAIN, every=1, max_active=3, scales=(SCALE,),
        prune_checks=9, line_search=False,
    )  # fmt: skip
    bank = _check(hook, _bank(ZERO_PAIR), [1, 2, 3, 4])
    kinds = [event.kind for event in hook.events]
    assert kinds == ["zero_output_birth", "stop_growing"]
    assert hook.stopped and hook.events[1].score == 0.0 and hook.events[1].step == 4
    hook.max_active = 6  # room again, but a stopped policy births nothing
    _check(hook, bank, [5, 6])
    assert len(hook.events) == 2


def _unpaid_birth(**options):
    """A kept bank a tiny atom short of its target, and a hook that births one atom per
    check at weight 0 (which `prune_checks=1` then removes at the next check)."""
    kept = _bank(KEPT_PAIR)
    objective = _objective(kept.forward(X) + 1e-3 * _atom(0.43))
    options = {"prune_checks": 1, **ONE_BIRTH, **options}
    hook = cb.TransitionHook.growing(
        objective, DOMAIN, every=1, plateau=np.inf, scales=(SCALE,), **options
    )
    return kept, hook


def test_growth_stops_once_every_newborn_of_the_last_births_was_removed():
    # The newborn stays at weight 0, so the next check removes it as near zero; that check
    # stops growth, before the two checks the gain rule waits for.
    kept, hook = _unpaid_birth()
    _check(hook, kept, [1, 2, 3, 4])
    assert [(e.step, e.kind, e.accepted) for e in hook.events] == [
        (2, "zero_output_birth", True),
        (3, "remove_near_zero", True),
        (3, "stop_growing", True),
    ]
    assert hook.stopped and hook.events[-1].score == 0.0


def test_the_check_after_a_birth_neither_births_nor_stops():
    # The newborn is not removed and the objective does not move: the next check waits for
    # it, and only the gain rule, two checks after the birth, can stop the growth.
    kept, hook = _unpaid_birth(prune_checks=9)
    _check(hook, kept, [1, 2, 3])
    assert [(e.step, e.kind) for e in hook.events] == [(2, "zero_output_birth")]
    assert not hook.stopped
    _check(hook, kept, [4])
    assert [(e.step, e.kind) for e in hook.events[1:]] == [(4, "stop_growing")]


def test_a_bump_after_a_birth_is_not_a_plateau():
    # Adam's first full steps on a newborn's fresh rows raise the objective for a while.
    # Read as a plateau, that bump birthed again at every check: an SEIR fit through the
    # trainer filled its 12 slots in 100 steps and learned its incidence worse. The check
    # during the bump waits; once the objective is below its value at the birth, the
    # policy grows on.
    kept, hook = _unpaid_birth(prune_checks=9)
    level = [1.0]
    base = hook.objective
    hook.objective = lambda bank: level[0] * base(bank)
    bank = kept
    for step, factor in [(1, 1.0), (2, 1.0), (3, 5.0), (4, 0.5)]:
        level[0] = factor
        bank = _check(hook, bank, [step])
    assert [(e.step, e.kind) for e in hook.events] == [
        (2, "zero_output_birth"),
        (4, "zero_output_birth"),
    ]
    assert not hook.stopped


def test_stop_tol_zero_keeps_growing_after_the_newborns_were_removed():
    kept, hook = _unpaid_birth(stop_tol=0.0)
    _check(hook, kept, [1, 2, 3, 4])
    kinds = [e.kind for e in hook.events]
    assert "remove_near_zero" in kinds and "stop_growing" not in kinds and not hook.stopped


def test_a_resumed_hook_stops_once_the_saved_newborns_are_removed():
    # The stop reads the saved events: a hook resumed between the birth and the removal
    # decides as the uninterrupted one.
    kept, hook = _unpaid_birth()
    bank = _check(hook, kept, [1, 2])
    state = json.loads(json.dumps(hook.state_dict()))
    _, resumed = _unpaid_birth()
    resumed.load_state_dict(state)
    _check(resumed, bank, [3])
    assert [e.kind for e in resumed.events[-2:]] == ["remove_near_zero", "stop_growing"]


def test_no_check_between_multiples_of_every():
    hook = cb.TransitionHook.growing(_objective(_target(0.43)), DOMAIN, every=5, plateau=np.inf)
    _check(hook, _bank(ZERO_PAIR), [1, 2, 3, 4, 6, 7])
    assert hook.events == [] and hook.state_dict()["previous"] is None


def test_events_are_json_serialisable_with_their_scores():
    hook = cb.TransitionHook.growing(_objective(_target(0.43)), DOMAIN, every=1, plateau=np.inf)
    _check(hook, _bank(ZERO_PAIR), [1, 2])
    data = json.loads(json.dumps(dataclasses.asdict(hook.events[0])))
    assert data["score"] == hook.events[0].score > 0
    assert cb.TransitionEvent(**data) == hook.events[0]


@pytest.fixture(scope="module")
def training():
    """A 2-atom bank fitting a curve with Adam, checked every 10 steps: a growing run."""
    target = 0.5 * jnp.tanh(X) + 0.2 * jnp.exp(-(X**2))
    objective = _objective(target)
    optimizer = cbo.row_warmup(optax.adam(3e-2), steps=10)
    traces = []

    @jax.jit
    def step(bank, state):
        traces.append(1)
        params = bank.parameters
        grads = jax.grad(lambda p: objective(bank.with_parameters(p)))(params)
        updates, state = optimizer.update(grads, state, params)
        return bank.with_parameters(optax.apply_updates(params, updates)), state

    def run(hook, bank, state, steps):
        for i in steps:
            bank, state = step(bank, state)
            bank, state = hook.between_steps(i, bank, state)
        return bank, state

    def make_hook():
        return cb.TransitionHook.growing(jax.jit(objective), DOMAIN, every=10, plateau=0.5)

    bank = _bank([cb.RefinedPack(0, -1.0, 0.0, 1.0), cb.RefinedPack(0, 1.0, 0.0, 1.0)], 8)
    return run, make_hook, bank, optimizer.init(bank.parameters), traces


def test_a_grown_run_resumes_from_the_bank_checkpoint_and_the_hook_state(training, tmp_path):
    run, make_hook, bank, state, _ = training
    hook = make_hook()
    bank, state = run(hook, bank, state, range(1, 61))
    assert any(e.kind == "zero_output_birth" for e in hook.events)
    cb.save_checkpoint(tmp_path / "bank.json", bank)
    saved = json.dumps(hook.state_dict())
    ahead, _ = run(hook, bank, state, range(61, 121))

    resumed = make_hook()
    resumed.load_state_dict(json.loads(saved))
    again, _ = run(resumed, cb.load_checkpoint(tmp_path / "bank.json"), state, range(61, 121))
    assert resumed.events == hook.events
    for name in cb.STATE_NAMES:
        assert np.array_equal(np.asarray(getattr(again, name)), np.asarray(getattr(ahead, name)))


def test_growth_never_recompiles_the_training_step(training):
    run, make_hook, bank, state, traces = training
    traces.clear()
    hook = make_hook()
    grown, _ = run(hook, bank, state, range(1, 61))
    births = [e for e in hook.events if e.kind == "zero_output_birth" and e.accepted]
    assert births and int(np.sum(np.asarray(grown.active))) > 2
    assert len(traces) <= 1  # at most the first compilation; none for a commit


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"every": 0}, "every must be a positive integer"),
        ({"max_active": -1}, "max_active must be a positive integer"),
        ({"plateau": -0.1}, "plateau must be a finite number >= 0"),
        ({"stop_tol": float("nan")}, "stop_tol must be a finite number >= 0"),
        ({"scales": (1.0, 0.0)}, "scales must be finite numbers > 0"),
        ({"orders": (-1,)}, "orders must be integers >= 0"),
        ({"prune_checks": 0}, "prune_checks must be a positive integer"),
        ({"births": 0}, "births must be a positive integer"),
        ({"line_search": 1}, "line_search must be True or False"),
        ({"merge_into": "pairs"}, "merge_into must be 'pair' or 'moments'"),
    ],
)
def test_growing_refuses_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN, **options)


def test_growing_needs_a_callable_objective_and_a_wide_domain():
    with pytest.raises(TypeError, match="objective must be callable"):
        cb.TransitionHook.growing("loss", DOMAIN)
    with pytest.raises(ValueError, match="lo < hi"):
        cb.TransitionHook.growing(_objective(_target(0.0)), (1.0, 1.0))


def test_load_state_dict_refuses_a_foreign_state():
    hook = cb.TransitionHook.growing(_objective(_target(0.0)), DOMAIN)
    with pytest.raises(ValueError, match="state_dict"):
        hook.load_state_dict({"events": []})


FLOAT32_CHILD = """
import json, jax, jax.numpy as jnp, numpy as np, optax
import confluent_bank as cb
import confluent_bank._growing as growing
assert not jax.config.jax_enable_x64
X = jnp.linspace(-3, 3, 61)
Y = 0.7 * jax.nn.sigmoid(2.0 * (X - 0.43))
packs = [cb.RefinedPack(0, -2.9, 0.0), cb.RefinedPack(0, 2.9, 0.0)]
bank = cb.init_confluent_bank(packs, max_packs=6, max_order=2)
objective = lambda b: jnp.mean((b.forward(X) - Y) ** 2)
hook = cb.TransitionHook.growing(objective, (-3.0, 3.0), every=1, plateau=np.inf, scales=(2.0,))
state = optax.adam(1e-2).init(bank.parameters)
for step in (1, 2):
    bank, state = hook.between_steps(step, bank, state)
print(json.dumps({"center": float(bank.centers[2]), "dtype": str(bank.centers.dtype),
                  "kind": hook.events[0].kind, "score": hook.events[0].score}))
"""


def test_growing_works_in_float32():
    # x64 is on in this process; the float32 facts are measured in a fresh one.
    env = {**os.environ, "JAX_ENABLE_X64": "0", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", FLOAT32_CHILD], capture_output=True, text=True, env=env, check=True
    )
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["dtype"] == "float32" and facts["kind"] == "zero_output_birth"
    assert facts["center"] == pytest.approx(0.45, abs=1e-6) and facts["score"] > 0
