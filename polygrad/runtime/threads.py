"""How many CPU threads polygrad's kernels use, and the one thread pool that runs them.

``pg.set_num_threads(n)`` / ``pg.get_num_threads()`` / ``POLYGRAD_NUM_THREADS``.  The setting is
**per process** (not per context): it sizes one shared pool of worker threads and the BLAS
library's own threads, both of which are process-wide resources.  The default is the number of
cores this process may run on: its CPU affinity (``os.sched_getaffinity``) capped by the cgroup's
CPU quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us`` in v1), never the
host's core count, which in a container can be many times what the process gets.

**Same bits at any thread count.**  A parallel kernel splits its work into blocks that each write
their own part of the output (whole rows of an SpMM, whole segments of a reduction, a slice of an
elementwise op) and computes every output element exactly as the serial kernel does; where a
result depends on how the work is cut (a sum of partial sums), the cut depends on the data only,
never on the thread count.  The thread count only decides how many threads take blocks from the
queue, so one thread, two or seven give the same bits (tested in tests/backends/test_parallel.py).

**Mechanism.**  A :class:`~concurrent.futures.ThreadPoolExecutor` over kernels that release the
GIL: scipy's ``sparsetools`` (``csr_matvecs`` ...), numpy's ufuncs, ``take`` and reductions on
large arrays, and ``BitGenerator.random_raw``.  No compiler and no new dependency; ``n = 1`` runs
every block in the calling thread (the pure serial path).  The pool is created on first use and
dropped in a forked child (whose copy of the pool's threads does not exist), which makes a new one.

**BLAS.**  polygrad runs BLAS on one thread and parallelises large products itself
(``backends/parallel.py``: ``matmul``), in blocks cut where the shape says, never where the thread
count says: OpenBLAS's own threads give other bits at other counts (measured: ``xᵀ @ g`` for a
2708 x 1433 ``x`` and a 2708 x 16 ``g`` differs at 1 and 2 threads), and its static split, with
threads that spin while they wait, made a GCN epoch on a loaded 2-core machine 2x slower at 2
threads than at BLAS's 1 (300k nodes: 1.95-2.73 s against 0.87-1.15 s).  numpy's and scipy's
OpenBLAS each keep a thread pool of their own; they are set to one thread through their
``openblas_set_num_threads`` entry points (found among the libraries loaded in the process, as
threadpoolctl does, without depending on it) when polygrad first decides its thread count and
at every ``pg.set_num_threads``.  That includes the user's own numpy products in the process.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..ir.errors import PolygradError

__all__ = ["set_num_threads", "get_num_threads", "available_cores", "run_blocks", "row_blocks", "even_blocks",
           "block_positions", "ThreadCountError", "set_blas_threads", "BLAS_THREADS"]

ENV_VAR = "POLYGRAD_NUM_THREADS"
#: threads BLAS runs on: one, so that a product's bits do not depend on the thread count (see above)
BLAS_THREADS = 1
#: OpenBLAS's setter as numpy's and scipy's wheels export it (prefix "scipy_", suffix "64_" for the
#: 64-bit-integer build) and as a system OpenBLAS does
_OPENBLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads")


class ThreadCountError(PolygradError, ValueError):
    """A thread count that is not an integer >= 1 (``pg.set_num_threads`` or ``POLYGRAD_NUM_THREADS``)."""


def _cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup quota allows (quota / period), or None when unlimited or unknown."""
    try:  # cgroup v2: "max 100000" (no limit) or "200000 100000"
        with open(os.path.join(root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # cgroup v1: quota -1 means no limit
        try:
            with open(os.path.join(root, sub, "cpu.cfs_quota_us")) as f:
                quota_us = int(f.read())
            with open(os.path.join(root, sub, "cpu.cfs_period_us")) as f:
                period_us = int(f.read())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None


def available_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Cores this process may use: its affinity mask, capped by the cgroup CPU quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def _validated(n: Any, where: str) -> int:
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise ThreadCountError(f"{where}: the thread count must be an integer >= 1, got {n!r} ({type(n).__name__})")
    n = int(n.__index__())
    if n < 1:
        raise ThreadCountError(f"{where}: the thread count must be an integer >= 1, got {n}")
    return n


def _from_env() -> int | None:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        value: Any = int(raw)
    except ValueError:
        value = raw
    return _validated(value, f"the environment variable {ENV_VAR}={raw!r}")


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.num_threads: int | None = None  # None: not decided yet (environment, else the default)
        self.blas_done = False
        self.executor: ThreadPoolExecutor | None = None
        self.executor_workers = 0


_state = _State()


def _after_fork_in_child() -> None:
    # the child has only the forking thread: the pool's threads (and any lock they held) are gone
    _state.lock = threading.Lock()
    _state.executor = None
    _state.executor_workers = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries loaded in this process (numpy's and scipy's wheels each ship one)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def set_blas_threads(n: int) -> int:
    """Tell every loaded OpenBLAS to use ``n`` threads; returns how many libraries took it."""
    done = 0
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                setter(int(n))
                done += 1
                break
    return done


def get_num_threads() -> int:
    """Threads polygrad's CPU kernels use (``pg.set_num_threads``, else ``POLYGRAD_NUM_THREADS``,
    else :func:`available_cores`)."""
    n = _state.num_threads
    if n is None:
        env = _from_env()
        n = _state.num_threads = env if env is not None else available_cores()
        set_blas_threads(BLAS_THREADS)
        _state.blas_done = True
    return n


def set_num_threads(n: int) -> None:
    """Use ``n`` threads (an integer >= 1) in polygrad's CPU kernels (BLAS included: its
    products are cut into blocks for them), process-wide.

    ``n = 1`` runs every kernel serially in the calling thread.  Results are bit-identical at any
    ``n`` (see the module docstring), so the count can change between steps of a training run."""
    n = _validated(n, "pg.set_num_threads")
    _state.num_threads = n
    set_blas_threads(BLAS_THREADS)
    _state.blas_done = True


def _executor(workers: int) -> ThreadPoolExecutor:
    with _state.lock:
        ex = _state.executor
        if ex is None or _state.executor_workers < workers:
            if ex is not None:
                ex.shutdown(wait=False)  # its idle threads exit; queued work (none) would still run
            ex = _state.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="polygrad")
            _state.executor_workers = workers
        return ex


def run_blocks(fn: Callable[..., Any], blocks: Sequence[tuple] | Iterable[tuple], threads: int | None = None) -> None:
    """Call ``fn(*block)`` for every block, on up to ``threads`` threads (default: the setting).

    Blocks must write disjoint outputs.  The calling thread takes blocks too, so a call made while
    every pool thread is busy (kernels called from several user threads) still finishes; with one
    thread, or one block, everything runs in the calling thread.  The first exception raised by a
    block is re-raised here, after every started block has finished."""
    blocks = list(blocks)
    n = min(get_num_threads() if threads is None else threads, len(blocks))
    if n <= 1:
        for block in blocks:
            fn(*block)
        return
    queue = iter(blocks)
    take = threading.Lock()
    failed: list[BaseException] = []

    def drain() -> None:
        while not failed:
            with take:
                block = next(queue, None)
            if block is None:
                return
            try:
                fn(*block)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                failed.append(exc)
                return

    helpers: list[Future] = [_executor(n - 1).submit(drain) for _ in range(n - 1)]
    drain()
    for future in helpers:
        future.result()
    if failed:
        exc = failed[0]
        failed.clear()  # the list is reachable from the traceback's frames: no reference cycle left behind
        raise exc


def row_blocks(indptr: np.ndarray, n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` or fewer consecutive row ranges ``(r0, r1)`` of a CSR matrix holding about equal
    numbers of nonzeros (a power-law graph's few huge rows do not leave the other threads idle;
    a row is never split)."""
    if n == 0:
        return []
    if parts <= 1:
        return [(0, n)]
    total = int(indptr[n]) - int(indptr[0])
    targets = int(indptr[0]) + (np.arange(1, parts, dtype=np.int64) * total) // parts
    cuts = np.searchsorted(indptr[:n + 1], targets, side="left")
    bounds = np.unique(np.concatenate(([0], np.clip(cuts, 0, n), [n])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def even_blocks(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` or fewer ranges splitting ``range(n)`` evenly."""
    bounds = np.unique(np.linspace(0, n, max(1, min(parts, n)) + 1).astype(np.int64))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


#: entries read at once by :func:`block_positions` (4 MiB of booleans per thread)
SCAN_CHUNK = 1 << 22


def block_positions(keys: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions (int64, ascending) of the entries of ``keys`` in ``[lo, hi)``: what a block that
    owns the outputs ``lo..hi`` of a scatter (a row range of a sort, a bin range of a bincount)
    takes out of an unordered input, in input order.  Read in chunks of ``SCAN_CHUNK`` entries,
    so the temporaries stay small whatever the input's length."""
    parts = []
    for start in range(0, keys.shape[0], SCAN_CHUNK):
        chunk = keys[start:start + SCAN_CHUNK]
        inside = chunk >= lo
        inside &= chunk < hi
        parts.append(np.flatnonzero(inside) + start)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
