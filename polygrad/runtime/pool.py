"""Reuse of large host (numpy) arrays between kernels and steps: a caching allocator that is told.

Without reuse, every large kernel output is fresh memory from the operating system: a page fault
and a page of zeros at first touch (17 ms per 256 MB with huge pages on this project's machines),
and, on a virtual machine whose host takes freed guest memory back, a host fault per page on top
(measured: 0.55 s per 256 MB, several times per epoch of a million-node GCN).  A training step
allocates the same few sizes every step, so the numpy backend (its large kernel outputs) and
polygrad's own host code (dropout masks) take large arrays from :data:`HOST_POOL`, which keeps
their buffers and hands one out again once nothing references it any more -- what PyTorch's
caching allocator does on GPUs.

**When a buffer is free: the pool is told.**  Every array handed out is a view of an *owner*
object (a small object exposing the buffer through ``__array_interface__``); numpy views, and
whatever is derived from them (views of views, DLPack capsules, memoryviews,
``torch.from_numpy``), keep their base alive, and numpy never collapses a view's base past an
object that is not an array, so the owner lives exactly as long as something can reach the
memory.  A ``weakref.finalize`` on the owner gives the buffer back when the last view dies: no
reference counting by the pool (it works on free-threaded Python and other interpreters alike),
and no scan over buffers at each allocation.

**Bounds.**  Only arrays of at least ``min_bytes`` (8 MiB) go through the pool; buffers are
matched by exact size.  Idle buffers count as available memory for the memory budget
(:meth:`idle_bytes`, in ``polygrad.runtime.memory``), and are given back to the system:

* on every miss (a size with no idle buffer), oldest first, until the pool holds at most
  ``1 + CHURN_IDLE_FRACTION`` times the most memory that was ever in use at once (what a process
  without the pool holds at its peak) -- so the process's peak is at most 1.2x what it would be
  without the pool, whatever the sizes do, and a training loop of fixed sizes stops missing after
  its first steps and keeps its buffers.  The bound is on the peak, not on the memory in use at
  the miss: a step's buffers (in use and idle) exceed what it has in use at most moments, and a
  bound on the latter gave back buffers the same step took again later -- 5-6 fresh 30-244 MiB
  arrays every epoch of the 1M-node GCN (``python -m benchmarks scale``), 1.5 s of page faults
  per epoch, measured;
* when they sat idle through ``EVICT_AFTER_MISSES`` misses;
* when a new allocation needs more than half the memory available to the process (its cgroup's
  ``memory.max`` included) or fails (it is then retried);
* beyond ``max_bytes`` (a quarter of the memory the process may use, cgroup limit included:
  larger arrays are then not pooled), and on :meth:`release`.

``POLYGRAD_NUMPY_POOL=0`` switches the pool off.  The alternative, glibc's own caching, measured
(a loop allocating and filling one 128 MB array, on this project's 2-core machine under load):
266 ms per array fresh, 33 ms with ``mallopt(M_MMAP_THRESHOLD, 1 GiB)`` and
``mallopt(M_TRIM_THRESHOLD, 1 GiB)``, 21 ms from the pool.  glibc's reuse is close for one fixed
size, but the setting is process-wide (every allocation of the user's program moves into the
heap), freed memory is kept with no bound per size and can be returned only from the heap's top;
the pool bounds and releases its idle buffers one by one.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np
import psutil

__all__ = ["ArrayPool", "HOST_POOL", "memory_limit_bytes", "available_memory_bytes"]

#: arrays smaller than this are allocated directly: malloc recycles small blocks itself
MIN_BYTES = 8 << 20
#: an idle buffer that sat through this many misses (new sizes) is given back
EVICT_AFTER_MISSES = 8
#: on a miss, idle buffers go back while the pool holds more than (1 + this) x the peak in use
CHURN_IDLE_FRACTION = 0.2
#: the pool's default size limit, as a fraction of the memory the process may use
DEFAULT_MAX_FRACTION = 0.25
_POOLS: "weakref.WeakSet[ArrayPool]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # a child forked while another thread held a pool's lock would wait on it forever
    for pool in list(_POOLS):
        pool._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2) is no limit


def _cgroup_memory(root: str = "/sys/fs/cgroup") -> tuple[int | None, int | None]:
    """(limit, usage) in bytes of this process's memory cgroup, v2 then v1; None where unknown."""
    limit = _read_int(os.path.join(root, "memory.max"))
    if limit is not None:
        return limit, _read_int(os.path.join(root, "memory.current"))
    limit = _read_int(os.path.join(root, "memory", "memory.limit_in_bytes"))
    if limit is not None and limit < 1 << 60:  # v1 writes a huge number for "no limit"
        return limit, _read_int(os.path.join(root, "memory", "memory.usage_in_bytes"))
    return None, None


def memory_limit_bytes(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Memory this process may use: physical memory, capped by its cgroup's limit."""
    total = int(psutil.virtual_memory().total)
    limit, _ = _cgroup_memory(cgroup_root)
    return min(total, limit) if limit else total


def available_memory_bytes(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Memory available to this process now: the system's available memory, capped by what its
    cgroup's limit leaves."""
    available = int(psutil.virtual_memory().available)
    limit, usage = _cgroup_memory(cgroup_root)
    if limit and usage is not None:
        available = min(available, max(0, limit - usage))
    return available


def _allocate(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


class _Owner:
    """The base of every array handed out for one use of a buffer; dies with the last view."""

    __slots__ = ("buffer", "__array_interface__", "__weakref__")

    def __init__(self, buffer: np.ndarray):
        self.buffer = buffer  # keeps the memory valid while anything can reach it
        self.__array_interface__ = {"shape": (buffer.nbytes,), "typestr": "|u1", "version": 3,
                                    "data": (buffer.__array_interface__["data"][0], False)}


def _give_back(pool_ref: "weakref.ref[ArrayPool]", buffer: np.ndarray) -> None:
    pool = pool_ref()
    if pool is not None:
        pool._returned(buffer)


class ArrayPool:
    """Large output buffers, reused once their last view is gone (see the module docstring)."""

    def __init__(self, min_bytes: int = MIN_BYTES, max_bytes: int | None = None, enabled: bool | None = None):
        self.min_bytes = int(min_bytes)
        self.max_bytes = int(max_bytes if max_bytes is not None else memory_limit_bytes() * DEFAULT_MAX_FRACTION)
        if enabled is None:
            enabled = os.environ.get("POLYGRAD_NUMPY_POOL", "1") != "0"
        self.enabled = bool(enabled)
        self._idle: list[tuple[np.ndarray, int]] = []  # (buffer, misses seen when it went idle), oldest first
        self._busy_bytes = 0   # pooled buffers handed out and not yet given back
        self._idle_bytes = 0
        self._peak_busy = 0    # the most bytes handed out at once: what the process holds without the pool
        self._clock = 0        # misses so far: the age of an idle buffer is the clock's advance
        # re-entrant: a buffer given back by a garbage collection inside the pool takes the lock again
        self._lock = threading.RLock()
        self._ref = weakref.ref(self)
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
        if buf is None:  # over max_bytes: an ordinary array, not pooled
            return np.empty(shape, dtype=dtype)
        owner = _Owner(buf)
        weakref.finalize(owner, _give_back, self._ref, buf).atexit = False  # nothing to give back at exit
        return np.asarray(owner).view(dtype).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = self.empty(shape, dtype)
        out.fill(0)
        return out

    def _take(self, nbytes: int) -> np.ndarray | None:
        idle = self._idle
        for i in range(len(idle) - 1, -1, -1):  # the most recently returned first: warm in cache
            if idle[i][0].nbytes == nbytes:
                buf = idle.pop(i)[0]
                self._idle_bytes -= nbytes
                self._busy_bytes += nbytes
                self._peak_busy = max(self._peak_busy, self._busy_bytes)
                self.hits += 1
                return buf
        self.misses += 1
        self._clock += 1
        self._evict(nbytes)
        if self._busy_bytes + self._idle_bytes + nbytes > self.max_bytes:
            self._release_idle()
            if self._busy_bytes + nbytes > self.max_bytes:
                return None
        try:
            buf = _allocate(nbytes)
        except MemoryError:
            self._release_idle()
            buf = _allocate(nbytes)
        self._busy_bytes += nbytes
        self._peak_busy = max(self._peak_busy, self._busy_bytes)
        return buf

    def _evict(self, nbytes: int) -> None:
        """On a miss: idle buffers go back oldest first while the pool would hold more than
        ``1 + CHURN_IDLE_FRACTION`` times the peak in use (this allocation included), or while the
        new allocation needs more than half of the memory available; and those idle through
        ``EVICT_AFTER_MISSES`` misses."""
        in_use = self._busy_bytes + nbytes
        keep_idle = (1 + CHURN_IDLE_FRACTION) * max(self._peak_busy, in_use) - in_use
        if self._idle and 2 * nbytes > available_memory_bytes():
            keep_idle = 0
        idle = self._idle
        while idle and (self._idle_bytes > keep_idle or self._clock - idle[0][1] > EVICT_AFTER_MISSES):
            self._idle_bytes -= idle.pop(0)[0].nbytes

    def _release_idle(self) -> None:
        self._idle = []
        self._idle_bytes = 0

    def _returned(self, buffer: np.ndarray) -> None:
        """The last view of ``buffer`` died (called by its owner's finalizer, in any thread)."""
        with self._lock:
            self._busy_bytes -= buffer.nbytes
            if self.enabled:
                self._idle.append((buffer, self._clock))
                self._idle_bytes += buffer.nbytes

    def pooled_bytes(self) -> int:
        """Bytes of the buffers the pool tracks, in use or idle."""
        return self._busy_bytes + self._idle_bytes

    def idle_bytes(self) -> int:
        """Bytes held by buffers nothing uses now (available to the next large allocation)."""
        return self._idle_bytes

    def idle_buffers(self) -> int:
        return len(self._idle)

    def release(self) -> None:
        """Give every idle buffer back to the system (buffers in use are given back when their
        last view dies)."""
        with self._lock:
            self._release_idle()

    def __repr__(self) -> str:
        return (f"ArrayPool(enabled={self.enabled}, idle={len(self._idle)} buffers / {self._idle_bytes >> 20} MiB, "
                f"busy={self._busy_bytes >> 20} MiB, hits={self.hits}, misses={self.misses})")


#: the process's pool of large host arrays (the numpy backend's kernel outputs, dropout masks)
HOST_POOL = ArrayPool()
