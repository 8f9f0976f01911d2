"""A bank that grows itself, trained by hybrid-kernels' trainer on the training loss.

The bank starts from 2 atoms inside `simulate_fn`; the hook is
`confluent_bank.TransitionHook.growing(objective, domain, max_active=6)` with every other
option at its default and the objective built by `hybrid_kernels.build_objective` from the
same pieces the trainer gets. Neither package imports the other: this file is where they
meet. The reference is the example's hand-placed bank (six atoms at `g`'s own slope,
`hybrid_problem.initial_bank`) trained on the same data for the same steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb
import hybrid_kernels as hk

import hybrid_problem as P

SIZE = P.ProblemSize(n_experiments=12, lengths=(8, 12))
STEPS = 160
EVERY = 20  # the policy's default
MAX_ACTIVE = 6


@dataclasses.dataclass
class Run:
    history: Any
    bank: Any
    hook: Any
    simulate: P.TraceCounter


@pytest.fixture(scope="module")
def problem() -> dict[str, Any]:
    dataset = P.make_dataset(SIZE, dtype=jnp.float64, max_shapes=1)
    solver = P.make_solver(jnp.float64)
    trainable = P.bank_trainable((P.two_broad_atoms(jnp.float64),))
    simulate = P.TraceCounter(P.simulate)
    objective = hk.build_objective(
        dataset,
        simulate_fn=simulate,
        state_to_output=P.state_to_output,
        solver=solver,
        trainable=trainable,
    )
    return dict(
        dataset=dataset,
        solver=solver,
        trainable=trainable,
        objective=CountingObjective(objective, simulate),
        domain=P.data_range(dataset),
    )


class CountingObjective:
    """The objective, noting for each call the bank's capacity and the traces so far."""

    def __init__(self, objective: Any, simulate: P.TraceCounter):
        self.objective, self.simulate = objective, simulate
        self.calls: list[tuple[int, int]] = []

    def __call__(self, predictors: Any) -> Any:
        value = self.objective(predictors)
        self.calls.append((int(predictors[0].centers.shape[0]), self.simulate.count))
        return value


def train(problem: dict[str, Any], hook: Any, predictors: Any = None, **config: Any) -> Run:
    simulate = P.TraceCounter(P.simulate)
    predictors = (P.two_broad_atoms(jnp.float64),) if predictors is None else predictors
    settings = dict(steps=(STEPS,), lr=(0.05,), verbose=False, log_every=STEPS, **config)
    history, trained = hk.train_with_optax(
        predictors,
        problem["dataset"],
        hk.OptaxTrainingConfig(**settings),
        simulate_fn=simulate,
        state_to_output=P.state_to_output,
        solver=problem["solver"],
        trainable=problem["trainable"],
        key=jax.random.key(0),
        hooks=hook,
    )
    return Run(history, trained[0], hook, simulate)


def growing_hook(problem: dict[str, Any]) -> cb.TransitionHook:
    return cb.TransitionHook.growing(problem["objective"], problem["domain"], max_active=MAX_ACTIVE)


@pytest.fixture(scope="module")
def grown(problem) -> Run:
    return train(problem, growing_hook(problem))


@pytest.fixture(scope="module")
def hand_placed(problem) -> Run:
    """Six atoms placed by hand at g's own slope, same steps; the hook only retracts."""
    # The objective's trainable mask was built from the grown bank, whose static configuration
    # (max_pairs=0) a mask must match; this bank holds no pair either.
    predictors = (P.initial_bank(jnp.float64, max_pairs=0),)
    return train(problem, P.transition_hook({}, problem["domain"]), predictors)


def _births(run: Run) -> list[cb.TransitionEvent]:
    return [e for e in run.hook.events if e.kind == "zero_output_birth" and e.accepted]


def test_the_bank_grew_by_accepted_births_with_scores(grown):
    births = _births(grown)
    assert births
    assert all(e.score is not None and e.score > 0 for e in births)
    # A removal frees a slot; a merge of two atoms (into a moment slot or a pair) frees one.
    merges_and_removals = ("remove_near_zero", "cluster_to_moments", "centered_pair")
    freed = sum(e.accepted for e in grown.hook.events if e.kind in merges_and_removals)
    assert int(np.sum(np.asarray(grown.bank.active))) == 2 + len(births) - freed
    assert int(np.sum(np.asarray(grown.bank.active))) <= MAX_ACTIVE


def test_the_trainer_records_the_growth_in_the_history(grown):
    recorded = [(e["step"], e["kind"], e["accepted"], e["score"]) for e in grown.history.events]
    assert recorded == [(e.step, e.kind, e.accepted, e.score) for e in grown.hook.events]


def test_growth_does_not_retrace_the_trainers_simulate_fn(problem, grown, hand_placed):
    # One trace per bucket shape for the training kernel, with or without births: the
    # candidate scoring and the newborns' line searches run the objective's own kernel,
    # never the trainer's.
    buckets = len(problem["dataset"].bucket_payloads)
    assert grown.simulate.count == hand_placed.simulate.count == buckets


def test_the_objective_compiles_once_for_the_wider_scoring_bank(problem, grown):
    # Candidate scoring calls the objective on the bank widened by every candidate: a new
    # shape, compiled at the first scoring and reused by every later check and scoring.
    calls = problem["objective"].calls
    capacity = int(grown.bank.centers.shape[0])
    wide = [i for i, (width, _) in enumerate(calls) if width > capacity]
    assert len(wide) >= 2
    assert calls[-1][1] == calls[wide[0]][1]


def test_the_grown_bank_reaches_the_hand_placed_banks_loss(problem, grown, hand_placed):
    # Measured: grown 6.5e-5 (4 atoms), hand-placed 9.1e-5 (docs/integration.md).
    objective = problem["objective"]
    grown_loss = float(objective((grown.bank,)))
    hand_loss = float(objective((hand_placed.bank,)))
    print(f"final objective: grown {grown_loss:.3e}, six hand-placed atoms {hand_loss:.3e}")
    assert grown_loss <= hand_loss


class Stop(Exception):
    pass


@pytest.mark.slow  # two more partial runs: about 40 s on a 2-core CPU
def test_a_run_resumed_mid_growth_ends_like_the_uninterrupted_one(problem, grown, tmp_path):
    # The trainer saves the hook's state_dict() in its checkpoint and hands it back to
    # load_state_dict on resume, so the policy's counters and events survive the restart.
    births = [e.step for e in _births(grown)]
    interrupt = births[0] + EVERY + 10  # after the first birth, before the run ends
    assert interrupt < STEPS
    path = tmp_path / "growing.state"
    config = dict(checkpoint_path=path, checkpoint_every=10)
    hook = growing_hook(problem)
    between_steps = hook.between_steps

    def stop_at_interrupt(step, predictors, opt_state):
        if step == interrupt:
            raise Stop
        return between_steps(step, predictors, opt_state)

    hook.between_steps = stop_at_interrupt
    with pytest.raises(Stop):
        train(problem, hook, **config)
    resumed = train(problem, growing_hook(problem), **config)
    assert resumed.history.events == grown.history.events
    assert [dataclasses.astuple(e) for e in resumed.hook.events] == [
        dataclasses.astuple(e) for e in grown.hook.events
    ]
    objective = problem["objective"]
    assert float(objective((resumed.bank,))) == pytest.approx(
        float(objective((grown.bank,))), rel=1e-9
    )


def test_a_bank_keeps_growing_through_adam_then_lbfgs(problem):
    # The field's recipe: Adam, then L-BFGS. A birth in the L-BFGS phase restarts its
    # curvature memory (confluent_bank.optax), and the run goes on to a lower loss. Births
    # at every other check (the one after a birth waits): 10, 20 and 30.
    hook = cb.TransitionHook.growing(
        problem["objective"], problem["domain"], every=5, plateau=float("inf"), births=1
    )
    history, trained = hk.train_with_optax(
        (P.two_broad_atoms(jnp.float64),),
        problem["dataset"],
        hk.OptaxTrainingConfig(
            steps=(20, 20), lr=(0.05, 1.0), optimizer=("adam", "lbfgs"), verbose=False
        ),
        simulate_fn=P.simulate,
        state_to_output=P.state_to_output,
        solver=problem["solver"],
        trainable=problem["trainable"],
        key=jax.random.key(0),
        hooks=hook,
    )
    births = [e.step for e in _births(Run(history, trained[0], hook, None))]
    assert births == [10, 20, 30]  # the last in the L-BFGS phase
    losses = np.asarray(history)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[20]
