"""Ensembles: several trained models from one configuration.

`train_seed_ensemble` ranks fresh starts with the tournament and fully trains the best
`k_best`; `train_bootstrap_ensemble` trains one member per bootstrap resample of the
experiments. Both reuse one set of compiled kernels for every member (up to new bucket shapes
a resample may bring) and return `[(final_loss, predictors)]`, best first; the seed ensemble's
list (an `EnsembleMembers`) also says which seeds failed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybrid_kernels._preflight import check_int
from hybrid_kernels._splits import make_bootstrap_dataset
from hybrid_kernels._training._engine import Model
from hybrid_kernels._training._loop import train
from hybrid_kernels._training._setup import (
    Setup,
    check_config,
    prepare,
    resolve_trainable,
    resolve_ui,
)
from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.reinit import fold_key
from hybrid_kernels._training.tournament import run_tournament
from hybrid_kernels._training.ui import TrainingUI


class EnsembleMembers(list):
    """The members of a seed ensemble, `[(final_loss, predictors)]` best first, plus what is
    missing: a list, so code that indexes or iterates it is unchanged.

    - `failed_seeds`: the seeds (tournament attempts `0 .. n_seeds - 1`) whose start failed
        (a solver error or a non-finite score) and were dropped, ascending; `()` if none.
    - `k_best`: how many members were asked for. `len(members) < k_best` exactly when failed
        seeds left too few starts; [`hybrid_kernels.train_seed_ensemble`][] then also warns.
    """

    def __init__(self, members: Any = (), *, failed_seeds: Any = (), k_best: int = 0) -> None:
        super().__init__(members)
        self.failed_seeds: tuple[int, ...] = tuple(int(s) for s in failed_seeds)
        self.k_best = int(k_best)


def _member_config(config: OptaxTrainingConfig, name: str) -> OptaxTrainingConfig:
    # Each member checkpoints to its own file next to the configured one.
    if config.checkpoint_path is None:
        return config
    path = Path(config.checkpoint_path)
    return dataclasses.replace(
        config, checkpoint_path=path.with_name(f"{path.stem}.{name}{path.suffix}")
    )


def _member_setup(
    where: str, model: Model, predictors: Any, trainable: Any, **fixed: Any
) -> Callable[..., tuple[Setup, Any]]:
    """`prepare` for one member, with what every member shares already given."""
    mask = resolve_trainable(predictors, trainable)
    return functools.partial(prepare, where, model=model, trainable=mask, **fixed)


def _rank(
    members: list[tuple[float, Any]], names: list[str], where: str, ui: TrainingUI
) -> list[tuple[float, Any]]:
    """Members best first; a non-finite final loss ranks after every finite one, and is reported.

    A bare sort on the loss is wrong here: NaN compares false both ways, so a diverged member
    could come first.
    """
    bad = [n for (loss, _), n in zip(members, names, strict=True) if not math.isfinite(loss)]
    if bad:
        text = (
            f"{where}: {len(bad)} of {len(members)} members ended with a non-finite loss "
            f"({', '.join(bad)}); they rank last"
        )
        ui.on_message(text=text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)
    # A stable sort: ties and the non-finite members keep their training order.
    return sorted(members, key=lambda m: (0, m[0]) if math.isfinite(m[0]) else (1, 0.0))


def train_seed_ensemble(
    predictors: Any,
    dataset: Any,
    config: OptaxTrainingConfig,
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[..., Any],
    solver: Any,
    n_seeds: int,
    k_best: int | None = None,
    trainable: Any = None,
    key: Any,
    ui: TrainingUI | None = None,
    val_dataset: Any = None,
) -> EnsembleMembers:
    """Rank `n_seeds` fresh starts with the tournament, then fully train the best `k_best`.

    Each start is a re-initialisation of the trainable leaves, trained for
    `config.tournament_steps` steps at `config.tournament_lr` (0 steps ranks the starts as
    drawn) and scored forward-only. The survivors run the whole phase schedule of `config`.

    **Arguments:** as [`train_with_optax`][hybrid_kernels.train_with_optax], plus

    - `n_seeds`: the number of starts to rank, at least 1.
    - `k_best`: how many to train fully, in `[1, n_seeds]`; `None` trains all.

    **Returns:** an [`EnsembleMembers`][hybrid_kernels.EnsembleMembers] list of
    `[(final_loss, predictors)]` sorted by `final_loss` ascending; `final_loss` labels the
    returned parameters (the best-step loss with `restore_best`). Members with a non-finite
    final loss come last and are reported (a `RuntimeWarning` and a UI message). A seed whose
    start fails in the tournament is dropped; when that leaves fewer than `k_best` members,
    the failed seeds are named in a `RuntimeWarning` and a UI message, and recorded in the
    result's `failed_seeds` (with `k_best` beside it).
    """
    where = "train_seed_ensemble"
    n_seeds = check_int(n_seeds, f"{where}: `n_seeds`")
    k_best = n_seeds if k_best is None else check_int(k_best, f"{where}: `k_best`")
    if k_best > n_seeds:
        raise ValueError(f"{where}: k_best={k_best} must not exceed n_seeds={n_seeds}")
    check_config(config, where)  # before the mask, as train_with_optax does
    member_setup = _member_setup(
        where,
        Model(simulate_fn, state_to_output, solver),
        predictors,
        trainable,
        val_dataset=val_dataset,
    )
    setup, start = member_setup(predictors, dataset, config, key=key, ui=ui)
    ui = setup.ui
    ui.on_message(text=f"{where}: ranking {n_seeds} starts, training the best {k_best}")
    failed: list[int] = []
    ranked = run_tournament(
        setup,
        start,
        n_attempts=n_seeds,
        top_k=k_best,
        key=fold_key(key, "seed_ensemble"),
        failed=failed,
    )
    if len(ranked) < k_best:
        text = (
            f"{where}: only {len(ranked)} of k_best={k_best} members can be trained: the starts "
            f"of seed(s) {failed} of n_seeds={n_seeds} failed in the tournament (a solver "
            "error or a non-finite score); the result's `failed_seeds` lists them"
        )
        ui.on_message(text=text)
        warnings.warn(text, RuntimeWarning, stacklevel=2)
    members, names = [], []
    for i, (_, start) in enumerate(ranked):
        member, start = member_setup(
            start,
            dataset,
            _member_config(config, f"seed{i}"),
            key=fold_key(key, f"seed_member_{i}"),
            ui=ui,
        )
        result = train(member, start, tournament=False)
        members.append((float(result.final_loss), result.predictors))
        names.append(f"seed member {i}")
    ranked_members = _rank(members, names, where, ui)
    return EnsembleMembers(ranked_members, failed_seeds=failed, k_best=k_best)


def train_bootstrap_ensemble(
    predictors: Any,
    dataset: Any,
    config: OptaxTrainingConfig,
    *,
    simulate_fn: Callable[..., Any],
    state_to_output: Callable[..., Any],
    solver: Any,
    n_bootstraps: int,
    n_seeds: int = 1,
    k_best: int | None = None,
    trainable: Any = None,
    key: Any,
    ui: TrainingUI | None = None,
) -> list[tuple[float, Any]]:
    """Train one member per bootstrap resample of the experiments.

    Resample `s` draws the experiments with replacement (`make_bootstrap_dataset`) and is
    re-bucketed. With `n_seeds == 1` every member starts from `predictors`, so the spread of
    the ensemble is the data's; with `n_seeds > 1` each resample first picks the best of
    `n_seeds` fresh starts with the tournament.

    **Arguments:** as [`train_with_optax`][hybrid_kernels.train_with_optax], plus

    - `n_bootstraps`: the number of resamples (members), at least 1.
    - `n_seeds`: starts ranked per resample, at least 1.
    - `k_best`: keep the best `k_best` members overall; `None` keeps all.

    **Returns:** `[(final_loss, predictors)]` sorted by `final_loss` ascending. Each loss is
    measured on the member's own resample. Members with a non-finite final loss come last, so
    `k_best` keeps them only when too few finite members exist, and are reported (a
    `RuntimeWarning` and a UI message).
    """
    where = "train_bootstrap_ensemble"
    n_bootstraps = check_int(n_bootstraps, f"{where}: `n_bootstraps`")
    n_seeds = check_int(n_seeds, f"{where}: `n_seeds`")
    if k_best is not None:
        k_best = check_int(k_best, f"{where}: `k_best`")
        if k_best > n_bootstraps:
            raise ValueError(
                f"{where}: k_best={k_best} must not exceed n_bootstraps={n_bootstraps}"
            )
    ui = resolve_ui(check_config(config, where), ui)
    member_setup = _member_setup(
        where,
        Model(simulate_fn, state_to_output, solver),
        predictors,
        trainable,
        ui=ui,
    )
    members, names = [], []
    for s in range(n_bootstraps):
        boot = make_bootstrap_dataset(dataset, key=fold_key(key, f"bootstrap_{s}"))
        setup, start = member_setup(
            predictors,
            boot,
            _member_config(config, f"boot{s}"),
            key=fold_key(key, f"bootstrap_member_{s}"),
        )
        if n_seeds > 1:
            key_s = fold_key(key, f"bootstrap_seeds_{s}")
            start = run_tournament(setup, start, n_attempts=n_seeds, key=key_s)[0][1]
        result = train(setup, start, tournament=False)
        members.append((float(result.final_loss), result.predictors))
        names.append(f"bootstrap member {s}")
    members = _rank(members, names, where, ui)
    return members if k_best is None else members[:k_best]
