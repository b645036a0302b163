"""Fault injection: make one backend kernel misbehave, to prove the fallback path.

``inject_fault(backend, op)`` patches the registry's dispatch table entry for ``op`` on
``backend`` (every layout the backend has a kernel for, and its fused backward kernel when it has
one) for the duration of a ``with`` block::

    with pg.testing.inject_fault("numpy", "spmm") as fault:
        y = A @ X                      # recomputed by scalar decomposition, FallbackWarning issued
    assert fault.triggered > 0

Modes:
  * ``"raise"``       the kernel raises ``error`` (a class or an instance);
  * ``"wrong_shape"`` the kernel returns its true result with an extra trailing axis of size 2,
                      so the output contradicts the op's inference;
  * ``"nan"``         the kernel returns its true result filled with NaN.  NaN is *not* a kernel
                      fault: it passes through to the user (the monitor flags it).  Integer and
                      bool outputs cannot hold NaN and are returned unchanged.

``times=N`` makes only the first N calls misbehave (later calls run the real kernel);
``times=None`` (the default) makes every call misbehave.

The patch is undone on exit, even when the block raises.  Nested and overlapping injections on
the same kernel compose, and may exit in any order (threads): a finished fault turns its wrapper
into a pass-through and is unlinked from the table as soon as nothing is layered on top of it.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ..runtime.backend import Backend
from ..ir.ops import Op
from ..runtime.registry import registry

MODES = ("raise", "wrong_shape", "nan")
_lock = threading.Lock()


class Fault:
    """Handle yielded by :func:`inject_fault`: what was patched and how often it fired.

    ``calls`` counts every call of a patched kernel while the fault was active; ``triggered``
    counts the calls that misbehaved (``<= times`` when ``times`` is set).
    """

    def __init__(self, backend: Backend, op: Op, error: Any, mode: str, times: int | None):
        self.backend = backend
        self.op = op
        self.error = error
        self.mode = mode
        self.times = times
        self.calls = 0
        self.triggered = 0
        self.active = True
        #: (table, key) pairs this fault patched; filled by inject_fault
        self.patched: list[tuple[dict, tuple[Op, str]]] = []

    def _should_misbehave(self) -> bool:
        with _lock:
            if not self.active:
                return False
            self.calls += 1
            if self.times is not None and self.triggered >= self.times:
                return False
            self.triggered += 1
            return True

    def _raise(self) -> None:
        if isinstance(self.error, BaseException):
            raise self.error
        raise self.error(f"injected fault: kernel for op '{self.op}' on backend {self.backend.name!r}")

    def __repr__(self) -> str:
        return (f"Fault({self.backend.name!r}, '{self.op}', mode={self.mode!r}, times={self.times}, "
                f"calls={self.calls}, triggered={self.triggered}, active={self.active})")


class _Wrapper:
    """The kernel installed in the table while a fault is active (a pass-through afterwards)."""

    def __init__(self, fault: Fault, original: Callable, fused: bool):
        self.fault = fault
        self.original = original
        self.fused = fused
        self.__name__ = f"faulty_{getattr(original, '__name__', 'kernel')}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fault = self.fault
        if not fault._should_misbehave():
            return self.original(*args, **kwargs)
        if fault.mode == "raise":
            fault._raise()
        out = self.original(*args, **kwargs)
        if self.fused:  # a tuple with one gradient array (or None) per input
            return tuple(None if a is None else self._corrupt(a) for a in out)
        return self._corrupt(out)

    def _corrupt(self, array: Any) -> Any:
        be = self.fault.backend
        host = np.asarray(be.to_numpy(array))
        if self.fault.mode == "wrong_shape":
            return be.from_numpy(np.ascontiguousarray(np.stack([host, host], axis=-1)))
        if host.dtype.kind not in "fc":  # NaN is not representable: nothing to poison
            return array
        return be.from_numpy(np.full(host.shape, np.nan, dtype=host.dtype))


def _resolve_op(op: Any) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return Op(op.lower())
        except ValueError:
            pass
        try:
            return Op[op.upper()]
        except KeyError:
            pass
        raise ValueError(f"inject_fault: unknown op {op!r}; known ops: {', '.join(o.value for o in Op)}")
    raise TypeError(f"inject_fault: op must be an op name (see polygrad.testing.list_ops()) or a "
                    f"polygrad.Op, got {type(op).__name__}")


def _resolve_backend(backend: Any) -> Backend:
    if isinstance(backend, Backend):
        name = backend.name
    elif isinstance(backend, str):
        name = backend
    else:
        raise TypeError(f"inject_fault: backend must be a backend name or a polygrad.Backend, "
                        f"got {type(backend).__name__}")
    return registry.get(name)  # BackendUnavailableError names the installed backends


def _check_error(error: Any) -> None:
    ok = isinstance(error, BaseException) or (isinstance(error, type) and issubclass(error, BaseException))
    if not ok:
        raise TypeError(f"inject_fault: error must be an exception class or instance, got {error!r}")


def _unlink(table: dict, key: tuple) -> None:
    """Drop finished (pass-through) wrappers from the top of a table entry."""
    entry = table.get(key)
    while isinstance(entry, _Wrapper) and not entry.fault.active:
        entry = entry.original
        table[key] = entry


def _remove(fault: Fault) -> None:
    with registry._lock, _lock:
        fault.active = False
        for table, key in fault.patched:
            _unlink(table, key)
            # a finished wrapper buried under an active one is unlinked from the chain itself
            entry = table.get(key)
            while isinstance(entry, _Wrapper):
                below = entry.original
                if isinstance(below, _Wrapper) and not below.fault.active:
                    entry.original = below.original
                    continue
                entry = below


@contextmanager
def inject_fault(backend: Any, op: Any, error: Any = RuntimeError, mode: str = "raise",
                 times: int | None = None) -> Iterator[Fault]:
    """Make ``backend``'s kernel for ``op`` misbehave inside the ``with`` block.

    ``backend``: a backend name (``"numpy"``) or Backend; ``op``: a name as
    ``polygrad.testing.list_ops()`` returns it (``"spmm"``) or a :class:`polygrad.Op`.
    ``error``: the exception (class or instance) raised in ``mode="raise"``.
    ``mode``: ``"raise"``, ``"wrong_shape"`` or ``"nan"`` (see the module docstring).
    ``times``: misbehave only on the first ``times`` calls (None: always).

    Yields a :class:`Fault` whose ``calls`` / ``triggered`` count what happened.  Raises
    ``BackendUnavailableError`` for an unknown or unavailable backend and ``ValueError`` for an
    unknown op, a mode not in ``MODES``, a negative ``times`` or an op the backend has no kernel for.
    """
    if mode not in MODES:
        raise ValueError(f"inject_fault: mode must be one of {MODES}, got {mode!r}")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 0):
        raise ValueError(f"inject_fault: times must be None or an int >= 0, got {times!r}")
    _check_error(error)
    the_op = _resolve_op(op)
    be = _resolve_backend(backend)
    fault = Fault(be, the_op, error, mode, times)
    with registry._lock, _lock:
        forward = registry.tables.get(be.name, {})
        if not any(k[0] == the_op for k in forward):
            layouts = sorted({k[1] for k in forward})
            raise ValueError(f"inject_fault: backend {be.name!r} has no kernel for op '{the_op}' "
                             f"(it has kernels in layouts {layouts})")
        for table, fused in ((forward, False), (registry.vjp_tables.get(be.name, {}), True)):
            for key in [k for k in table if k[0] == the_op]:
                table[key] = _Wrapper(fault, table[key], fused)
                fault.patched.append((table, key))
    try:
        yield fault
    finally:
        _remove(fault)
