"""DLPack exchange with NumPy, CuPy, PyTorch and anything else that speaks it.

``pg.from_dlpack(obj)`` wraps another library's array as a polygrad tensor, **without a copy**
whenever the data already lives where the target backend keeps its arrays (host memory for
``numpy``, the GPU for ``cupy``).  In the other direction a :class:`~polygrad.Tensor` implements
``__dlpack__`` / ``__dlpack_device__`` (delegating to its backend array), so
``np.from_dlpack(t)``, ``cupy.from_dlpack(t)`` and ``torch.from_dlpack(t)`` see polygrad's
storage directly.

Zero-copy means shared memory: writing through the other library's array changes the tensor.
polygrad itself never writes into an array in place.

No backend module is imported here: cupy is reached through the registry only when the data is
on a GPU (or the cupy backend is asked for).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import BackendUnavailableError, DTypeError
from .registry import resolve

#: DLPack device types (``DLDeviceType`` in dlpack.h)
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLCUDAMANAGED, KDLROCM = 1, 2, 3, 13, 10
_HOST = (KDLCPU, KDLCUDAHOST)
_GPU = (KDLCUDA, KDLCUDAMANAGED)


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


def _host_array(obj: Any, kind: int) -> np.ndarray:
    """A numpy view of host data (zero-copy), or a host copy of GPU data (through cupy)."""
    if kind in _HOST:
        try:
            return np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, ValueError) as exc:
            raise DTypeError(f"pg.from_dlpack: numpy cannot import this {type(obj).__name__} "
                             f"({type(exc).__name__}: {exc})") from None
    if kind in _GPU:
        cupy_be = resolve("cupy")  # BackendUnavailableError (with the reason) when no GPU here
        return cupy_be.to_numpy(_cupy_array(obj, cupy_be))
    raise BackendUnavailableError(f"pg.from_dlpack: data on DLPack device type {kind} "
                                  f"(neither host memory nor CUDA) has no polygrad backend")


def _cupy_array(obj: Any, cupy_be: Any) -> Any:
    cp = cupy_be.modules().cupy
    try:
        return cp.from_dlpack(obj)
    except (TypeError, BufferError, RuntimeError, ValueError) as exc:
        raise DTypeError(f"pg.from_dlpack: cupy cannot import this {type(obj).__name__} "
                         f"({type(exc).__name__}: {exc})") from None


def from_dlpack(obj: Any, backend: Any = None, *, requires_grad: bool = False):
    """A polygrad tensor over ``obj``'s data (a numpy / cupy array, a torch tensor, ...).

    ``backend``: where the tensor lives; default: ``numpy`` for host data, ``cupy`` for data on
    a CUDA device.  Zero-copy when the data is already there (host data -> numpy, CUDA data ->
    cupy); otherwise the data is copied across once (host <-> device, or into a backend with
    its own storage such as ``scalar``).  A torch tensor that requires grad is detached first
    (its values are imported, not its graph).

    Raises DTypeError for an object without ``__dlpack__`` or of a dtype polygrad does not
    support (complex, bfloat16 ...), BackendUnavailableError for GPU data when cupy cannot run.
    """
    from .tensor import Tensor

    obj = _detached(obj)
    kind, _ = dlpack_device(obj)
    if backend is None:
        backend = "cupy" if kind in _GPU else "numpy"
    be = resolve(backend)
    if be.name == "cupy" and kind in _GPU:
        array = _cupy_array(obj, be)                      # zero-copy on the device
    else:
        host = _host_array(obj, kind)                     # zero-copy for host data
        array = host if be.name == "numpy" else be.from_numpy(host)
    dtype = be.dtype(array)
    if dtype.kind not in "fiub":
        raise DTypeError(f"pg.from_dlpack: unsupported dtype {dtype} (polygrad supports float, int and bool)")
    t = Tensor._make(array, be, tuple(int(s) for s in be.shape(array)), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


def dlpack_source(t) -> Any:
    """The array a tensor exports through DLPack: its backend array when that speaks DLPack
    (numpy, cupy: zero-copy), else a host copy (e.g. the scalar backend's lists)."""
    data = t._data
    if hasattr(data, "__dlpack__") and hasattr(data, "__dlpack_device__"):
        return data
    return t.numpy()
