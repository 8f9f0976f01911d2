"""A hook over banks whose inputs differ: `domain` as a mapping from each bank's path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb

optax = pytest.importorskip("optax")

# Two learned terms on unrelated scales: a rate of a substrate in g/L and one of a biomass.
WIDE, NARROW = (0.0, 20.0), (0.0, 0.5)
DOMAINS = {"[0]": WIDE, "[1]": NARROW}
X_WIDE, X_NARROW = jnp.linspace(*WIDE, 81), jnp.linspace(*NARROW, 81)


def _targets():
    return 0.8 * jax.nn.sigmoid(0.5 * (X_WIDE - 8.0)), -0.6 * jax.nn.sigmoid(40 * (X_NARROW - 0.2))


def _objective(predictors):
    wide, narrow = predictors
    target_wide, target_narrow = _targets()
    return jnp.mean((wide.forward(X_WIDE) - target_wide) ** 2) + jnp.mean(
        (narrow.forward(X_NARROW) - target_narrow) ** 2
    )


def _banks():
    # One zero-weight atom each, at each domain's lower end.
    wide = cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 0.0, 0.1)], max_packs=5, max_order=1)
    narrow = cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 0.0, 4.0)], max_packs=5, max_order=1)
    return wide, narrow


def _grow(hook, checks):
    predictors = _banks()
    state = optax.adam(1e-2).init(tuple(bank.parameters for bank in predictors))
    for step in range(checks):
        predictors, state = hook.between_steps(step, predictors, state)
    return predictors


@pytest.fixture(scope="module")
def grown():
    hook = cb.TransitionHook.growing(_objective, DOMAINS, every=1, plateau=np.inf, births=2)
    return hook, _grow(hook, 3)


def _newborns(hook, bank, path):
    """(centre, scale) of every accepted birth into the bank at `path`."""
    ids = [int(i) for i in np.asarray(bank.slot_ids)]
    born = [
        ids.index(event.slots[0])
        for event in hook.events
        if event.kind == "zero_output_birth" and event.accepted and event.path == path
    ]
    return [(float(bank.centers[k]), float(bank.scales[k])) for k in born]


def test_each_bank_is_born_on_its_own_domain(grown):
    hook, (wide, narrow) = grown
    for bank, path, (lo, hi) in ((wide, "[0]", WIDE), (narrow, "[1]", NARROW)):
        newborns = _newborns(hook, bank, path)
        assert newborns, path
        slopes = {s / (hi - lo) for s in (2.0, 4.0, 8.0, 16.0)}
        for centre, scale in newborns:
            assert lo <= centre <= hi
            assert min(abs(scale - s) for s in slopes) <= 1e-12 * max(slopes)


def test_each_bank_gets_its_own_candidate_grid(grown):
    hook, _ = grown
    assert set(hook.candidates) == set(DOMAINS)
    for path, (lo, hi) in DOMAINS.items():
        centres = hook.candidates[path]["centers"]
        assert centres.min() == lo and centres.max() == hi


def test_births_on_their_own_domains_fit_both_terms_better_than_one_shared_domain():
    shared = cb.TransitionHook.growing(_objective, WIDE, every=1, plateau=np.inf, births=2)
    own = cb.TransitionHook.growing(_objective, DOMAINS, every=1, plateau=np.inf, births=2)
    assert _objective(_grow(own, 3)) < 0.1 * _objective(_grow(shared, 3))


def test_a_plain_hook_measures_each_commit_on_the_banks_own_domain(cluster_bank):
    def propose(step, path, bank):
        return bank.propose_cluster((0, 1, 2), order=2, error_budget=1.0) if path == "[1]" else None

    domains = {"[0]": (-5.0, 5.0), "[1]": (-0.5, 0.5)}
    hook = cb.TransitionHook(propose, domains, n_points=11)
    predictors = (cluster_bank, cluster_bank)
    state = optax.adam(1e-2).init(tuple(bank.parameters for bank in predictors))
    (_, new_bank), _ = hook.between_steps(0, predictors, state)
    grid = jnp.linspace(*domains["[1]"], 11)
    expected = float(jnp.max(jnp.abs(new_bank.forward(grid) - cluster_bank.forward(grid))))
    (event,) = hook.events
    assert event.path == "[1]" and event.max_change == pytest.approx(expected, rel=1e-12)


def test_a_mapping_without_a_banks_path_is_refused_naming_it():
    hook = cb.TransitionHook.growing(_objective, {"[0]": WIDE}, every=1)
    with pytest.raises(ValueError, match=r"no entry for the bank at '\[1\]'.*\['\[0\]'\]"):
        _grow(hook, 1)


@pytest.mark.parametrize("growing", [True, False])
def test_a_wrong_path_is_refused_at_the_first_call_not_the_first_check(growing):
    domains = {".wide": WIDE, ".narrow": NARROW}  # the user guessed the paths
    if growing:
        hook = cb.TransitionHook.growing(_objective, domains, every=20)
    else:
        hook = cb.TransitionHook(lambda step, path, bank: None, domains)
    predictors = _banks()
    state = optax.adam(1e-2).init(tuple(bank.parameters for bank in predictors))
    with pytest.raises(ValueError, match=r"no entry for the bank at '\[0\]'"):
        hook.between_steps(1, predictors, state)


@pytest.mark.parametrize(
    ("domain", "match"),
    [
        ({}, "must not be an empty mapping"),
        ({0: WIDE}, "keys must be bank paths"),
        ({"[0]": (1.0, 0.0)}, r"domain\['\[0\]'\] must be finite with lo <= hi"),
        ({"[0]": ("a", 1.0)}, r"domain\['\[0\]'\] must be a pair of numbers"),
        ({"[0]": (0.0, float("inf"))}, r"domain\['\[0\]'\] must be finite"),
    ],
)
def test_a_malformed_domain_mapping_is_refused(domain, match):
    with pytest.raises(ValueError, match=match):
        cb.TransitionHook(lambda step, path, bank: None, domain)


def test_growing_refuses_an_empty_interval_in_a_mapping():
    with pytest.raises(ValueError, match=r"growing: domain\['\[1\]'\] must have lo < hi"):
        cb.TransitionHook.growing(_objective, {"[0]": WIDE, "[1]": (0.3, 0.3)})


def test_a_moment_merge_is_judged_on_its_own_banks_domain():
    # Two atoms of slope 0.5 that collided at 8 g/L in the wide bank; the narrow bank is apart.
    collided = [cb.RefinedPack(0, 8.0, 0.8, 0.5), cb.RefinedPack(0, 8.02, -0.4, 0.5)]
    wide = cb.init_confluent_bank(collided, max_packs=5, max_order=3)
    narrow = _banks()[1]
    hook = cb.TransitionHook.growing(_objective, DOMAINS, every=1, max_active=2)
    state = optax.adam(1e-2).init((wide.parameters, narrow.parameters))
    (merged, _), _ = hook.between_steps(1, (wide, narrow), state)
    (event,) = [e for e in hook.events if e.kind == "cluster_to_moments"]
    assert (event.path, event.accepted) == ("[0]", True)
    grid = jnp.linspace(*WIDE, 401)
    budget = 1e-3 * float(jnp.max(jnp.abs(wide.forward(grid))))  # prune_tol · max|f| on WIDE
    assert float(jnp.max(jnp.abs(merged.forward(grid) - wide.forward(grid)))) <= budget
    order = int(merged.orders[0])
    lower = wide.propose_cluster((0, 1), order=order - 1, error_budget=budget)
    assert order >= 1 and not cb.within_error_budget(WIDE)(wide, lower)


def _processes(monkeypatch, others):
    """Pretend to be process 0 of two; the other process's digest is `others(mine)`."""
    from jax.experimental import multihost_utils

    gathered = []

    def allgather(mine):
        gathered.append(mine)
        return np.stack([mine, others(np.asarray(mine))])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    return gathered


@pytest.mark.parametrize("growing", [True, False], ids=["growing", "plain"])
def test_a_hook_refuses_a_domain_that_differs_between_processes(monkeypatch, growing):
    # A domain read from each process's own data (process-local datasets) would spread
    # other candidates or accept other commits on each process, and the replicated banks
    # would silently diverge.
    _processes(monkeypatch, lambda mine: mine ^ 1)
    if growing:
        hook = cb.TransitionHook.growing(_objective, DOMAINS, every=1, plateau=np.inf)
    else:
        hook = cb.TransitionHook(lambda step, path, bank: None, DOMAINS)
    owner = "TransitionHook.growing" if growing else "TransitionHook"
    with pytest.raises(ValueError, match=rf"^{owner}: domain differs between processes"):
        _grow(hook, 1)


def test_a_growing_hook_compares_the_processes_domains_once(monkeypatch):
    gathered = _processes(monkeypatch, lambda mine: mine)
    hook = cb.TransitionHook.growing(_objective, DOMAINS, every=1, plateau=np.inf)
    _grow(hook, 3)
    assert len(gathered) == 1 and any(e.kind == "zero_output_birth" for e in hook.events)
