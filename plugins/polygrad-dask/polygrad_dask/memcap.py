"""Memory caps on the workers: a block task that would push its worker over ``memory_limit``
fails with a :class:`~polygrad.errors.BackendError` naming the worker and the sizes.

Dask's own answer to a worker near its limit is to spill to disk, then pause (tasks wait for
memory that never frees: a hang), then have the nanny kill the process (retried on another worker,
which dies the same way).  The kernels here check before their large allocations instead, and
clusters started by :func:`polygrad_dask.connect` turn spilling and pausing off, so an over-cap
step is an error in seconds, never a hang or a working set on disk.
"""
from __future__ import annotations

from typing import Any

from polygrad.errors import BackendError

#: dask's worker memory settings that :func:`polygrad_dask.connect` turns off: spilling puts the
#: working set on disk, pausing waits for memory that a step holding its working set never frees
NO_SPILL_NO_PAUSE = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False,
                     "distributed.worker.memory.pause": False}


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MB"


def _worker() -> Any:
    try:
        from distributed import get_worker
        return get_worker()
    except (ImportError, ValueError):
        return None


def cap_bytes(worker: Any) -> int | None:
    """Bytes the worker may hold before dask's nanny kills it (``memory_limit`` times the
    ``terminate`` fraction), or None when it has no limit."""
    import dask

    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    if not limit:
        return None
    fraction = dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0
    return int(limit * float(fraction))


def check(what: str, nbytes: int) -> None:
    """On a worker with a memory limit: raise when ``nbytes`` more would exceed its cap."""
    worker = _worker()
    cap = None if worker is None else cap_bytes(worker)
    if cap is None:
        return
    import psutil

    used = psutil.Process().memory_info().rss
    if used + nbytes > cap:
        limit = worker.memory_manager.memory_limit
        raise BackendError(f"backend 'dask': worker {worker.address} cannot hold {what}: {_mb(nbytes)} on top "
                           f"of the {_mb(used)} it uses exceeds its cap of {_mb(cap)} (memory_limit "
                           f"{_mb(limit)}); use more workers (smaller row blocks) or raise memory_limit")
