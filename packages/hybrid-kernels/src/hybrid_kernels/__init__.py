"""hybrid_kernels: bucketed ODE training kernels for hybrid models on diffrax.

Experiments of equal shape are grouped into buckets; each bucket shape gets one compiled
``(loss, grads)`` kernel. Alongside it sit a forward-only scorer, a once-per-step penalty and
a single optimiser update; the stock trainer in :mod:`hybrid_kernels.training` is composed of
exactly those pieces.

The public surface is exactly what ``__all__`` lists.
"""

from hybrid_kernels.__about__ import __version__

# --- kernels core (owner: kernels-core helper) ---

# --- penalties, prediction, serialisation (owner: kernels-extras helper) ---

# --- training (owner: training helper) ---

__all__ = [
    "__version__",
    # --- kernels core names ---
    # --- extras names ---
    # --- training names ---
]
