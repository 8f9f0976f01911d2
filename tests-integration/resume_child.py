"""Child process for the checkpoint round-trip test (run as a script, not collected).

``python resume_child.py interrupt DIR``: train the standard problem with checkpoints every 20
steps, save the bank with ``confluent_bank.save_checkpoint`` after step 100, and die abruptly
(``os._exit``) after step 110, before the run finishes.

``python resume_child.py resume DIR``: in a fresh process, reload the bank checkpoint (its
digest goes to ``DIR/reloaded.json``), resume training from the saved training state, and
write the final bank's checkpoint and the loss history to ``DIR/resumed.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import confluent_bank as cb  # noqa: E402

import hybrid_problem as P  # noqa: E402

SAVE_BANK_AT = 100
DIE_AT = 110


class _SaveThenDie:
    def __init__(self, inner: cb.TransitionHook, out: Path):
        self.inner, self.out = inner, out

    @property
    def events(self):  # the trainer records the wrapped hook's events
        return self.inner.events

    def between_steps(self, step, predictors, opt_state):
        result = self.inner.between_steps(step, predictors, opt_state)
        if step == SAVE_BANK_AT:
            (bank,) = result[0]
            cb.save_checkpoint(self.out / "bank.json", bank)
            digest = cb.snapshot_digest(bank.portable_snapshot())
            (self.out / "saved.json").write_text(json.dumps({"digest": digest}))
        if step == DIE_AT:
            os._exit(17)  # a kill: no cleanup, no final checkpoint
        return result


def main(mode: str, out: Path) -> None:
    dataset = P.make_dataset(dtype=jnp.float64)
    hook = P.transition_hook(P.STANDARD_PLAN, P.data_range(dataset), error_budget=1e-3)
    settings = dict(checkpoint_path=str(out / "state.npz"), checkpoint_every=20)
    if mode == "interrupt":
        P.run_standard(dataset, dtype=jnp.float64, hooks=_SaveThenDie(hook, out), **settings)
        raise SystemExit(f"the run should have been killed at step {DIE_AT}")
    reloaded = cb.load_checkpoint(out / "bank.json")
    digest = cb.snapshot_digest(reloaded.portable_snapshot())
    (out / "reloaded.json").write_text(json.dumps({"digest": digest}))
    history, bank = P.run_standard(dataset, dtype=jnp.float64, hooks=hook, **settings)
    result = {
        "history": list(map(float, history)),
        "events": history.events,
        "bank": bank.checkpoint(),
    }
    (out / "resumed.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
