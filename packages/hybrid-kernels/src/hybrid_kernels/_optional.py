"""Optional dependencies: import on first use, or say which extra installs them."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise `ImportError` naming the extra that installs it.

    **Arguments:**

    - `module`: the dotted module name, e.g. `"pandas"` or `"matplotlib.pyplot"`.
    - `extra`: the `hybrid-kernels` extra that installs it, e.g. `"table"`.
    - `purpose`: what needs it, the start of the message, e.g. `"Tables"`.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        top = module.split(".")[0]
        raise ImportError(
            f"{purpose} need {top}: install the optional extra, "
            f"`pip install hybrid-kernels[{extra}]`."
        ) from e
