"""``runtime.sharing``: marking a memory root that is already marked (the optimizer's updates are
views of one concatenation) keeps it marked without a new weak reference; a forgotten or dead
root is marked afresh."""
from __future__ import annotations

import gc

import numpy as np

from polygrad.runtime import sharing


def test_views_of_one_root_marked_again_stay_marked() -> None:
    buf = np.zeros(12)
    views = [buf[:4], buf[4:8], buf[8:]]
    other = np.zeros(3)
    for v in views:
        sharing.mark_shared(v)
    ref = sharing._shared.data[id(buf)]
    for v in views:
        sharing.mark_shared(v)
    assert sharing._shared.data[id(buf)] is ref  # the same weak reference: not re-inserted
    assert all(sharing.is_shared(v) for v in views) and sharing.is_shared(buf)
    assert not sharing.is_shared(other)
    sharing.forget(buf)
    assert not sharing.is_shared(views[0])
    sharing.mark_shared(views[1])
    assert sharing.is_shared(views[0])
    sharing.forget(buf)


def test_a_dead_root_does_not_mark_a_new_one() -> None:
    a = np.zeros(5)
    sharing.mark_shared(a)

    del a
    gc.collect()
    b = np.zeros(5)
    assert not sharing.is_shared(b)  # even where b took the dead root's id
    sharing.mark_shared(b)
    assert sharing.is_shared(b)
    sharing.forget(b)
