"""hybrid_kernels: bucketed ODE training kernels for hybrid models on diffrax.

Experiments of equal shape are grouped into buckets; each bucket shape gets one compiled
``(loss, grads)`` kernel. Alongside it sit a forward-only scorer, a once-per-step penalty and
a single optimiser update; the stock trainer in :mod:`hybrid_kernels.training` is composed of
exactly those pieces.

The public surface is exactly what ``__all__`` lists.
"""

from hybrid_kernels.__about__ import __version__

# --- kernels core (owner: kernels-core helper) ---
from hybrid_kernels.data import (
    BucketPayload,
    ChannelObs,
    Dataset,
    Experiment,
    describe_buckets,
    failed_exp_ids,
    make_bootstrap_dataset,
    make_dataset,
    make_experiment,
    split_dataset,
)
from hybrid_kernels.kernels import (
    apply_length_mask,
    build_apply_update,
    build_bucket_step,
    build_penalty_step,
    build_score_bucket,
    length_cutoff,
    predict_bucket_obs,
)
from hybrid_kernels.losses import (
    LOSS_REGISTRY,
    bal_mle,
    bal_mse,
    masked_mle,
    masked_mse,
    resolve_loss_fn,
)
from hybrid_kernels.reductions import (
    REDUCTIONS,
    bucket_weights,
    combine_bucket_grads,
)
from hybrid_kernels.sharding import make_row_mesh
from hybrid_kernels.solver import (
    ADJOINT_REGISTRY,
    SOLVER_REGISTRY,
    SolverConfig,
    register_adjoint,
    register_solver,
)
from hybrid_kernels.trainable import (
    default_trainable,
    freeze_modules_of_type,
    freeze_paths,
    freeze_where,
    trainable_mask,
)

# --- penalties, prediction, serialisation (owner: kernels-extras helper) ---
from hybrid_kernels.bounded import BoundedPredictor, BoundScaler
from hybrid_kernels.penalties import (
    PenaltyPointSource,
    bound_penalty,
    box_grid,
    data_penalty_points,
    length_mask_keep,
    select_penalty_points,
    validate_penalty_points,
)
from hybrid_kernels.prediction import (
    ChannelMetrics,
    compute_metrics,
    ensemble_predictions,
    predict_bucket,
    predict_dataset,
    predict_dense,
)
from hybrid_kernels.serialise import load_predictors, read_predictors_metadata, save_predictors
from hybrid_kernels.trajectory import (
    attach_penalty_state,
    penalty_integral,
    penalty_vector_field,
    strip_penalty_state,
    trajectory_saturation_penalty,
)

# --- training (owner: training helper) ---
from hybrid_kernels.training import (
    OPTIMIZER_REGISTRY,
    BetweenStepsHook,
    LogUI,
    LossHistory,
    NonFiniteTrainingError,
    OptaxTrainingConfig,
    RecordingUI,
    RichUI,
    SilentUI,
    TrainingState,
    TrainingUI,
    annealing_schedule,
    default_ui,
    fold_key,
    load_training_state,
    plot_fit,
    plot_history,
    reinitialise,
    save_training_state,
    train_bootstrap_ensemble,
    train_seed_ensemble,
    train_with_optax,
)

__all__ = [
    "__version__",
    # --- kernels core names ---
    "ADJOINT_REGISTRY",
    "LOSS_REGISTRY",
    "REDUCTIONS",
    "SOLVER_REGISTRY",
    "BucketPayload",
    "ChannelObs",
    "Dataset",
    "Experiment",
    "SolverConfig",
    "apply_length_mask",
    "bal_mle",
    "bal_mse",
    "bucket_weights",
    "build_apply_update",
    "build_bucket_step",
    "build_penalty_step",
    "build_score_bucket",
    "combine_bucket_grads",
    "default_trainable",
    "describe_buckets",
    "failed_exp_ids",
    "freeze_modules_of_type",
    "freeze_paths",
    "freeze_where",
    "length_cutoff",
    "make_bootstrap_dataset",
    "make_dataset",
    "make_experiment",
    "make_row_mesh",
    "masked_mle",
    "masked_mse",
    "predict_bucket_obs",
    "register_adjoint",
    "register_solver",
    "resolve_loss_fn",
    "split_dataset",
    "trainable_mask",
    # --- extras names ---
    "BoundScaler",
    "BoundedPredictor",
    "ChannelMetrics",
    "PenaltyPointSource",
    "attach_penalty_state",
    "bound_penalty",
    "box_grid",
    "compute_metrics",
    "data_penalty_points",
    "ensemble_predictions",
    "length_mask_keep",
    "load_predictors",
    "penalty_integral",
    "penalty_vector_field",
    "predict_bucket",
    "predict_dataset",
    "predict_dense",
    "read_predictors_metadata",
    "save_predictors",
    "select_penalty_points",
    "strip_penalty_state",
    "trajectory_saturation_penalty",
    "validate_penalty_points",
    # --- training names ---
    "OPTIMIZER_REGISTRY",
    "BetweenStepsHook",
    "LogUI",
    "LossHistory",
    "NonFiniteTrainingError",
    "OptaxTrainingConfig",
    "RecordingUI",
    "RichUI",
    "SilentUI",
    "TrainingState",
    "TrainingUI",
    "annealing_schedule",
    "default_ui",
    "fold_key",
    "load_training_state",
    "plot_fit",
    "plot_history",
    "reinitialise",
    "save_training_state",
    "train_bootstrap_ensemble",
    "train_seed_ensemble",
    "train_with_optax",
]
