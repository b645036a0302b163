"""DLPack exchange with NumPy, CuPy, PyTorch and anything else that speaks it.

``pg.from_dlpack(obj)`` wraps another library's array as a polygrad tensor, **without a copy**
whenever the data already lives where the target backend keeps its arrays (host memory for
``numpy``, the GPU for ``cupy``).  In the other direction a :class:`~polygrad.Tensor` implements
``__dlpack__`` / ``__dlpack_device__`` (delegating to its backend array), so
``np.from_dlpack(t)``, ``cupy.from_dlpack(t)`` and ``torch.from_dlpack(t)`` see polygrad's
storage directly.

Zero-copy means shared memory: writing through the other library's array changes the tensor.
polygrad itself never writes into an array in place.

Which backend takes data on which device is the backends' business: each lists the DLPack device
types it imports zero-copy (``Backend.dlpack_devices``) and does the import (``Backend.from_dlpack``),
so a third-party GPU backend takes part exactly like the built-in ones.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.backend import HOST_DLPACK_DEVICES, KDLCPU, KDLCUDA, KDLCUDAHOST, KDLCUDAMANAGED, KDLROCM, Backend
from ..ir.errors import BackendUnavailableError, DTypeError
from ..runtime.registry import get_backend, registry, resolve
from .tensor_class import Tensor, dlpack_source

__all__ = ["KDLCPU", "KDLCUDA", "KDLCUDAHOST", "KDLCUDAMANAGED", "KDLROCM", "dlpack_device",
           "dlpack_source", "from_dlpack"]


def dlpack_device(obj: Any) -> tuple[int, int]:
    """(device type, device id) of a DLPack producer; DTypeError when ``obj`` is not one."""
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None or not hasattr(obj, "__dlpack__"):
        raise DTypeError(f"pg.from_dlpack: {type(obj).__name__} does not implement the DLPack protocol "
                         f"(__dlpack__ and __dlpack_device__); pass the producing array itself, "
                         f"not a capsule")
    kind, index = dev()
    return int(kind), int(index)


def _detached(obj: Any) -> Any:
    # PyTorch refuses to export a tensor that requires grad; the exported data is the same
    if getattr(obj, "requires_grad", False) and callable(getattr(obj, "detach", None)):
        return obj.detach()
    return obj


def _home(kind: int) -> Backend:
    """The backend that keeps data of DLPack device type ``kind``: the default backend when it
    takes that device, else the highest-priority available backend that does.  Unavailable ones
    that would have taken it are named, with their reasons, in the error."""
    default = resolve(get_backend())
    if kind in default.dlpack_devices:
        return default
    registry.load()
    takers = sorted((e for e in registry.entries.values()
                     if e.backend is not None and kind in e.backend.dlpack_devices),
                    key=lambda e: (-e.backend.default_priority, e.name))  # type: ignore[union-attr]
    reasons = []
    for entry in takers:
        try:
            return registry.get(entry.name)
        except BackendUnavailableError as exc:
            reasons.append(str(exc))
    why = "; ".join(reasons) if reasons else "no installed backend lists it in Backend.dlpack_devices"
    raise BackendUnavailableError(f"pg.from_dlpack: data on DLPack device type {kind} has no polygrad "
                                  f"backend here: {why}")


def _import(be: Backend, obj: Any) -> Any:
    try:
        return be.from_dlpack(obj)
    except (TypeError, BufferError, RuntimeError, ValueError) as exc:
        raise DTypeError(f"pg.from_dlpack: {be.name} cannot import this {type(obj).__name__} "
                         f"({type(exc).__name__}: {exc})") from None


def _host_array(obj: Any, kind: int) -> np.ndarray:
    """A numpy view of host data (zero-copy), or a host copy through the backend of its device."""
    if kind in HOST_DLPACK_DEVICES:
        try:
            return np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            raise DTypeError(f"pg.from_dlpack: numpy cannot import this {type(obj).__name__} "
                             f"({type(exc).__name__}: {exc})") from None
    home = _home(kind)
    return home.to_numpy(_import(home, obj))


def from_dlpack(obj: Any, backend: Any = None, *, requires_grad: bool = False):
    """A polygrad tensor over ``obj``'s data (a numpy / cupy array, a torch tensor, ...).

    ``backend``: where the tensor lives; default: the default backend when it takes data on
    ``obj``'s device (host memory for ``numpy``), else the backend that does (``cupy`` for CUDA
    data).  Zero-copy when the target backend lists the device in ``Backend.dlpack_devices``;
    otherwise the data is copied across once (host <-> device, or into a backend with its own
    storage such as ``scalar``).  A torch tensor that requires grad is detached first (its values
    are imported, not its graph).

    Raises DTypeError for an object without ``__dlpack__`` or of a dtype polygrad does not
    support (complex, bfloat16 ...), BackendUnavailableError for data on a device no available
    backend takes (naming the backends that would, and why they cannot run).
    """
    obj = _detached(obj)
    kind, _ = dlpack_device(obj)
    be = _home(kind) if backend is None else resolve(backend)
    if kind in be.dlpack_devices:
        array = _import(be, obj)                          # zero-copy where the data already is
    else:
        array = be.from_numpy(_host_array(obj, kind))     # copied across once
    dtype = be.dtype(array)
    if dtype.kind not in "fiub":
        raise DTypeError(f"pg.from_dlpack: unsupported dtype {dtype} (polygrad supports float, int and bool)")
    t = Tensor._make(array, be, tuple(int(s) for s in be.shape(array)), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t
