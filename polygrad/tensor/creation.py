"""Making tensors: ``pg.tensor``, ``from_numpy``, zeros/ones/full/arange, and the random ones
(``rand``, ``randn``) drawn from polygrad's generator (``pg.manual_seed``, ``pg.rng``)."""
from __future__ import annotations

import builtins
import math
from numbers import Number
from typing import Any

import numpy as np

from ..engine import dispatch
from ..runtime import sharing
from ..runtime.backend import shares_arrays, supports_dtype
from ..ir.dtypes import as_dtype, bool_, default_float, infer_from_data, int64
from ..runtime import memory
from ..ir.errors import DTypeError, PolygradError, ShapeError
from ..runtime.registry import owner_of, resolve

from .args import Tensor, _alloc, _shape_arg
from .sparse_routing import _sparse

_rng = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed polygrad's random generator (rand, randn, dropout, initialisers)."""
    global _rng
    _rng = np.random.default_rng(seed)


def rng() -> np.random.Generator:
    """polygrad's random generator (``pg.rng()``): what rand, randn, dropout and the nn initialisers
    draw from; reseeded by :func:`manual_seed`.  Draw from it so ``manual_seed`` covers your code."""
    return _rng


# -- construction -------------------------------------------------------------------------------------

def _rebuild_tensor(array: np.ndarray, backend: str, requires_grad: bool, grad: Any, name: Any) -> Tensor:
    """Unpickle a dense tensor (:meth:`Tensor.__reduce__`)."""
    t = tensor(array, backend=backend, requires_grad=requires_grad and array.dtype.kind == "f")
    if grad is not None:
        t.grad = tensor(grad, backend=backend)
    t.name = name
    return t


def tensor_from_numpy(array: np.ndarray, be) -> Tensor:
    if not supports_dtype(be, array.dtype):
        raise DTypeError(f"backend {be.name!r} supports the dtypes {', '.join(be.dtypes)}, not {array.dtype} "
                         f"(an array of shape {array.shape}); convert it first, e.g. dtype=pg.float32")
    data = be.from_numpy(array)
    return Tensor._new(data, be, tuple(array.shape), np.dtype(array.dtype))


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False, backend: Any = None,
           layout: str = "dense", **sparse_kwargs) -> Tensor:
    """Make a tensor from Python data, a numpy array, another tensor or a backend array.

    The data is always copied, as PyTorch's ``torch.tensor``: later writes into ``data`` do
    not change the tensor.  :func:`from_numpy` shares the memory instead.

    ``layout="auto"`` lets the cost model store a mostly-zero matrix sparse; "csr"/"coo" force it.
    """
    if layout != "dense":
        return _sparse("from_dense_data")(data, dtype=dtype, requires_grad=requires_grad, backend=backend,
                               layout=layout, **sparse_kwargs)
    be = resolve(backend if backend is not None else (data._be if isinstance(data, Tensor) else None))
    if backend is None and not isinstance(data, (Tensor, np.ndarray, np.generic, list, tuple, Number)):
        be = owner_of(data) or be  # a backend's own array (a torch tensor, a cupy array) stays on it
    dispatch.guard_host_array(data)
    if isinstance(data, Tensor):
        array = data.numpy()
    elif be.owns(data):
        if (shares_arrays(be) and supports_dtype(be, np.dtype(be.dtype(data)))
                and (dtype is None or as_dtype(dtype) == be.dtype(data))):
            # an immutable array: sharing it is a copy, and it stays on its device (no host trip)
            t = Tensor._new(data, be, tuple(be.shape(data)), np.dtype(be.dtype(data)))
            return t.requires_grad_(True) if requires_grad else t
        array = be.to_numpy(data)
    else:
        if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
            try:
                data = np.from_dlpack(data)
            except Exception:  # noqa: BLE001 - not host memory: fall back to asarray
                pass
        try:
            array = np.asarray(data)
        except (ValueError, TypeError) as exc:
            raise ShapeError(f"pg.tensor: cannot make a tensor from {type(data).__name__}: {exc}") from None
        if array.dtype == object:
            raise DTypeError(f"pg.tensor: data is ragged or not numeric ({type(data).__name__})")
    if dtype is not None:
        target = as_dtype(dtype)
    elif isinstance(data, (Tensor, np.ndarray, np.generic)) or be.owns(data):
        target = array.dtype
    else:  # Python data: floats become the default float dtype, ints int64 (as PyTorch)
        target = infer_from_data(array.tolist() if array.ndim == 0 else array.dtype.type(0).item())
    if array.dtype.kind not in "fiub":
        raise DTypeError(f"pg.tensor: unsupported dtype {array.dtype}")
    # always a copy (as torch.tensor): the user's later writes into their array must not reach
    # the tensor, nor the caches derived from it; pg.from_numpy is the zero-copy way
    need = memory.nbytes(array.shape, target)
    if need >= memory.CHECK_FLOOR:
        memory.check("pg.tensor", need, backend=be, what=f"a {np.dtype(target)} copy of shape {array.shape}")
    array = np.array(array, dtype=target, order="C", copy=True).reshape(array.shape)  # 0-d stays 0-d
    t = tensor_from_numpy(array, be)
    if requires_grad:
        t.requires_grad_(True)
    return t


def from_numpy(array: np.ndarray, requires_grad: bool = False, backend: Any = None) -> Tensor:
    """A tensor that shares ``array``'s memory (zero-copy, as ``torch.from_numpy``).

    Writes into ``array`` change the tensor and the other way round; caches polygrad derives
    from the tensor (e.g. a sparse form of a matmul operand) re-validate against the content
    before each use.  On a backend whose memory is not the host's (cupy, scalar) the array is
    copied, since sharing is impossible.  ``array`` must be a C-contiguous numeric numpy array.
    """
    if not isinstance(array, np.ndarray):
        raise DTypeError(f"pg.from_numpy: needs a numpy array, got {type(array).__name__} (use pg.tensor)")
    if array.dtype.kind not in "fiub":
        raise DTypeError(f"pg.from_numpy: unsupported dtype {array.dtype}")
    if not array.flags.c_contiguous:
        raise ShapeError(f"pg.from_numpy: the array of shape {array.shape} is not C-contiguous (strides "
                         f"{array.strides}); pass np.ascontiguousarray(array), or use pg.tensor to copy")
    be = resolve(backend)
    t = tensor_from_numpy(array, be)
    sharing.exported(t._data, array)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _filled(shape, value, dtype, requires_grad, backend) -> Tensor:
    shape = _shape_arg(shape) if isinstance(shape, tuple) else _shape_arg((shape,))
    dtype = as_dtype(dtype) if dtype is not None else default_float
    try:
        array = _alloc("pg.full", shape, dtype, lambda: np.full(shape, value, dtype=dtype))
    except (TypeError, ValueError, OverflowError) as exc:  # a fill value the dtype cannot hold
        if isinstance(exc, PolygradError):
            raise
        raise DTypeError(f"pg.full: cannot fill a {dtype} tensor with {value!r:.60}: {exc}") from None
    return tensor(array, requires_grad=requires_grad, backend=backend)


def zeros(*shape, dtype=None, requires_grad: bool = False, backend=None) -> Tensor:
    return _filled(shape, 0, dtype, requires_grad, backend)


def ones(*shape, dtype=None, requires_grad: bool = False, backend=None) -> Tensor:
    return _filled(shape, 1, dtype, requires_grad, backend)


def full(shape, fill_value, dtype=None, requires_grad: bool = False, backend=None) -> Tensor:
    if dtype is None and isinstance(fill_value, (bool, int)) and not isinstance(fill_value, float):
        dtype = bool_ if isinstance(fill_value, bool) else int64
    return _filled(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), fill_value, dtype,
                   requires_grad, backend)


def zeros_like(t: Tensor, dtype=None) -> Tensor:
    return zeros(t.shape, dtype=dtype or t.dtype, backend=t._be)


def ones_like(t: Tensor, dtype=None) -> Tensor:
    return ones(t.shape, dtype=dtype or t.dtype, backend=t._be)


def _np_arange(start, stop, step) -> np.ndarray:
    try:
        return np.arange(start, stop, step)
    except (ValueError, OverflowError) as exc:  # bounds beyond int64 / float range
        raise ShapeError(f"pg.arange({start!r}, {stop!r}, {step!r}): {exc}") from None


def arange(start, stop=None, step=1, dtype=None, backend=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    for v in (start, stop, step):
        if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, (bool, np.bool_)):
            raise DTypeError(f"pg.arange: start, stop and step must be real numbers, got {v!r:.60}")
    if step == 0 or step != step:
        raise ShapeError(f"pg.arange: step must be a non-zero number, got {step!r}")
    try:
        count = math.ceil((stop - start) / step)
    except (OverflowError, ValueError):  # inf or nan bounds
        raise ShapeError(f"pg.arange: cannot count the values from {start!r} to {stop!r} by {step!r}") from None
    array = _alloc("pg.arange", (builtins.max(count, 0),), np.float64, lambda: _np_arange(start, stop, step))
    if dtype is None:
        dtype = int64 if array.dtype.kind in "iu" else default_float
    return tensor(array, dtype=dtype, backend=backend)


def rand(*shape, dtype=None, requires_grad: bool = False, backend=None) -> Tensor:
    """Uniform [0, 1) samples from polygrad's seeded generator (``pg.manual_seed``)."""
    dtype = as_dtype(dtype) if dtype is not None else default_float
    shape = _shape_arg(shape)
    array = _alloc("pg.rand", shape, np.float64, lambda: _rng.random(shape))
    return tensor(array, dtype=dtype, requires_grad=requires_grad, backend=backend)


def randn(*shape, dtype=None, requires_grad: bool = False, backend=None) -> Tensor:
    """Standard normal samples from polygrad's seeded generator (``pg.manual_seed``)."""
    dtype = as_dtype(dtype) if dtype is not None else default_float
    shape = _shape_arg(shape)
    array = _alloc("pg.randn", shape, np.float64, lambda: _rng.standard_normal(shape))
    return tensor(array, dtype=dtype, requires_grad=requires_grad, backend=backend)
