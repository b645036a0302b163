"""Which tensor storages may be written by someone other than polygrad.

polygrad's own ops never write into an existing array, so derived data cached on a tensor's
storage (the auto-sparsified matmul operand, ``polygrad.sparse``) can only go stale when the
memory is shared with the user: a tensor made by ``pg.from_numpy`` (zero-copy), or one whose
storage was handed out writable by ``t.numpy()``, ``np.asarray(t)`` or DLPack.  Those storages
are *marked* here (by their memory root, so views of one buffer count as one); a cache built on
a marked storage re-validates its content before each use, one on an unmarked storage is served
as is.  ``pg.tensor`` copies its input (as PyTorch's ``torch.tensor``), so its storage starts
unmarked.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

__all__ = ["any_shared", "exported", "forget", "is_shared", "mark_shared"]

# id(root) -> root, dropped when the root dies (arrays are unhashable, so no WeakSet)
_shared: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def _root(array: Any) -> Any:
    """The object that owns ``array``'s memory (numpy/cupy views chain through ``.base``)."""
    seen = 0
    while True:
        base = getattr(array, "base", None)
        if base is None or not hasattr(base, "shape") or seen > 64:
            return array
        array = base
        seen += 1


def mark_shared(array: Any) -> None:
    """Record that ``array``'s memory may be written from outside polygrad."""
    root = _root(array)
    with _lock:
        try:
            if _shared.get(id(root)) is not root:  # already marked (views of one buffer): no new weakref
                _shared[id(root)] = root
        except TypeError:  # no weakref support: such arrays (the scalar backend's) are never
            pass           # handed out by reference, only copied


def forget(root: Any) -> None:
    """Unmark a memory root whose every previous user is gone (``polygrad.runtime.pool`` reusing a
    buffer nothing references): what it holds next is new, unshared storage."""
    with _lock:
        if _shared.get(id(root)) is root:
            del _shared[id(root)]


def exported(storage: Any, handed_out: Any) -> None:
    """Mark ``storage`` when ``handed_out`` (what the user got from it) aliases its memory."""
    if handed_out is storage or _root(handed_out) is _root(storage):
        mark_shared(storage)


def is_shared(array: Any) -> bool:
    """Whether ``array`` (or any view of its memory root) was marked by :func:`mark_shared`."""
    root = _root(array)
    with _lock:
        return _shared.get(id(root)) is root


def any_shared(arrays: Iterable[Any]) -> bool:
    """Whether any of ``arrays`` is marked: ``any(is_shared(a) for a in arrays)`` in one pass
    under one lock, and a lookup that raises nothing for an unmarked root (``fit`` asks it of a
    dozen state arrays at most of its epochs, where each :func:`is_shared` cost ~1.5 us)."""
    # id(root) -> weak reference; a dead one (its removal pending) gives None: not marked
    refs = _shared.data  # type: ignore[attr-defined]
    if not refs:
        return False
    with _lock:
        for array in arrays:
            root = _root(array)
            ref = refs.get(id(root))
            if ref is not None and ref() is root:
                return True
    return False
