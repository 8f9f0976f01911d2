"""confluent_bank: a preallocated, functional bank of activation atoms.

Ordinary atoms, centred-pair ("collision") slots and truncated-moment slots live side by side
in one JAX pytree whose slots are an array axis. Host-side transitions (propose, accept,
commit, roll back) change the represented function exactly or within a stated error budget,
and carry optimizer state along.

The public surface is exactly what ``__all__`` lists (plus the ``confluent_bank.optax``
sub-namespace); every name is re-exported from a private concept module:

- the bank: ``_bank`` (pytree, constructor), ``_forward`` (the forward pass);
- atoms and activations: ``_activations``, ``_atoms``, ``_moments``;
- transitions: ``_records`` (records and enums), ``_host`` (one host view per transaction),
  ``_proposals`` (the rules), ``_verify``, ``_commit``, ``_hook``;
- transport and optimizer state: ``_transport``, ``_optimizer_state``, ``_named_moments``,
  ``_carry``;
- error bounds: ``_bounds``; checkpoints and legacy: ``_checkpoint``, ``_legacy``.
"""

from confluent_bank.__about__ import __version__
from confluent_bank._activations import (
    ActivationSpec,
    get_activation,
    sigma_tower,
    sigma_tower_rows,
)
from confluent_bank._atoms import collision_atom, moment_atom, retract_spread
from confluent_bank._bank import ConfluentPackBank, init_confluent_bank
from confluent_bank._bounds import (
    cluster_remainder,
    derivative_bound,
    pair_derivative_error,
    pair_series_error,
    within_error_budget,
)
from confluent_bank._carry import TransitionCarry, transition_carry
from confluent_bank._checkpoint import bank_from_checkpoint, load_checkpoint, save_checkpoint
from confluent_bank._commit import commit_transition, detect_transitions
from confluent_bank._forward import bank_forward, bank_slot_terms
from confluent_bank._hook import TransitionEvent, TransitionHook
from confluent_bank._host import PARAMETER_NAMES, STATE_NAMES, snapshot_digest
from confluent_bank._legacy import AdaptivePackBank, init_pack_bank, legacy_forward, migrate_legacy
from confluent_bank._moments import Interval, MomentInitialization, initialize_moments, pair_moments
from confluent_bank._named_moments import (
    carry_slot_state,
    moment_carry_adapter,
    reset_slot_state,
    transport_optimizer_state,
)
from confluent_bank._optimizer_state import (
    ExactTransportAdapter,
    NamedMomentState,
    OptimizerStateAdapter,
    TransitionStateAdapter,
    apply_carry,
)
from confluent_bank._proposals import (
    propose_birth,
    propose_cluster,
    propose_derivative,
    propose_pair,
    propose_remove_zero,
)
from confluent_bank._records import (
    RefinedPack,
    SlotMode,
    SlotUpdate,
    TransitionKind,
    TransitionProposal,
)
from confluent_bank._transport import permute_bank, relabel_tanh_sign

__all__ = [
    "PARAMETER_NAMES",
    "STATE_NAMES",
    "ActivationSpec",
    "AdaptivePackBank",
    "ConfluentPackBank",
    "ExactTransportAdapter",
    "Interval",
    "MomentInitialization",
    "NamedMomentState",
    "OptimizerStateAdapter",
    "RefinedPack",
    "SlotMode",
    "SlotUpdate",
    "TransitionCarry",
    "TransitionEvent",
    "TransitionHook",
    "TransitionKind",
    "TransitionProposal",
    "TransitionStateAdapter",
    "__version__",
    "apply_carry",
    "bank_forward",
    "bank_from_checkpoint",
    "bank_slot_terms",
    "carry_slot_state",
    "cluster_remainder",
    "collision_atom",
    "commit_transition",
    "derivative_bound",
    "detect_transitions",
    "get_activation",
    "init_confluent_bank",
    "init_pack_bank",
    "initialize_moments",
    "legacy_forward",
    "load_checkpoint",
    "migrate_legacy",
    "moment_atom",
    "moment_carry_adapter",
    "pair_derivative_error",
    "pair_moments",
    "pair_series_error",
    "permute_bank",
    "propose_birth",
    "propose_cluster",
    "propose_derivative",
    "propose_pair",
    "propose_remove_zero",
    "relabel_tanh_sign",
    "reset_slot_state",
    "retract_spread",
    "save_checkpoint",
    "sigma_tower",
    "sigma_tower_rows",
    "snapshot_digest",
    "transition_carry",
    "transport_optimizer_state",
    "within_error_budget",
]
