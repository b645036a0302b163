"""The Backend contract: what a backend (built-in or third-party) supplies.

A backend owns an array type and a table of *forward kernels* keyed by ``(op, layout)``.  It does
not implement gradients: every op's VJP is written once in polygrad ops (``grad_rules.py``), so a
backend that can run the forward kernels can run the backward too.  It may add *fused backward
kernels* (``vjp_kernels``) where that is faster; polygrad prefers them and the conformance kit
checks them against the rule.

Kernel calling convention: ``kernel(*input_arrays, **attrs) -> array``; the attrs of each op are
documented in ``polygrad.ops`` / ``polygrad.inference``.  A kernel may return anything the backend's
``shape``/``dtype`` understand; dispatch checks the result against the op's inference.

Fused backward convention: ``vjp(grad_out, *input_arrays, needs=(bool, ...), **attrs)`` returns a
tuple with one array (or None) per input; ``needs[i]`` says whether input i wants a gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Kernel = Callable[..., Any]

#: DLPack device types (``DLDeviceType`` in dlpack.h), for :attr:`Backend.dlpack_devices`
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLROCM, KDLCUDAMANAGED = 1, 2, 3, 10, 13
#: device types whose memory the host can read directly (numpy imports them zero-copy)
HOST_DLPACK_DEVICES = (KDLCPU, KDLCUDAHOST)


class Backend:
    """Base class for backends.  Subclass, set ``name``, fill ``kernels`` and the array methods."""

    #: unique name users select it by (``pg.set_backend(name)``, ``t.to(name)``)
    name: str = ""
    #: one-line human description shown by ``polygrad backends``
    description: str = ""
    #: install hint shown when the backend is unavailable
    install_hint: str = ""
    #: the default backend (no ``use_backend``/``set_backend``/``$POLYGRAD_BACKEND``) is the
    #: registered one with the highest priority, ties broken by name
    default_priority: int = 0
    #: backends a failing kernel is rerouted to, in order, before scalar decomposition
    #: (``pg.config.fallback_chain[name]`` overrides it)
    fallback_chain: tuple[str, ...] = ()
    #: DLPack device types (``KDLCPU``, ``KDLCUDA``, ...) whose data :meth:`from_dlpack` imports
    #: without a copy; ``pg.from_dlpack`` puts data on such a device here by default
    dlpack_devices: tuple[int, ...] = ()

    def __init__(self) -> None:
        # keyed by (op, layout); op is a polygrad.ops.Op (a str enum) or its name
        self.kernels: dict[tuple[Any, str], Kernel] = {}
        self.vjp_kernels: dict[tuple[Any, str], Kernel] = {}

    # -- availability -----------------------------------------------------------------------
    def is_available(self) -> bool:
        """True when this backend can run here.  Called lazily; may be slow the first time."""
        return True

    def unavailable_reason(self) -> str:
        """Why ``is_available()`` is False (shown by ``pg.list_backends()``)."""
        return "not available"

    # -- arrays -------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        """Make a backend array from a numpy array (dtype preserved)."""
        raise NotImplementedError

    def to_numpy(self, array: Any) -> np.ndarray:
        """Copy (or view) a backend array as a numpy array."""
        raise NotImplementedError

    def owns(self, array: Any) -> bool:
        """Whether ``array`` is this backend's native array type (lets pg.tensor accept it as is)."""
        return False

    def shape(self, array: Any) -> tuple[int, ...]:
        return tuple(array.shape)

    def dtype(self, array: Any) -> np.dtype:
        return np.dtype(array.dtype)

    def from_dlpack(self, obj: Any) -> Any:
        """A backend array over a DLPack producer's data on one of :attr:`dlpack_devices`
        (zero-copy).  The default reads host memory through numpy and hands it to
        :meth:`from_numpy`.  Raise TypeError/BufferError/ValueError when the data cannot be taken."""
        return self.from_numpy(np.from_dlpack(obj))

    # -- memory -------------------------------------------------------------------------------
    def memory_used(self, device: int = 0) -> int | None:
        """Bytes this backend's arrays hold on ``device``; None when they live in host memory
        (the process's RSS already counts them).  Shown by ``pg.monitor``."""
        return None

    def memory_available(self, device: int = 0) -> int | None:
        """Bytes this backend can still allocate on ``device``, or None to use host memory (psutil)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


@dataclass(frozen=True)
class KernelOverride:
    """A kernel a plugin contributes to an existing backend (see hook ``polygrad_kernels``)."""
    backend: str
    op: str
    layout: str
    kernel: Kernel
    priority: int = 10
    #: "forward" (a forward kernel) or "vjp" (a fused backward kernel)
    kind: str = "forward"
