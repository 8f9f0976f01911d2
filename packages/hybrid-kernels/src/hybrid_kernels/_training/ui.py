"""Progress reporting: a small event protocol and four implementations.

The trainer reports through a `TrainingUI`. `SilentUI` ignores every event, `LogUI` prints a
plain line every few steps (for logs and CI), `RichUI` draws a live dashboard on a terminal,
and `RecordingUI` keeps every event for tests. A custom UI subclasses `TrainingUI` and
overrides what it needs. The protocol lives in `_events`, the two displays in `_displays`.
"""

from __future__ import annotations

import sys

import jax

from hybrid_kernels._training._displays import LogUI, RichUI
from hybrid_kernels._training._events import RecordingUI, SilentUI, TrainingUI

__all__ = ["LogUI", "RecordingUI", "RichUI", "SilentUI", "TrainingUI", "default_ui"]


def default_ui(verbose: bool) -> TrainingUI:
    """The UI `train_with_optax` uses when none is given.

    `RichUI` on an interactive terminal, `LogUI` elsewhere (CI, notebooks writing to files,
    redirected output), `SilentUI` when `verbose` is false. With several JAX processes, only
    process 0 shows progress; the others get `SilentUI` unless given a `ui` explicitly.
    """
    if not verbose or jax.process_index() != 0:
        return SilentUI()
    if sys.stdout.isatty():
        return RichUI()
    return LogUI()
