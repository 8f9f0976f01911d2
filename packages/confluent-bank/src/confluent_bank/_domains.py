"""Which inputs each bank must stay accurate on: one `(lo, hi)` for every bank, or one per bank.

A hook visits every bank in the predictors. Two learned terms of one model often see inputs on
different scales (a rate of a substrate in g/L beside one of a biomass near 1), so a hook takes
either one domain for all of them or a mapping from each bank's path (as
`jax.tree_util.keystr` writes it, the `path` of its events) to that bank's domain.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, TypeAlias

import jax
import numpy as np

Domain: TypeAlias = tuple[float, float]
DomainSpec: TypeAlias = tuple[float, float] | Mapping[str, tuple[float, float]]


def _pair(value: Any, label: str) -> Domain:
    """`value` as a finite `(lo, hi)` with `lo <= hi`, or a `ValueError` naming `label`."""
    try:
        if isinstance(value, (str, bytes)) or len(value) != 2:
            raise TypeError
        if any(isinstance(x, (str, bytes, bool)) for x in value):
            raise TypeError
        lo, hi = (float(x) for x in value)  # numbers, NumPy and JAX scalars
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a pair of numbers (lo, hi), got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{label} must be finite with lo <= hi, got {value!r}")
    return lo, hi


class BankDomains:
    """A hook's domains: `of(path)` is the `(lo, hi)` of the bank at `path`.

    **Arguments:**

    - `domain`: `(lo, hi)` for every bank, or a non-empty mapping `{path: (lo, hi)}` with one
      entry per bank the hook will visit.
    - `owner`: how messages name the argument's owner (`"TransitionHook"`, ...).
    - `strict`: require `lo < hi` (a policy that spreads candidates over the domain).

    **Raises:** `ValueError` naming the entry for a value that is not a finite pair with
    `lo <= hi` (`lo < hi` with `strict`), an empty mapping or a key that is not a string.
    """

    def __init__(self, domain: DomainSpec, owner: str, *, strict: bool = False) -> None:
        self._owner = owner
        if isinstance(domain, Mapping):
            if not domain:
                raise ValueError(f"{owner}: domain must not be an empty mapping")
            entries = {}
            for path, value in domain.items():
                if not isinstance(path, str):
                    raise ValueError(
                        f"{owner}: domain's keys must be bank paths as jax.tree_util.keystr "
                        f"writes them (e.g. '[0]', '.bank'), got {path!r}"
                    )
                entries[path] = self._checked(value, f"{owner}: domain[{path!r}]", strict)
            self.shared: Domain | None = None
            self.per_bank: dict[str, Domain] = entries
        else:
            self.shared = self._checked(domain, f"{owner}: domain", strict)
            self.per_bank = {}

    @staticmethod
    def _checked(value: Any, label: str, strict: bool) -> Domain:
        lo, hi = _pair(value, label)
        if strict and not lo < hi:
            raise ValueError(f"{label} must have lo < hi, got {value!r}")
        return lo, hi

    @property
    def given(self) -> Domain | dict[str, Domain]:
        """The domain as the hook holds it: `(lo, hi)`, or `{path: (lo, hi)}`."""
        return self.shared if self.shared is not None else dict(self.per_bank)

    def check(self, paths: list[str]) -> None:
        """Refuse, naming it, the first of `paths` a mapping has no entry for (a hook checks
        the banks it visits on every call, so a wrong key fails at the first step)."""
        for path in paths:
            self.of(path)

    def of(self, path: str) -> Domain:
        """The domain of the bank at `path`.

        **Raises:** `ValueError` naming the path and the mapping's paths when a mapping has no
        entry for it.
        """
        if self.shared is not None:
            return self.shared
        if path not in self.per_bank:
            raise ValueError(
                f"{self._owner}: domain has no entry for the bank at {path or '<root>'!r}; it "
                f"has entries for {sorted(self.per_bank)} (give one (lo, hi) per bank path, "
                "as the hook's events write it)"
            )
        return self.per_bank[path]

    def agree_across_processes(self) -> None:
        """Refuse a domain that differs between the processes of a multi-process run.

        Each process runs the hook itself, so its decisions agree only if its inputs do; a
        domain read from one process's own data (with `process_local` datasets) would
        spread other candidates and accept other commits, and the banks that every process
        holds as one replicated parameter would silently diverge. One all-gather of a digest
        of the domain; nothing with one process.

        **Raises:** `ValueError` naming this process and its domain when they differ.
        """
        if jax.process_count() == 1:
            return
        from jax.experimental import multihost_utils

        text = json.dumps(self.given if self.shared is not None else sorted(self.per_bank.items()))
        mine = np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint8)
        every = np.asarray(multihost_utils.process_allgather(mine))
        if not (every == every[0]).all():
            raise ValueError(
                f"{self._owner}: domain differs between processes (process "
                f"{jax.process_index()} has {self.given!r}): give every process the same "
                "domain, the global input range, not the range of its own data"
            )
