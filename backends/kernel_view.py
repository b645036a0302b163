"""The kernels dispatch runs for a backend, for fused kernels that make dispatch's calls themselves.

A fused kernel (``addmm_kernels``, ``cross_entropy_kernels``, ``matmul_vjp``) promises the bits of
the ops it fuses, so it must call the very kernels dispatch would: the registry's table for the
backend, which holds the backend's own kernels *after* every override a plugin installs with a
higher priority, and, in tests, the faults ``polygrad.testing.inject_fault`` wraps around them.
:class:`DispatchKernels` reads that table when a kernel runs (before the registry has built it --
a backend used on its own -- the backend's own table).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from polygrad.runtime.registry import registry


class KernelTable(Protocol):
    """What a fused kernel reads its kernels from: a backend's dict, or a :class:`DispatchKernels`."""

    def __getitem__(self, key: tuple, /) -> Callable[..., Any]: ...


class DispatchKernels:
    """``view[(op, layout)]``: backend ``name``'s kernel as dispatch would run it now."""

    __slots__ = ("name", "own")

    def __init__(self, name: str, own: dict) -> None:
        self.name = name
        self.own = own

    def __getitem__(self, key: tuple) -> Callable[..., Any]:
        table = registry.tables.get(self.name)
        if table is not None:
            kernel = table.get(key)
            if kernel is not None:
                return kernel
        return self.own[key]
