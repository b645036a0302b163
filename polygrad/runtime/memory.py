"""The memory budget: how many bytes an op may still allocate before it must stay sparse or refuse.

An op that is about to allocate something large (a densified sparse matrix, an SpMM output, the
expansion of a sparse x sparse product) asks :func:`check` first.  When the allocation would
exceed ``pg.config.memory_fraction`` of the memory available to the backend, the op is refused
with :class:`~polygrad.errors.MemoryBudgetError` naming the op and the bytes -- the process is
never left to the kernel's OOM killer.  The layout policy (``polygrad.sparse.choose_layout``) uses
:func:`fits` to keep a result sparse when its dense form would not fit.

Available memory comes from the backend when it knows better (``Backend.memory_available()``, e.g.
a GPU's free memory) and otherwise from psutil (host RAM that can be given to a process without
swapping), capped by what the process's cgroup limit (``memory.max``, v1's ``limit_in_bytes``)
leaves -- read by the array pool's :func:`~polygrad.runtime.pool.available_memory_bytes`, which
bounds its own buffers the same way.  It is read at the moment of the check, because it changes
while the program runs.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .pool import HOST_POOL, available_memory_bytes
from .config import config
from ..ir.errors import MemoryBudgetError
from .registry import resolve

__all__ = ["available_bytes", "budget_bytes", "check", "fits", "format_bytes", "nbytes"]

#: below this many bytes an allocation is always allowed without asking psutil: reading
#: /proc/meminfo costs ~50 us, far more than the small ops it would guard.
CHECK_FLOOR = 1 << 20


def nbytes(shape: tuple, dtype: Any) -> int:
    """Bytes of a dense array of ``shape`` and ``dtype`` (Python ints: no overflow)."""
    return math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize


def format_bytes(n: int | float) -> str:
    """``1536`` -> ``'1.5 KiB'``; for messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover - loop always returns


def _backend_name(backend: Any) -> str:
    if backend is None:
        return "host"
    return getattr(backend, "name", str(backend))


def available_bytes(backend: Any = None) -> int:
    """Bytes the backend can still allocate: its own report, else the host memory available to this
    process (psutil's figure capped by its cgroup's limit).

    ``backend`` is a :class:`polygrad.Backend`, a backend name, or None (host memory).  A backend
    whose ``memory_available()`` raises is treated as reporting nothing (host memory is used).
    """
    if backend is not None:
        if isinstance(backend, str):
            backend = resolve(backend)
        try:
            reported = backend.memory_available()
        except Exception:  # noqa: BLE001 - a faulty report must not break the op it guards
            reported = None
        if reported is not None:
            return int(reported)
    # host memory this process may still take (psutil's available memory, capped by what its
    # cgroup's memory.max leaves: in a container the host's figure can be many times that), plus
    # what the host array pool holds idle (it gives that back before a large allocation that
    # would not fit)
    return available_memory_bytes() + HOST_POOL.idle_bytes()


def budget_bytes(backend: Any = None) -> int:
    """``pg.config.memory_fraction`` of :func:`available_bytes`."""
    return int(config.memory_fraction * available_bytes(backend))


def fits(nbytes_needed: int, backend: Any = None) -> bool:
    """Whether allocating ``nbytes_needed`` stays within the budget."""
    if nbytes_needed < CHECK_FLOOR:
        return True
    return nbytes_needed <= budget_bytes(backend)


def check(op: str, nbytes_needed: int, *, backend: Any = None, what: str = "") -> None:
    """Raise :class:`MemoryBudgetError` when op ``op`` would need more than the budget.

    ``what`` describes the allocation for the message (e.g. "a dense (100000, 100000) float32
    result").
    """
    if nbytes_needed < CHECK_FLOOR:
        return
    available = available_bytes(backend)
    budget = int(config.memory_fraction * available)
    if nbytes_needed > budget:
        desc = f" for {what}" if what else ""
        raise MemoryBudgetError(
            f"op '{op}' would need {nbytes_needed} bytes ({format_bytes(nbytes_needed)}){desc}, more than "
            f"pg.config.memory_fraction={config.memory_fraction} of the {format_bytes(available)} available "
            f"on {_backend_name(backend)!r} (budget {format_bytes(budget)}); keep the operand sparse, "
            "work on smaller blocks, or raise pg.config.memory_fraction")
