"""``sharing.any_shared`` (fit's one-pass check of a checkpoint's held arrays) against the
per-array :func:`sharing.is_shared` it replaces."""
from __future__ import annotations


from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.runtime import sharing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["array", "view", "dead", "other"])), max_size=8))
def test_any_shared_agrees_with_is_shared(plan: list[tuple[bool, str]]) -> None:
    arrays: list[Any] = []
    marked = []
    try:
        for mark, form in plan:
            base = np.arange(6.0)
            if mark:
                sharing.mark_shared(base)
                if form != "dead":  # a dead one unmarks itself (a weak reference)
                    marked.append(base)
            if form == "view":
                arrays.append(base[1:4])  # a view: its root is base
            elif form == "dead":
                del base  # a marked root that died (freed at once, its weak reference gone)
                arrays.append(np.zeros(6))
            elif form == "other":
                arrays.append([1.0, 2.0])  # not an array: never marked
            else:
                arrays.append(base)
        assert sharing.any_shared(arrays) is any(sharing.is_shared(a) for a in arrays)
        assert sharing.any_shared(iter(arrays)) is any(sharing.is_shared(a) for a in arrays)
    finally:
        for root in marked:
            sharing.forget(root)


def test_any_shared_sees_a_marked_view() -> None:
    base = np.arange(4.0)
    view = base[::2]
    assert not sharing.any_shared([base, view])
    sharing.mark_shared(view)  # marks the root: the base counts too
    try:
        assert sharing.any_shared([np.zeros(2), base])
        assert not sharing.any_shared([np.zeros(2)])
    finally:
        sharing.forget(base)
    assert not sharing.any_shared([base, view])
