"""The stock trainer, built only from the public kernels, and its helpers.

- [`train_with_optax`][hybrid_kernels.train_with_optax] with
  [`OptaxTrainingConfig`][hybrid_kernels.OptaxTrainingConfig]: phases, tournament, early
  stopping, best-step restore, safe steps, validation, hooks, checkpoints and resume.
- Progress: [`TrainingUI`][hybrid_kernels.TrainingUI] and its implementations.
- [`TrainingState`][hybrid_kernels.TrainingState] and its atomic file format.
- Run directories ([`save_run`][hybrid_kernels.save_run] /
  [`load_run`][hybrid_kernels.load_run]).
- Ensembles, [`annealing_schedule`][hybrid_kernels.annealing_schedule] and two plots.

How a run walks, one way, from `train_with_optax` (`trainer.py`) to its last step:

1. Set-up (`_setup.py`): `prepare` checks the arguments once and gathers what stays fixed
    (the cached kernels of `_engine.py`, the buckets and their weights, the UI, the hook,
    the checkpoint path) in one `Setup`. The tournament and both ensembles use it too.
2. State (`_step.Carry` inside `_loop.LoopState`): the device trees a step consumes
    (parameters, optimiser state, the best snapshot and its counters) and the host record
    (history, schedule position, unread step reports).
3. Step (`_step.take_step`): `bucket_step` per bucket, `penalty_step`, then one jitted tail:
    combine, update, skip a non-finite step, apply the one best-step rule (`_step.improve`).
4. Loop (`_loop.train`): start (fresh, tournament winner or checkpoint), compile, then the
    phases; it reads reports back every `log_every` steps and validates, stops early, runs
    the hook and saves between steps.
5. Result (`_loop.RunResult`): the `LossHistory`, the predictors to hand back (the best
    snapshot with `restore_best`) and their loss.
"""

from hybrid_kernels._training.config import OptaxTrainingConfig
from hybrid_kernels._training.ensembles import (
    EnsembleMembers,
    train_bootstrap_ensemble,
    train_seed_ensemble,
)
from hybrid_kernels._training.history import LossHistory, NonFiniteTrainingError
from hybrid_kernels._training.hooks import BetweenStepsHook
from hybrid_kernels._training.plotting import plot_fit, plot_history
from hybrid_kernels._training.reinit import fold_key, reinitialise
from hybrid_kernels._training.run_dir import SavedRun, load_run, save_run
from hybrid_kernels._training.schedules import annealing_schedule
from hybrid_kernels._training.state import (
    TrainingState,
    load_training_state,
    read_training_state_metadata,
    save_training_state,
)
from hybrid_kernels._training.trainer import train_with_optax
from hybrid_kernels._training.ui import (
    LogUI,
    RecordingUI,
    RichUI,
    SilentUI,
    TrainingUI,
    default_ui,
)

__all__ = [
    "BetweenStepsHook",
    "EnsembleMembers",
    "LogUI",
    "LossHistory",
    "NonFiniteTrainingError",
    "OptaxTrainingConfig",
    "RecordingUI",
    "RichUI",
    "SavedRun",
    "SilentUI",
    "TrainingState",
    "TrainingUI",
    "annealing_schedule",
    "default_ui",
    "fold_key",
    "load_run",
    "load_training_state",
    "plot_fit",
    "plot_history",
    "read_training_state_metadata",
    "reinitialise",
    "save_run",
    "save_training_state",
    "train_bootstrap_ensemble",
    "train_seed_ensemble",
    "train_with_optax",
]
