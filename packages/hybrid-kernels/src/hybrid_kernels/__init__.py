"""hybrid_kernels: bucketed ODE training kernels for hybrid models on diffrax.

Experiments of equal shape are grouped into buckets; each bucket shape gets one compiled
``(loss, grads)`` kernel. Alongside it sit a forward-only scorer, a once-per-step penalty and
a single optimiser update; the stock trainer (``train_with_optax``) is composed of exactly
those pieces.

Every implementation module is private (``hybrid_kernels._x``). This file is the one list of
public names (the API pages group them by concept): import them from the root.
"""

from hybrid_kernels.__about__ import __version__
from hybrid_kernels._bounded import (
    BoundedPredictor,
    BoundScaler,
    available_bound_transforms,
    available_warps,
    soft_clip,
    soft_logit,
    straight_through_clip,
)
from hybrid_kernels._cells import length_cutoff
from hybrid_kernels._data import (
    BucketPayload,
    Dataset,
    describe_buckets,
    failed_exp_ids,
    make_dataset,
)
from hybrid_kernels._experiments import ChannelObs, Experiment, make_experiment
from hybrid_kernels._inputs import InputSignal, InputTable, piecewise_constant, piecewise_linear
from hybrid_kernels._jumps import StateJump
from hybrid_kernels._kernels import (
    apply_length_mask,
    build_apply_update,
    build_bucket_step,
    build_penalty_step,
    build_score_bucket,
    predict_bucket_obs,
)
from hybrid_kernels._losses import (
    available_losses,
    bal_mle,
    bal_mse,
    masked_mle,
    masked_mse,
    resolve_loss_fn,
)
from hybrid_kernels._nonmem import experiments_from_nonmem
from hybrid_kernels._objective import Objective, build_objective
from hybrid_kernels._penalties import (
    PenaltyPointSource,
    bound_penalty,
    box_grid,
    data_penalty_points,
    select_penalty_points,
    validate_penalty_points,
)
from hybrid_kernels._prediction import (
    ChannelMetrics,
    compute_metrics,
    ensemble_predictions,
    predict_bucket,
    predict_dataset,
    predict_dense,
    rich_metrics_table,
)
from hybrid_kernels._reductions import bucket_weights, combine_bucket_grads
from hybrid_kernels._result_tables import metrics_table, predictions_table
from hybrid_kernels._serialise import load_predictors, read_predictors_metadata, save_predictors
from hybrid_kernels._sharding import make_row_mesh
from hybrid_kernels._solver import (
    SolverConfig,
    available_adjoints,
    available_solvers,
    register_adjoint,
    register_solver,
)
from hybrid_kernels._splits import make_bootstrap_dataset, split_dataset, split_dataset_by_ids
from hybrid_kernels._tables import experiments_from_table
from hybrid_kernels._trainable import (
    count_trainable_params,
    default_trainable,
    freeze_modules_of_type,
    freeze_paths,
    freeze_where,
    trainable_mask,
)
from hybrid_kernels._training import (
    BetweenStepsHook,
    EnsembleMembers,
    LogUI,
    LossHistory,
    NonFiniteTrainingError,
    OptaxTrainingConfig,
    RecordingUI,
    RichUI,
    SavedRun,
    SilentUI,
    TrainingState,
    TrainingUI,
    annealing_schedule,
    default_ui,
    fold_key,
    load_run,
    load_training_state,
    plot_fit,
    plot_history,
    read_training_state_metadata,
    reinitialise,
    save_run,
    save_training_state,
    train_bootstrap_ensemble,
    train_seed_ensemble,
    train_with_optax,
)
from hybrid_kernels._trajectory import (
    attach_penalty_state,
    penalty_integral,
    penalty_vector_field,
    strip_penalty_state,
    trajectory_saturation_penalty,
)

__all__ = [
    "BetweenStepsHook",
    "BoundScaler",
    "BoundedPredictor",
    "BucketPayload",
    "ChannelMetrics",
    "ChannelObs",
    "Dataset",
    "EnsembleMembers",
    "Experiment",
    "InputSignal",
    "InputTable",
    "LogUI",
    "LossHistory",
    "NonFiniteTrainingError",
    "Objective",
    "OptaxTrainingConfig",
    "PenaltyPointSource",
    "RecordingUI",
    "RichUI",
    "SavedRun",
    "SilentUI",
    "SolverConfig",
    "StateJump",
    "TrainingState",
    "TrainingUI",
    "__version__",
    "annealing_schedule",
    "apply_length_mask",
    "attach_penalty_state",
    "available_adjoints",
    "available_bound_transforms",
    "available_losses",
    "available_solvers",
    "available_warps",
    "bal_mle",
    "bal_mse",
    "bound_penalty",
    "box_grid",
    "bucket_weights",
    "build_apply_update",
    "build_bucket_step",
    "build_objective",
    "build_penalty_step",
    "build_score_bucket",
    "combine_bucket_grads",
    "compute_metrics",
    "count_trainable_params",
    "data_penalty_points",
    "default_trainable",
    "default_ui",
    "describe_buckets",
    "ensemble_predictions",
    "experiments_from_nonmem",
    "experiments_from_table",
    "failed_exp_ids",
    "fold_key",
    "freeze_modules_of_type",
    "freeze_paths",
    "freeze_where",
    "length_cutoff",
    "load_predictors",
    "load_run",
    "load_training_state",
    "make_bootstrap_dataset",
    "make_dataset",
    "make_experiment",
    "make_row_mesh",
    "masked_mle",
    "masked_mse",
    "metrics_table",
    "penalty_integral",
    "penalty_vector_field",
    "piecewise_constant",
    "piecewise_linear",
    "plot_fit",
    "plot_history",
    "predict_bucket",
    "predict_bucket_obs",
    "predict_dataset",
    "predict_dense",
    "predictions_table",
    "read_predictors_metadata",
    "read_training_state_metadata",
    "register_adjoint",
    "register_solver",
    "reinitialise",
    "resolve_loss_fn",
    "rich_metrics_table",
    "save_predictors",
    "save_run",
    "save_training_state",
    "select_penalty_points",
    "soft_clip",
    "soft_logit",
    "split_dataset",
    "split_dataset_by_ids",
    "straight_through_clip",
    "strip_penalty_state",
    "train_bootstrap_ensemble",
    "train_seed_ensemble",
    "train_with_optax",
    "trainable_mask",
    "trajectory_saturation_penalty",
    "validate_penalty_points",
]
