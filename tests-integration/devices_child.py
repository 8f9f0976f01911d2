"""Child process for the multi-device test (run as a script, not collected).

Run with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``: trains the standard problem,
transitions included, on every visible CPU device and writes the loss history and the device
count to the JSON file named by the first argument.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import hybrid_problem as P  # noqa: E402


def main(out: str) -> None:
    dataset = P.make_dataset(dtype=jnp.float64)
    hook = P.transition_hook(P.STANDARD_PLAN, P.data_range(dataset), error_budget=1e-3)
    history, bank = P.run_standard(dataset, dtype=jnp.float64, hooks=hook)
    shardings = {str(bp.y0.sharding) for bp in dataset.bucket_payloads}
    result = {
        "devices": jax.device_count(),
        "history": [float(x) for x in history],
        "events": [(e.step, e.kind, e.accepted) for e in hook.events],
        "shardings": sorted(shardings),
        "g_error": P.g_error(bank, P.data_range(dataset)),
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
