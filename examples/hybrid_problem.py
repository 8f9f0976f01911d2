"""The end-to-end problem shared by the integration tests and the demo.

A scalar ODE with a known linear part and an unknown part ``g``:

    dy/dt = -K * y + g(y),   g(y) = A1 * sigmoid(S * (y - C1)) + A2 * sigmoid(S * (y - C2))

Many experiments start from different ``y0`` and are observed at different numbers of times,
so they land in several buckets. The learned term is a ``ConfluentPackBank`` evaluated inside
the vector field: ``simulate_fn`` integrates ``-K * y + bank.forward(y)`` with diffrax.

The bank's ordinary atoms share one fixed scale (``scales`` is frozen in the trainable mask),
which is what lets two of them merge exactly into a centred pair later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import confluent_bank as cb
import hybrid_kernels as hk

K = 0.6
SCALE = 2.0
A1, C1 = 1.2, 0.4
A2, C2 = -0.9, -0.8


def true_g(y: Any) -> Any:
    """The unknown term the bank must learn, ``[...] -> [...]``."""
    return A1 * jax.nn.sigmoid(SCALE * (y - C1)) + A2 * jax.nn.sigmoid(SCALE * (y - C2))


def _true_rhs(t, y, args):
    return -K * y + true_g(y)


@jax.jit
def _true_solution(ts, y0):
    # One compile per distinct length; tight tolerances so the data are the exact ODE, as
    # tight as the dtype allows (float32 cannot meet rtol 1e-10: the step size collapses).
    rtol, atol = (1e-10, 1e-12) if ts.dtype == jnp.float64 else (1e-6, 1e-7)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_true_rhs),
        diffrax.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=None,
        y0=y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=4096,
    )
    return sol.ys


@dataclasses.dataclass(frozen=True)
class ProblemSize:
    """How big the problem is: experiments, time-axis lengths and horizon."""

    n_experiments: int = 36
    lengths: tuple[int, ...] = (8, 12, 16)
    t_end: float = 3.0
    y0_range: tuple[float, float] = (-2.5, 2.5)
    noise: float = 0.0


def make_solver(dtype: Any) -> hk.SolverConfig:
    """Tsit5 with tolerances that suit the dtype."""
    if jnp.dtype(dtype) == jnp.float64:
        return hk.SolverConfig(diffrax.Tsit5(), rtol=1e-8, atol=1e-10, max_steps=512, dt0=None)
    return hk.SolverConfig(diffrax.Tsit5(), rtol=1e-5, atol=1e-6, max_steps=512, dt0=None)


def make_experiments(size: ProblemSize = ProblemSize(), *, seed: int = 0) -> list[hk.Experiment]:
    """Noise-free (or lightly noisy) observations of the true ODE, one experiment per ``y0``."""
    rng = np.random.default_rng(seed)
    y0s = np.linspace(*size.y0_range, size.n_experiments)
    experiments = []
    for i, y0 in enumerate(y0s):
        n = size.lengths[i % len(size.lengths)]
        ts = np.linspace(0.0, size.t_end, n)
        values = np.asarray(_true_solution(jnp.asarray(ts), jnp.asarray([y0]))[:, 0], np.float64)
        if size.noise:
            values = values + size.noise * rng.standard_normal(values.shape)
        experiments.append(
            hk.make_experiment(
                covariates={},
                channels={"y": hk.ChannelObs(ts, values)},
                y0_fn=lambda cov, ch, y0=y0: jnp.asarray([y0]),
                exp_id=f"exp{i:03d}",
            )
        )
    return experiments


def initial_bank(
    dtype: Any = None, *, max_packs: int = 8, max_pairs: int | None = 1
) -> cb.ConfluentPackBank:
    """Six ordinary sigmoid atoms at the fixed scale, spread over the data range, two empty.

    ``max_pairs=1``: the standard plan holds one centred pair at a time, and a bank that says
    so evaluates the pair formulas on one slot instead of all eight (the same values, a
    cheaper step inside the ODE; ``benchmarks/bank_in_ode.py``)."""
    centres = np.linspace(-1.5, 1.5, 6)
    weights = 0.05 * np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    packs = [
        cb.RefinedPack(0, float(c), float(w), SCALE) for c, w in zip(centres, weights, strict=True)
    ]
    return cb.init_confluent_bank(
        packs, max_packs=max_packs, max_order=3, dtype=dtype, max_pairs=max_pairs
    )


def two_broad_atoms(dtype: Any = None) -> cb.ConfluentPackBank:
    """Two ordinary atoms of slope 0.5 (too broad for g) and six empty slots: where a bank
    that grows itself starts. It grows by births and moment merges, so it holds no centred
    pair (``max_pairs=0``) and its kernels compile no pair code."""
    packs = [cb.RefinedPack(0, -0.5, 0.05, 0.5), cb.RefinedPack(0, 0.5, -0.05, 0.5)]
    return cb.init_confluent_bank(packs, max_packs=8, max_order=3, dtype=dtype, max_pairs=0)


# --8<-- [start:simulate]
def simulate(predictors, ts, covariates, y0, solver):
    """``simulate_fn``: integrate ``-K y + bank(y)`` for one experiment, ``[T] -> [T, 1]``."""
    (bank,) = predictors

    def vector_field(t, y, args):
        return -K * y + bank.forward(y)

    return solver.diffeqsolve(diffrax.ODETerm(vector_field), ts, y0).ys


# --8<-- [end:simulate]


def state_to_output(states):
    """The whole (scalar) state is observed: ``[T, 1] -> [T, 1]``."""
    return states


# --8<-- [start:trainable]
def bank_trainable(predictors) -> Any:
    """Train the bank's float blocks except the shared scale (kept equal for exact merges)."""
    return hk.freeze_paths(hk.trainable_mask(predictors), ["0.scales"])


# --8<-- [end:trainable]


def fewer_atoms_score(bank: cb.ConfluentPackBank) -> float:
    """Conditioning score for ``detect_transitions``: one fewer active slot is a gain of 1."""
    return -float(np.sum(np.asarray(bank.active)))


def g_error(bank: cb.ConfluentPackBank, y_range: tuple[float, float], n: int = 401) -> float:
    """``max |bank(y) - g(y)|`` over ``y_range``."""
    y = jnp.linspace(*y_range, n, dtype=bank.centers.dtype)
    return float(jnp.max(jnp.abs(bank.forward(y) - true_g(y))))


def g_rms_error(bank: cb.ConfluentPackBank, y_range: tuple[float, float], n: int = 401) -> float:
    """The root-mean-square of ``bank(y) - g(y)`` over ``y_range`` (evenly spaced ``y``)."""
    y = jnp.linspace(*y_range, n, dtype=bank.centers.dtype)
    return float(jnp.sqrt(jnp.mean((bank.forward(y) - true_g(y)) ** 2)))


def data_range(dataset: hk.Dataset) -> tuple[float, float]:
    """The range of observed values (where ``g`` is identifiable)."""
    lo, hi = np.inf, -np.inf
    for bp in dataset.bucket_payloads:
        mask = np.asarray(bp.mask)
        vals = np.asarray(bp.y_observed)[mask]
        lo, hi = min(lo, float(vals.min())), max(hi, float(vals.max()))
    return lo, hi


class TraceCounter:
    """Wraps ``simulate_fn`` and counts how many times JAX traces it."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.count = 0

    def __call__(self, *args):
        self.count += 1
        return self.fn(*args)


def collinearity_score(bank: cb.ConfluentPackBank) -> float:
    """Conditioning score for ``detect_transitions`` (larger is better).

    Ordinary atoms of one scale whose centres nearly coincide are nearly collinear basis
    functions: the fit is ill-conditioned along their difference. The score is minus the sum,
    over pairs of active order-0 ordinary atoms, of ``exp(-|s (c_i - c_j)|)``, so merging two
    close atoms into one centred pair gains almost 1 and merging distant ones gains little.
    """
    host = {n: np.asarray(v) for n, v in jax.device_get(_blocks(bank)).items()}
    ordinary = host["active"] & (host["modes"] == 0) & (host["orders"] == 0)
    u = host["scales"][ordinary] * host["centers"][ordinary]
    gaps = np.abs(u[:, None] - u[None, :])[np.triu_indices(len(u), k=1)]
    return -float(np.sum(np.exp(-gaps)))


# What each planned kind proposes, as the proposal (and so the recorded event) names it.
PLAN_KINDS = {
    "pair": "centered_pair",
    "birth": "zero_output_birth",
    "cluster": "cluster_to_moments",
    "derivative": "pair_to_derivative",
}


class PlannedTransitions:
    """The ``propose(step, path, bank)`` policy for ``confluent_bank.TransitionHook``.

    ``plan`` maps a step count to a kind: ``"pair"`` (the best merge that
    ``detect_transitions`` finds under ``collinearity_score``), ``"derivative"`` (the first
    centred pair to its limit atom, under ``error_budget``), ``"cluster"`` (the closest pair
    of order-0 atoms whose truncation to one moment slot fits ``error_budget``) or ``"birth"``
    (a zero-output atom in the first free slot).
    """

    def __init__(self, plan: dict[int, str], domain: tuple[float, float], error_budget: float):
        unknown = sorted(set(plan.values()) - set(PLAN_KINDS))
        if unknown:
            raise ValueError(f"unknown transition kinds {unknown}; use {sorted(PLAN_KINDS)}")
        self.plan = dict(plan)
        self.domain = (float(domain[0]), float(domain[1]))
        self.error_budget = error_budget
        self.acceptance = cb.within_error_budget(self.domain)

    def __call__(self, step: int, path: str, bank: cb.ConfluentPackBank):
        kind = self.plan.get(step)
        if kind is None:
            return None
        host = {n: np.asarray(v) for n, v in jax.device_get(_blocks(bank)).items()}
        active, modes = host["active"], host["modes"]
        if kind == "pair":
            proposals = cb.detect_transitions(bank, collinearity_score)
            return proposals[0] if proposals else None
        if kind == "derivative":
            pairs = np.flatnonzero(active & (modes == 1))
            if not len(pairs):
                return None
            return bank.propose_derivative(int(pairs[0]), error_budget=self.error_budget)
        if kind == "cluster":
            # The tightest pair of order-0 atoms whose moment truncation the budget admits;
            # if none does, the tightest one (its commit will be rejected, and recorded).
            candidates = [
                bank.propose_cluster(slots, order=bank.max_order, error_budget=self.error_budget)
                for slots in _pairs_by_span(host)
            ]
            admissible = [c for c in candidates if self.acceptance(bank, c)]
            return (admissible or candidates or [None])[0]
        free = np.flatnonzero(~active)  # "birth"
        if not len(free):
            return None
        centre = 0.5 * (self.domain[0] + self.domain[1])
        return bank.propose_birth(int(free[0]), cb.RefinedPack(0, centre, 0.0, SCALE))


# --8<-- [start:hook]
def transition_hook(
    plan: dict[int, str],
    domain: tuple[float, float],
    *,
    error_budget: float = 1e-3,
    objective: Callable[[Any], float] | None = None,
) -> cb.TransitionHook:
    """The library hook with the planned policy: acceptance ``within_error_budget(domain)``,
    the optax state carried by ``confluent_bank.optax.commit_adapter()``, spreads retracted
    onto ``rho >= 0`` after every step. ``objective(predictors)``, when given, is evaluated
    just before and after each commit."""
    policy = PlannedTransitions(plan, domain, error_budget)
    return cb.TransitionHook(policy, domain, objective=objective)


# --8<-- [end:hook]


def growing_hook(
    dataset: hk.Dataset,
    start: cb.ConfluentPackBank,
    *,
    dtype: Any,
    domain: tuple[float, float] | None = None,
    **options: Any,
) -> cb.TransitionHook:
    """``TransitionHook.growing`` on the training objective: how the integration tests grow
    a bank from ``start`` (``two_broad_atoms``). ``domain`` defaults to the data range (give
    the global one where each process holds part of the data); ``options`` go to the hook,
    whose defaults hold but ``max_active=6``."""
    objective = hk.build_objective(
        dataset,
        simulate_fn=simulate,
        state_to_output=state_to_output,
        solver=make_solver(dtype),
        trainable=bank_trainable((start,)),
    )
    domain = data_range(dataset) if domain is None else domain
    return cb.TransitionHook.growing(objective, domain, **{"max_active": 6, **options})


def _pairs_by_span(host: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """Every pair of active order-0 ordinary atoms, closest centres first."""
    ordinary = np.flatnonzero(host["active"] & (host["modes"] == 0) & (host["orders"] == 0))
    centres = host["centers"]
    pairs = [(int(i), int(j)) for k, i in enumerate(ordinary) for j in ordinary[k + 1 :]]
    return sorted(pairs, key=lambda ij: (abs(centres[ij[0]] - centres[ij[1]]), ij))


def _blocks(bank: cb.ConfluentPackBank) -> dict[str, Any]:
    return {name: getattr(bank, name) for name in cb.STATE_NAMES}


STANDARD_SIZE = ProblemSize(n_experiments=32, lengths=(8, 12, 16, 20))
STANDARD_PLAN = {80: "pair", 100: "birth", 120: "cluster"}


def make_dataset(size: ProblemSize = STANDARD_SIZE, dtype: Any = None, **kwargs) -> hk.Dataset:
    """The problem's dataset: two padded bucket shapes by default."""
    kwargs.setdefault("max_shapes", 2)
    return hk.make_dataset(
        make_experiments(size), output_channel_names=["y"], dtype=dtype, **kwargs
    )


def bucket_objective(dataset: hk.Dataset, solver: hk.SolverConfig) -> Callable[[Any], float]:
    """The trainer's per-bucket-mean MSE of the predictors, forward only (before/after checks)."""
    score = hk.build_score_bucket(simulate, state_to_output, solver, hk.masked_mse)
    one = jnp.asarray(1.0)

    def objective(predictors: Any) -> float:
        losses = [score(predictors, bp, one) for bp in dataset.bucket_payloads]
        return float(sum(losses) / len(losses))

    return objective


def standard_config(**overrides) -> hk.OptaxTrainingConfig:
    """Two phases of Adam(W) over the bank's float blocks."""
    settings = dict(steps=(200, 200), lr=(0.05, 0.02), verbose=False, log_every=10)
    settings.update(overrides)
    return hk.OptaxTrainingConfig(**settings)


def run_standard(
    dataset: hk.Dataset,
    *,
    dtype: Any,
    hooks: Any = None,
    simulate_fn: Callable[..., Any] = simulate,
    bank: cb.ConfluentPackBank | None = None,
    **config_overrides,
):
    """Train the standard problem from ``bank`` (default: ``initial_bank(dtype)``); returns
    ``(history, trained_bank)``."""
    predictors = (initial_bank(dtype) if bank is None else bank,)
    history, trained = hk.train_with_optax(
        predictors,
        dataset,
        standard_config(**config_overrides),
        simulate_fn=simulate_fn,
        state_to_output=state_to_output,
        solver=make_solver(dtype),
        trainable=bank_trainable(predictors),
        key=jax.random.key(0),
        hooks=hooks,
    )
    return history, trained[0]
