"""Repository-wide pytest hooks: the ``gpu`` marker.

Tests marked ``gpu`` run only where JAX sees a GPU; elsewhere they skip with the reason printed
(``-ra`` is on). On the CUDA CI runner ``HYBRID_REQUIRE_GPU=1`` turns a missing GPU into a
failure, so a broken CUDA install cannot pass as a run of skips.
"""

from __future__ import annotations

import os

import pytest


def _gpu_devices() -> list:
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _gpu_devices():
        return
    if os.environ.get("HYBRID_REQUIRE_GPU", "") not in ("", "0"):
        raise pytest.UsageError("HYBRID_REQUIRE_GPU is set but jax.devices('gpu') is empty")
    skip = pytest.mark.skip(reason="no GPU visible to JAX (jax.devices('gpu') is empty)")
    for item in gpu_items:
        item.add_marker(skip)
