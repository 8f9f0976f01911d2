"""confluent_bank: a preallocated, functional bank of activation atoms.

Ordinary atoms, centred-pair ("collision") slots and truncated-moment slots live side by side
in one JAX pytree whose slots are an array axis. Host-side transitions (propose, accept,
commit, roll back) change the represented function exactly or within a stated error budget,
and carry optimizer state along.

The public surface is exactly what ``__all__`` lists; every name is re-exported from a
private-by-convention concept module.
"""

from confluent_bank.__about__ import __version__

# --- bank core (owner: bank-core helper) ---

# --- transitions (owner: transitions helper) ---

__all__ = [
    "__version__",
    # --- bank core names ---
    # --- transition names ---
]
