"""Reuse of large host (numpy) arrays between kernels and steps: a caching allocator.

Without reuse, every large kernel output is fresh memory from the operating system: a page fault
and a page of zeros at first touch (17 ms per 256 MB with huge pages on this project's machines),
and, on a virtual machine whose host takes freed guest memory back, a host fault per page on top
(measured: 0.55 s per 256 MB, several times per epoch of a million-node GCN).  A training step
allocates the same few sizes every step, so the numpy backend (its large kernel outputs) and
polygrad's own host code (dropout masks) take large arrays from :data:`HOST_POOL`, which keeps
their buffers and hands one out again once nothing references it any more -- what PyTorch's
caching allocator does on GPUs.

**When a buffer is free.**  Every array handed out is a view of a pooled buffer, and a numpy view
keeps its base alive; so does anything derived from it (views, DLPack capsules, memoryviews,
``torch.from_numpy``).  A buffer whose only references are the pool's is therefore unreachable
outside it, and can be written again.  CPython's reference count tells; where it is not exact
(other interpreters, free-threaded builds) the pool is off.

**Bounds.**  Only arrays of at least ``min_bytes`` (8 MiB) go through the pool; buffers are
matched by exact size, so a reused one is exactly as large as a fresh one.  Idle buffers count as
available memory for the memory budget (:meth:`idle_bytes`, in ``polygrad.memory``), and are given
back: when a new allocation needs more than half the memory available (before it is made) or
fails (it is then retried), when they would make the pool exceed ``max_bytes`` (a quarter of
physical memory), when they sat idle through ``EVICT_AFTER_MISSES`` allocations of other sizes,
and on :meth:`release`.  ``POLYGRAD_NUMPY_POOL=0`` switches the pool off.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

import numpy as np
import psutil

from . import sharing

__all__ = ["ArrayPool", "HOST_POOL", "refcounts_are_exact"]

#: arrays smaller than this are allocated directly: malloc recycles small blocks itself
MIN_BYTES = 8 << 20
#: an idle buffer that sat through this many misses (new sizes) is given back
EVICT_AFTER_MISSES = 8
_POOLS: "weakref.WeakSet[ArrayPool]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # a child forked while another thread held a pool's lock would wait on it forever
    for pool in list(_POOLS):
        pool._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def refcounts_are_exact() -> bool:
    """Whether ``sys.getrefcount`` counts every reference (CPython with the GIL)."""
    if sys.implementation.name != "cpython" or not hasattr(sys, "getrefcount"):
        return False
    gil = getattr(sys, "_is_gil_enabled", None)
    return gil is None or bool(gil())


def _idle_refcount() -> int | None:
    """``sys.getrefcount(buffers[i])`` of a buffer referenced only by the pool's list (measured, not
    assumed: it differs between versions); None when a reference held elsewhere does not show in
    the count (then the pool cannot tell, and stays off).  The pool counts through the list
    index, never a loop variable, so a tracer that snapshots frame locals (a debugger) adds no
    reference, here or in the pool's searches."""
    probe = [np.empty(1, dtype=np.uint8)]
    idle = sys.getrefcount(probe[0])
    held = probe[0][:]  # a view: one more reference to the buffer
    busy = sys.getrefcount(probe[0])
    del held
    return idle if busy == idle + 1 else None


class ArrayPool:
    """Large output buffers, reused once unreferenced (see the module docstring)."""

    def __init__(self, min_bytes: int = MIN_BYTES, max_bytes: int | None = None, enabled: bool | None = None):
        self.min_bytes = int(min_bytes)
        self.max_bytes = int(max_bytes if max_bytes is not None else psutil.virtual_memory().total // 4)
        idle_refs = _idle_refcount() if refcounts_are_exact() else None
        if enabled is None:
            enabled = os.environ.get("POLYGRAD_NUMPY_POOL", "1") != "0"
        self.enabled = bool(enabled) and idle_refs is not None
        self._idle_refs = idle_refs if idle_refs is not None else -1
        self._buffers: list[np.ndarray] = []
        self._idle_misses: list[int] = []  # per buffer: misses it has sat idle through
        # re-entrant: a finalizer run by a garbage collection inside the pool may allocate
        self._lock = threading.RLock()
        _POOLS.add(self)
        self.hits = 0
        self.misses = 0

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array (like ``np.empty``), from an idle buffer when there is one.

        Only references count: code that keeps a raw pointer into an array it no longer
        references (an integer from ``a.ctypes.data``, a copied ``__array_interface__``) reads
        whatever the buffer holds next, as it would read freed memory without the pool."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= int(n)
        if not self.enabled or nbytes < self.min_bytes:
            return np.empty(shape, dtype=dtype)
        with self._lock:
            buf = self._take(nbytes)
        return buf.view(dtype).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = self.empty(shape, dtype)
        out.fill(0)
        return out

    def _find_idle(self, nbytes: int) -> int | None:
        bufs, idle = self._buffers, self._idle_refs
        for i in range(len(bufs)):
            if bufs[i].nbytes == nbytes and sys.getrefcount(bufs[i]) == idle:
                return i
        return None

    def _take(self, nbytes: int) -> np.ndarray:
        i = self._find_idle(nbytes)
        if i is not None:
            self.hits += 1
            self._idle_misses[i] = 0
            sharing.forget(self._buffers[i])  # whoever it was handed out to (t.numpy(), DLPack) is gone
            return self._buffers[i]
        self.misses += 1
        self._age_idle()
        if (self.pooled_bytes() + nbytes > self.max_bytes
                or 2 * nbytes > psutil.virtual_memory().available):
            self._release_idle()  # memory is short: what sits idle goes back first
        try:
            buf = np.empty(nbytes, dtype=np.uint8)
        except MemoryError:
            self._release_idle()
            buf = np.empty(nbytes, dtype=np.uint8)
        if self.pooled_bytes() + nbytes <= self.max_bytes:
            self._buffers.append(buf)
            self._idle_misses.append(0)
        return buf

    def _age_idle(self) -> None:
        """On a miss: buffers idle through ``EVICT_AFTER_MISSES`` misses go back to the system.
        A training loop that allocates the same sizes every step stops missing after a step or
        two and keeps its buffers; one whose sizes keep changing (mini-batches) does not pile
        up buffers it will never be handed again."""
        self._sweep(1, EVICT_AFTER_MISSES)

    def _release_idle(self) -> None:
        self._sweep(0, -1)

    def _sweep(self, aging: int, max_age: int) -> None:
        """Idle buffers age by ``aging`` misses; those past ``max_age`` go back to the system (busy
        ones stay, at age 0)."""
        bufs, idle, ages = self._buffers, self._idle_refs, self._idle_misses
        keep, keep_ages = [], []
        for i in range(len(bufs)):
            unused = sys.getrefcount(bufs[i]) == idle
            age = ages[i] + aging if unused else 0
            if not unused or age <= max_age:
                keep.append(bufs[i])
                keep_ages.append(age)
        self._buffers, self._idle_misses = keep, keep_ages

    def pooled_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def idle_bytes(self) -> int:
        """Bytes held by buffers nothing uses now (available to the next large allocation)."""
        if not self.enabled:
            return 0
        with self._lock:
            bufs, idle = self._buffers, self._idle_refs
            return sum(bufs[i].nbytes for i in range(len(bufs)) if sys.getrefcount(bufs[i]) == idle)

    def release(self) -> None:
        """Give every idle buffer back to the system (buffers in use stay pooled)."""
        with self._lock:
            self._release_idle()

    def __repr__(self) -> str:
        return (f"ArrayPool(enabled={self.enabled}, buffers={len(self._buffers)}, "
                f"pooled={self.pooled_bytes() >> 20} MiB, hits={self.hits}, misses={self.misses})")


#: the process's pool of large host arrays (the numpy backend's kernel outputs, dropout masks)
HOST_POOL = ArrayPool()
