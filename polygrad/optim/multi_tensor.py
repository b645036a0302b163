"""Many small parameters' updates as one: the same :class:`~polygrad.optim.optimizer.Rule` run once
over their concatenated arrays.

An optimizer whose update reads only the element it writes (``elementwise_update = True``: Adam,
AdamW, SGD) gives each element the same bits whether its parameter is updated alone or as a slice
of a longer array -- the rule is ``+ - * /`` and sqrt with the same Python numbers, each correctly
rounded per element.  A model of many small parameters (GIN: 17 of at most 1,024 elements) spends
most of an update in the per-call cost of ~13 array operations per parameter; concatenated, one
group of parameters sharing a rule costs 13 operations plus the concatenations.  The new
parameters and state arrays are views of the concatenated results (nothing is written in place,
as on the one-parameter path).

Only plain numpy arrays of one dtype, below the blocked update's size (those are updated in blocks
on polygrad's threads instead), and whose state arrays the rule reads are numpy arrays of the
parameter's shape and dtype, are put together; tests/unit/test_optim_multi_tensor.py checks the
bits against the one-parameter path.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["rule_key", "run_together"]


def rule_key(rule: Any, x: np.ndarray, g: Any, state: dict) -> tuple | None:
    """What parameters must share to be updated together under ``rule`` (None: update this one
    alone): the rule itself (function, attrs, numbers, state names) and the dtype, with the
    gradient and every state array the rule reads numpy arrays of ``x``'s shape and dtype."""
    if type(g) is not np.ndarray or g.dtype != x.dtype or g.shape != x.shape:
        return None
    for name in rule.reads:
        v = state.get(name)
        if type(v) is not np.ndarray or v.dtype != x.dtype or v.shape != x.shape:
            return None
    try:
        key = (rule.fn, tuple(sorted(rule.attrs.items())), rule.numbers, rule.reads, rule.writes, x.dtype)
        hash(key)
    except TypeError:  # an unhashable number or attribute: nothing to group by
        return None
    return key


def run_together(rule: Any, members: Sequence[tuple[np.ndarray, np.ndarray, dict]]) -> list[tuple] | None:
    """``rule`` over the concatenation of ``members`` (each ``(x, g, state)``), split back: for each
    member, its new ``x`` followed by its new state arrays named ``rule.writes`` (views of the
    concatenated results, in the member's shape).  None when a result is not one array of the
    concatenation's shape (the rule is pure: the caller updates each member alone instead)."""
    sizes = [x.size for x, _, _ in members]
    flat_x = np.concatenate([x.reshape(-1) for x, _, _ in members])
    flat_g = np.concatenate([g.reshape(-1) for _, g, _ in members])
    reads = [np.concatenate([st[name].reshape(-1) for _, _, st in members]) for name in rule.reads]
    out = rule.fn(flat_x, flat_g, *reads, *rule.numbers, **rule.attrs)
    if len(out) != 1 + len(rule.writes) or any(type(a) is not np.ndarray or a.shape != flat_x.shape for a in out):
        return None
    results = []
    lo = 0
    for (x, _, _), n in zip(members, sizes):
        hi = lo + n
        results.append(tuple(a[lo:hi].reshape(x.shape) for a in out))
        lo = hi
    return results
