"""Which banks a hook visits: every `ConfluentPackBank` in the predictors pytree, whole.

A hook reads, commits and retracts whole banks wherever they sit (a bare bank, a tuple, a
dict, an equinox module beside an MLP). Two ways of handing it a model make that impossible,
and both failed far from their cause before: a model filtered for the optimizer, and a
model whose bank sits behind a plain function, outside the pytree.
"""

from __future__ import annotations

from typing import Any

import jax

from confluent_bank._bank import ConfluentPackBank
from confluent_bank._host import STATE_NAMES


def is_bank(node: Any) -> bool:
    return isinstance(node, ConfluentPackBank)


def flatten_banks(predictors: Any) -> tuple[list[tuple[Any, Any]], Any, list[int]]:
    """`(leaves, treedef, banks)`: the predictors flattened with paths, each bank one leaf,
    and the indices of the bank leaves.

    **Raises:** `ValueError` when there is no bank; `TypeError` for a bank whose integer
    or bool blocks are `None` (filtered by `eqx.filter`), naming its path.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(predictors, is_leaf=is_bank)
    leaves = list(leaves)
    banks = [i for i, (_, leaf) in enumerate(leaves) if is_bank(leaf)]
    if not banks:
        raise ValueError(
            "TransitionHook: found no ConfluentPackBank in the predictors. A bank reached "
            "only through a function, such as eqx.nn.MLP(activation=bank.forward), is not "
            "part of the pytree, so neither the optimizer nor the hook sees it: hold the bank "
            "in a field of your module and call bank.forward there"
        )
    for i in banks:
        path, bank = jax.tree_util.keystr(leaves[i][0]), leaves[i][1]
        missing = [name for name in STATE_NAMES if getattr(bank, name) is None]
        if missing:
            raise TypeError(
                f"TransitionHook: the bank at {path or '<root>'} has no {', '.join(missing)} "
                "(None, as eqx.filter/eqx.partition leave a bank's integer and bool blocks); "
                "pass between_steps the whole model (eqx.combine(params, static)) and give "
                "the optimizer the filtered one"
            )
    return leaves, treedef, banks
