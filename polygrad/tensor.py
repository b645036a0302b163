"""Tensor: the user-facing n-d array with autodiff, and the composite ops built from primitives.

Primitives go through :func:`polygrad.dispatch.apply`; everything else here (sub, div, sigmoid,
mean, softmax, log_softmax, cross_entropy, mse, ...) is a composition of primitives, so its
gradient comes from the gradient table for free.
"""
from __future__ import annotations

import builtins
import math
import operator
from numbers import Number
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, TypeGuard

import numpy as np

from . import dispatch, sharing
from .autodiff import backward as _backward
from .backend import shares_arrays, supports_dtype
from .dispatch import apply
from .dtypes import as_dtype, bool_, default_float, float32, float64, infer_from_data, int64
from . import memory
from .errors import DTypeError, GraphError, IndexOutOfRangeError, MemoryBudgetError, PolygradError, ShapeError
from .graph import TensorBase
from .inference import check_dims, normalize_axes
from .ops import Op
from .registry import owner_of, resolve
from .torch_names import accept_torch_names

if TYPE_CHECKING:  # the sparse package sits above this module (it imports Tensor)
    from .sparse import SparseTensor

_rng = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed polygrad's random generator (rand, randn, dropout, initialisers)."""
    global _rng
    _rng = np.random.default_rng(seed)


def rng() -> np.random.Generator:
    """polygrad's random generator (``pg.rng()``): what rand, randn, dropout and the nn initialisers
    draw from; reseeded by :func:`manual_seed`.  Draw from it so ``manual_seed`` covers your code."""
    return _rng


class Tensor(TensorBase):
    """An n-d array on one backend, with an optional gradient.

    Create with :func:`polygrad.tensor` (or zeros/ones/randn...).  ``requires_grad=True`` on a
    floating tensor makes it a leaf whose ``.grad`` is filled by ``backward()``.
    """

    __slots__ = ("_data", "_be", "shape", "dtype", "requires_grad", "grad", "_node", "name", "__weakref__")
    __array_priority__ = 1000  # numpy defers to our reflected operators
    layout = "dense"

    @classmethod
    def _make(cls, data: Any, be, shape: tuple, dtype: np.dtype) -> "Tensor":
        t = object.__new__(cls)
        t._data = data
        t._be = be
        t.shape = shape
        t.dtype = dtype
        t.requires_grad = False
        t.grad = None
        t._node = None
        t.name = None
        return t

    @classmethod
    def from_backend(cls, array: Any, backend: Any = None, requires_grad: bool = False) -> "Tensor":
        """Wrap a backend's own array without copying it (``pg.tensor`` copies through the host):
        for arrays that live elsewhere -- a device, a cluster's workers -- built by a plugin."""
        be = resolve(backend)
        if not be.owns(array):
            raise DTypeError(f"Tensor.from_backend: backend {be.name!r} does not own a "
                             f"{type(array).__name__}")
        t = cls._make(array, be, tuple(be.shape(array)), be.dtype(array))
        return t.requires_grad_() if requires_grad else t

    # -- properties ---------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._be.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def op(self) -> str | None:
        """Name of the op that produced this tensor (None for a leaf)."""
        return None if self._node is None else self._node.op.value

    @property
    def data(self) -> "Tensor":
        """A detached view of this tensor's storage (assign to replace the storage in place)."""
        return self.detach()

    @data.setter
    def data(self, other: "Tensor") -> None:
        if not isinstance(other, Tensor) or other._be is not self._be:
            raise DTypeError("Tensor.data must be set to a tensor on the same backend")
        if other.shape != self.shape:
            raise ShapeError(f"Tensor.data: cannot set data of shape {other.shape} on a tensor of shape {self.shape}")
        self._data = other._data if other.dtype == self.dtype else other.cast(self.dtype)._data

    @property
    def array(self) -> Any:
        """The backend's array behind this tensor (a ``numpy.ndarray`` on the numpy backend).

        polygrad never writes into it; treat it as read-only too (write with :meth:`update_`)."""
        return self._data

    def update_(self, new: Any) -> "Tensor":
        """Replace this tensor's values in place, outside autodiff (what an optimizer step does).

        ``new`` is a tensor on this backend, an array of this backend (see :attr:`array`, kept
        without a copy), or anything numpy can read (copied onto the backend), of this tensor's
        shape; it is cast to this tensor's dtype.  The tensor keeps its identity,
        ``requires_grad`` and ``grad``; nothing is recorded in the graph."""
        if isinstance(new, Tensor):
            self.data = new
            return self
        be = self._be
        if not be.owns(new):
            new = be.from_numpy(np.asarray(new, dtype=self.dtype))
        if be.shape(new) != self.shape:
            raise ShapeError(f"Tensor.update_: values of shape {be.shape(new)} for a tensor of shape {self.shape}")
        if be.dtype(new) != self.dtype:
            new = be.from_numpy(be.to_numpy(new).astype(self.dtype))
        self._data = new
        return self

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        if flag and self.dtype.kind != "f":
            raise DTypeError(f"only floating tensors can require grad, this one is {self.dtype}")
        if self._node is not None and not flag:
            raise GraphError("requires_grad_(False) on a non-leaf tensor: use detach()")
        self.requires_grad = flag
        return self

    # -- conversion ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The values as a numpy array -- on the numpy backend the storage itself (shared, as
        PyTorch's ``Tensor.numpy()``): writing into it changes the tensor, and caches derived
        from the storage re-validate from then on (see docs/reliability.md)."""
        arr = self._be.to_numpy(self._data)
        sharing.exported(self._data, arr)
        dispatch.note_host_read(self)  # a pg.compile capture guards values read on the host
        return arr

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else arr

    def __dlpack__(self, *, stream=None, **kwargs):
        """DLPack export of the backend array (zero-copy for numpy/cupy); see polygrad.interop."""
        if stream is not None:
            kwargs["stream"] = stream
        sharing.mark_shared(self._data)  # the consumer may write through the capsule
        return dlpack_source(self).__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return dlpack_source(self).__dlpack_device__()

    def __reduce__(self):
        """Pickle (``pickle``, ``copy.deepcopy``, multiprocessing) as values, the backend's *name*,
        ``requires_grad``, ``.grad`` and the name -- never the backend object (whose kernels are
        local functions) nor the autodiff graph: an unpickled tensor is a leaf, like a checkpointed
        one.  Unpickling goes through :func:`tensor`, so it is validated like any construction
        (pickle itself can run code: unpickle only what you trust; ``pg.load`` is the safe format)."""
        grad = self.grad
        if grad is not None:
            grad = (grad.to_dense() if grad.layout != "dense" else grad).numpy().copy()
        return (_rebuild_tensor, (self.numpy().copy(), self.backend, bool(self.requires_grad), grad, self.name))

    def tolist(self):
        return self.numpy().tolist()

    def item(self) -> float | int | bool:
        if self.numel != 1:
            raise ShapeError(f"item() needs a single-element tensor, got shape {self.shape}")
        value = self.numpy().reshape(()).item()
        rec = dispatch._recording.get()
        if rec is not None:  # pg.compile: a float returned by the step is replayed from this tensor
            rec.item(self, value)
        return value

    def detach(self) -> "Tensor":
        return Tensor._make(self._data, self._be, self.shape, self.dtype)

    def to(self, backend: Any) -> "Tensor":
        """Copy to another backend (e.g. ``t.to("cupy")``).  The copy is a new leaf.

        Differs from PyTorch on purpose: PyTorch's ``.to`` is differentiable (gradients flow back
        to the source); here it moves data between backends and starts a new leaf (which requires
        grad if this tensor was a leaf that did), because one graph never mixes backends.  To
        move a model, use :meth:`polygrad.nn.Module.to`, which moves parameters in place.
        """
        be = resolve(backend)
        if be is self._be:
            return self
        t = Tensor._make(be.from_numpy(self.numpy()), be, self.shape, self.dtype)
        t.requires_grad = self.requires_grad and self._node is None
        return t

    def cast(self, dtype: Any) -> "Tensor":
        dtype = as_dtype(dtype)
        if dtype == self.dtype:
            return self
        return apply(Op.CAST, (self,), {"dtype": dtype})

    astype = cast

    def float(self) -> "Tensor":
        return self.cast(float32)

    def double(self) -> "Tensor":
        return self.cast(float64)

    def long(self) -> "Tensor":
        return self.cast(int64)

    def bool(self) -> "Tensor":
        return self.cast(bool_)

    def to_sparse(self, layout: str = "csr") -> Any:
        return _sparse("to_sparse")(self, layout)

    def to_dense(self) -> "Tensor":
        return self

    # -- autodiff -----------------------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: builtins.bool = False,
                 create_graph: builtins.bool = False) -> None:
        _backward(self, grad, retain_graph=retain_graph, create_graph=create_graph)

    def zero_grad(self) -> None:
        self.grad = None

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __pow__(self, other): return pow(self, other)
    def __rpow__(self, other): return pow(other, self)
    def __matmul__(self, other): return matmul(self, other)
    def __rmatmul__(self, other): return matmul(other, self)
    def __neg__(self): return apply(Op.NEG, (self,))
    def __pos__(self): return self
    def __lt__(self, other): return _compare(Op.LT, self, other)
    def __le__(self, other): return _compare(Op.LE, self, other)
    def __gt__(self, other): return _compare(Op.GT, self, other)
    def __ge__(self, other): return _compare(Op.GE, self, other)
    def __eq__(self, other): return _compare(Op.EQ, self, other)
    def __ne__(self, other): return _compare(Op.NE, self, other)
    __hash__ = object.__hash__

    def __abs__(self): return abs(self)

    def __bool__(self) -> builtins.bool:
        if self.numel != 1:
            raise ShapeError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.item())

    def __float__(self) -> builtins.float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getitem__(self, index) -> "Tensor":
        return getitem(self, index)

    # -- elementwise ----------------------------------------------------------------------------
    def exp(self): return apply(Op.EXP, (_floating(self),))
    def log(self): return apply(Op.LOG, (_floating(self),))
    def tanh(self): return apply(Op.TANH, (_floating(self),))
    def relu(self): return apply(Op.RELU, (self,))
    def reciprocal(self): return apply(Op.RECIPROCAL, (_floating(self),))
    def sigmoid(self): return sigmoid(self)
    def sqrt(self): return _floating(self) ** 0.5
    def abs(self): return abs(self)
    def maximum(self, other): return maximum(self, other)
    def minimum(self, other): return minimum(self, other)
    def clip(self, lo=None, hi=None): return clip(self, lo, hi)

    # -- reductions -----------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: builtins.bool = False): return sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims: builtins.bool = False): return mean(self, axis, keepdims)
    def max(self, axis=None, keepdims: builtins.bool = False): return max(self, axis, keepdims)
    def min(self, axis=None, keepdims: builtins.bool = False): return min(self, axis, keepdims)
    def argmax(self, axis=None, keepdims: builtins.bool = False): return argmax(self, axis, keepdims)
    def argmin(self, axis=None, keepdims: builtins.bool = False): return argmin(self, axis, keepdims)
    def softmax(self, axis: int = -1): return softmax(self, axis)
    def log_softmax(self, axis: int = -1): return log_softmax(self, axis)
    def logsumexp(self, axis=None, keepdims: builtins.bool = False): return logsumexp(self, axis, keepdims)

    # -- movement -------------------------------------------------------------------------------
    def reshape(self, *shape): return reshape(self, _shape_arg(shape))
    view = reshape
    def permute(self, *dims): return permute(self, _shape_arg(dims))
    def transpose(self, dim0: int = -2, dim1: int = -1): return transpose(self, dim0, dim1)
    def expand(self, *shape): return expand(self, _shape_arg(shape))
    def unsqueeze(self, dim: int): return unsqueeze(self, dim)
    def squeeze(self, dim=None): return squeeze(self, dim)
    def flatten(self, start_dim: int = 0, end_dim: int = -1): return flatten(self, start_dim, end_dim)

    @property
    def T(self) -> "Tensor":
        return permute(self, tuple(reversed(range(self.ndim))))

    def matmul(self, other): return matmul(self, other)

    # -- PyTorch conveniences (PyG code uses them) ------------------------------------------------
    def t(self) -> "Tensor":
        """PyTorch's ``t()``: a 2-D tensor transposed; 0-D and 1-D ones as they are."""
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dimensions, but this one has shape {self.shape}; "
                             "use transpose(dim0, dim1) or permute")
        return self if self.ndim < 2 else transpose(self, 0, 1)

    def nonzero(self, as_tuple: builtins.bool = False) -> Any:
        """PyTorch's ``nonzero``: the indices of the nonzero entries in row-major order, an int64
        ``[n, ndim]`` tensor, or with ``as_tuple=True`` one 1-D index tensor per dimension (a
        0-d tensor counts as one dimension there, as PyTorch).  Not differentiable."""
        return nonzero(self, as_tuple)

    def new_zeros(self, *size, dtype=None, requires_grad: builtins.bool = False) -> "Tensor":
        """Zeros of ``size`` with this tensor's dtype (unless ``dtype``) and backend (PyTorch's name)."""
        return self._new_filled("new_zeros", size, 0, dtype, requires_grad)

    def new_ones(self, *size, dtype=None, requires_grad: builtins.bool = False) -> "Tensor":
        """Ones of ``size`` with this tensor's dtype (unless ``dtype``) and backend (PyTorch's name)."""
        return self._new_filled("new_ones", size, 1, dtype, requires_grad)

    def new_full(self, size, fill_value, dtype=None, requires_grad: builtins.bool = False) -> "Tensor":
        """``fill_value`` everywhere, with this tensor's dtype (unless ``dtype``) and backend."""
        return self._new_filled("new_full", (size,), fill_value, dtype, requires_grad)

    def new_empty(self, *size, dtype=None, requires_grad: builtins.bool = False) -> "Tensor":
        """PyTorch's ``new_empty``; polygrad hands out no uninitialised memory, so these are zeros."""
        return self._new_filled("new_empty", size, 0, dtype, requires_grad)

    def _new_filled(self, what: str, size: tuple, value: Any, dtype: Any, requires_grad: builtins.bool) -> "Tensor":
        shape = _shape_arg(size, f"Tensor.{what}")
        return _filled(shape, value, as_dtype(dtype) if dtype is not None else self.dtype, requires_grad, self._be)

    def masked_fill(self, mask, value) -> "Tensor":
        """PyTorch's ``masked_fill``, out of place: ``value`` where ``mask``, else this tensor."""
        return masked_fill(self, mask, value)

    def index_put(self, indices, values, accumulate: builtins.bool = False) -> "Tensor":
        """PyTorch's ``index_put``, out of place: this tensor with ``self[indices] = values``
        (``accumulate=True``: ``+=``, repeated positions adding up)."""
        return index_put(self, indices, values, accumulate)

    def __setitem__(self, index, value) -> None:
        raise GraphError(f"tensor[...] = ... : polygrad tensors are not written in place (the recorded graph and "
                         f"compiled steps read them as they were); write x = x.masked_fill(mask, value), "
                         f"x = pg.where(mask, value, x) or x = x.index_put(indices, values) (tensor of shape "
                         f"{self.shape}, index {index!r:.60})")

    def __format__(self, spec: str) -> str:
        """PyTorch's ``__format__``: a 0-d tensor formats as its number (``f"{loss:.4f}"``); any
        other tensor takes only an empty spec (its repr), as PyTorch."""
        if self.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise DTypeError(f"unsupported format string {spec!r} passed to Tensor.__format__ for a tensor of "
                             f"shape {self.shape} (only a 0-d tensor formats as a number: use t.item() or t.sum())")
        return str(self)

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(", threshold=50)
        extra = f", dtype={self.dtype}, backend={self.backend!r}"
        if self.requires_grad:
            extra += ", requires_grad=True" if self._node is None else f", grad_fn={self.op}"
        return f"tensor({body}{extra})"


_make = Tensor._make
Tensor._new = staticmethod(Tensor._make)  # graph.TensorBase: how the lower layers make tensors


def dlpack_source(t: Tensor) -> Any:
    """The array a tensor exports through DLPack: its backend array when that speaks DLPack
    (numpy, cupy: zero-copy), else a host copy (e.g. the scalar backend's lists)."""
    data = t._data
    if hasattr(data, "__dlpack__") and hasattr(data, "__dlpack_device__"):
        return data
    return t.numpy()


def _int_arg(what: str, value: Any) -> int:
    """``value`` as an int: ints and numpy integers only (a float or a bool is a mistake, not a size)."""
    if type(value) is int:  # the common case, first (shapes in VJP rules)
        return value
    if isinstance(value, (bool, np.bool_)):
        raise DTypeError(f"{what}: expected an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise DTypeError(f"{what}: expected an integer, got {type(value).__name__} {value!r:.60}") from None


def _shape_arg(shape: tuple, what: str = "shape") -> tuple:
    dims = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return tuple(_int_arg(what, s) for s in dims)


def _dim_arg(what: str, dim: Any, ndim: int) -> int:
    """One axis of a tensor of ``ndim`` dims, negative counting from the end; out of range is an error."""
    d = _int_arg(what, dim)
    if not -ndim <= d < ndim:
        raise ShapeError(f"{what}: dim {d} is out of range for a tensor of {ndim} dims")
    return d % ndim


def _alloc(what: str, shape: tuple, dtype: Any, make):
    """Run a host allocation of ``shape``/``dtype``, refusing sizes numpy or the memory budget cannot take."""
    check_dims(what, shape)
    memory.check(what, memory.nbytes(shape, dtype), what=f"a {np.dtype(dtype)} array of shape {shape}")
    try:
        return make()
    except MemoryError as exc:  # the budget is an estimate: the allocation itself may still fail
        raise MemoryBudgetError(f"{what}: cannot allocate a {np.dtype(dtype)} array of shape {shape}: {exc}") from None


def _floating(t: Tensor) -> Tensor:
    return t if t.dtype.kind == "f" else t.cast(default_float)


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
    return Tensor._make(data, be, tuple(array.shape), np.dtype(array.dtype))


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
    if isinstance(data, np.ndarray) and dispatch._recording.get() is not None:
        dispatch._recording.get().host_array(data)  # pg.compile guards numpy data by content
    if isinstance(data, Tensor):
        array = data.numpy()
    elif be.owns(data):
        if (shares_arrays(be) and supports_dtype(be, np.dtype(be.dtype(data)))
                and (dtype is None or as_dtype(dtype) == be.dtype(data))):
            # an immutable array: sharing it is a copy, and it stays on its device (no host trip)
            t = Tensor._make(data, be, tuple(be.shape(data)), np.dtype(be.dtype(data)))
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


# -- operand handling ---------------------------------------------------------------------------------

def _as_operand(x: Any, like: Tensor) -> Tensor:
    """A Python number / numpy array as a constant tensor on ``like``'s backend."""
    if isinstance(x, Tensor):
        return x
    try:  # zero-cost unless raised; an int too large for the dtype is the user's error
        tx = type(x)
        if tx is float:  # the common case first: a Python float next to a float tensor
            dtype = like.dtype if like.dtype.kind == "f" else default_float
            return _make(like._be.from_numpy(np.asarray(x, dtype=dtype)), like._be, (), dtype)
        if tx is int and like.dtype.kind in "fi":
            return _make(like._be.from_numpy(np.asarray(x, dtype=like.dtype)), like._be, (), like.dtype)
        if isinstance(x, (bool, np.bool_)):
            dtype = bool_ if like.dtype == bool_ else like.dtype
        elif isinstance(x, (complex, np.complexfloating)):
            raise DTypeError(f"complex operand {x!r} is not supported (polygrad supports float, int and bool)")
        elif isinstance(x, Number) and not isinstance(x, (int, np.integer)):
            dtype = like.dtype if like.dtype.kind == "f" else default_float
        elif isinstance(x, (int, np.integer)):
            dtype = like.dtype if like.dtype != bool_ else int64
        else:
            try:
                arr = np.asarray(x)
            except (ValueError, TypeError) as exc:  # ragged nested lists
                raise ShapeError(f"cannot use a {type(x).__name__} as a tensor operand: {exc}") from None
            if arr.dtype == object:
                raise DTypeError(f"cannot use a {type(x).__name__} as a tensor operand")
            return tensor(arr, backend=like._be)
        return tensor_from_numpy(np.asarray(x, dtype=dtype), like._be)
    except OverflowError as exc:
        raise DTypeError(f"operand {x!r:.60} does not fit a tensor of dtype {like.dtype}: {exc}") from None


def _pair(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor):
        if not isinstance(b, Tensor):
            raise DTypeError("at least one operand must be a polygrad tensor")
        a = _as_operand(a, b)
        if a.dtype.kind == "f" and b.dtype.kind != "f":  # int tensor * 0.5 -> default float, as PyTorch
            b = b.cast(a.dtype)
    elif not isinstance(b, Tensor):
        b = _as_operand(b, a)
        if b.dtype.kind == "f" and a.dtype.kind != "f":
            a = a.cast(b.dtype)
    if getattr(a, "layout", "dense") != "dense" or getattr(b, "layout", "dense") != "dense":
        sparse = a if getattr(a, "layout", "dense") != "dense" else b
        raise ShapeError(f"this op has no sparse form: got a sparse {sparse.shape} ({sparse.layout}) operand; "
                         "apply it to the stored values (A.apply_values(fn)) or densify (A.to_dense())")
    return a, b


# -- sparse operands ------------------------------------------------------------------------------
# polygrad.sparse sits above this module (its SparseTensor is a Tensor), so the dense API reaches
# the sparse one through this table, which the sparse package fills when it is imported
# (``import polygrad`` imports it, before any tensor exists).
_SPARSE_API: dict[str, Callable[..., Any]] = {}


def register_sparse_api(**functions: Callable[..., Any]) -> None:
    """Called once by ``polygrad.sparse``: the functions Tensor routes sparse operands to."""
    _SPARSE_API.update(functions)


def _sparse(name: str) -> Callable[..., Any]:
    try:
        return _SPARSE_API[name]
    except KeyError:
        raise PolygradError(f"the sparse API ({name}) is not loaded: "
                            "import polygrad, not polygrad.tensor alone") from None


def _sparse_binary(name: str, a: Any, b: Any) -> Any:
    return _sparse(name)(a, b)


def is_sparse(x: Any) -> TypeGuard[SparseTensor]:
    """Whether ``x`` is a sparse tensor (a :class:`~polygrad.sparse.SparseTensor`)."""
    return isinstance(x, Tensor) and x.layout != "dense"


def add(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("add", a, b)
    a, b = _pair(a, b)
    return apply(Op.ADD, (a, b))


def mul(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("mul", a, b)
    a, b = _pair(a, b)
    return apply(Op.MUL, (a, b))


def sub(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("sub", a, b)
    a, b = _pair(a, b)
    return apply(Op.ADD, (a, apply(Op.NEG, (b,))))


def div(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("div", a, b)
    a, b = _pair(a, b)
    return apply(Op.MUL, (_floating(a), apply(Op.RECIPROCAL, (_floating(b),))))


def pow(a, b) -> Tensor:  # noqa: A001
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("pow", a, b)
    a, b = _pair(a, b)
    if a.dtype.kind != "f" and b.dtype.kind != "f":
        a = a.cast(default_float)
    return apply(Op.POW, (a, b))


def maximum(a, b) -> Tensor:
    a, b = _pair(a, b)
    return apply(Op.MAXIMUM, (a, b))


def minimum(a, b) -> Tensor:
    a, b = _pair(a, b)
    if a.dtype.kind != "f" and b.dtype.kind != "f":  # no gradient, and negation would wrap unsigned
        return where(a <= b, a, b)
    return -apply(Op.MAXIMUM, (-a, -b))  # -max(-a, -b): ties split the gradient as in maximum


def abs(x: Tensor) -> Tensor:  # noqa: A001 - |x| = max(x, -x); gradient 0 at 0 by the tie rule
    if x.dtype.kind in "ub":
        return x
    return maximum(x, -x)


def clip(x: Tensor, lo=None, hi=None) -> Tensor:
    """``x`` limited to ``[lo, hi]``.  As PyTorch's clamp, the gradient w.r.t. ``x`` is 1 on the
    closed interval (its bounds included), 0 outside and at NaN (which stays NaN); a tensor bound
    gets the gradient where it is the one taken."""
    # inside the bounds: x; outside: the bound; NaN: stays NaN with gradient 0 (PyTorch)
    if lo is not None:
        x = where(x >= lo, x, where(x < lo, lo, x.detach()))
    if hi is not None:
        x = where(x <= hi, x, where(x > hi, hi, x.detach()))
    return x


def _compare(op: Op, a, b) -> Tensor:
    a, b = _pair(a, b)
    return apply(op, (a, b))


def where(cond, a, b) -> Tensor:
    """Elementwise ``a if cond else b`` (cond: bool tensor or array); differentiable in a and b."""
    like = next((x for x in (a, b, cond) if isinstance(x, Tensor)), None)
    if like is None:
        raise DTypeError("where(): at least one operand must be a polygrad tensor")
    if not isinstance(cond, Tensor):
        try:
            cond = np.asarray(cond, dtype=bool)
        except (ValueError, TypeError) as exc:  # ragged nested lists
            raise ShapeError(f"where(): cannot use a {type(cond).__name__} as a condition: {exc}") from None
        cond = tensor(cond, backend=like._be)
    if not isinstance(a, Tensor):
        a = _as_operand(a, b if isinstance(b, Tensor) else like)
    if not isinstance(b, Tensor):
        b = _as_operand(b, a)
    return apply(Op.WHERE, (cond, a, b))


def sigmoid(x: Tensor) -> Tensor:
    # 1 / (1 + exp(-x)), written as 0.5 * (1 + tanh(x / 2)): never overflows, same gradient
    x = _floating(x)
    return 0.5 * (1 + (x * 0.5).tanh())


# -- reductions ---------------------------------------------------------------------------------------

def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    if is_sparse(x):
        return _sparse("sum")(x, axis, keepdims)
    return apply(Op.SUM, (x,), {"axes": normalize_axes(Op.SUM, axis, x.ndim), "keepdims": keepdims})


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    axes = normalize_axes(Op.SUM, axis, x.ndim)
    count = math.prod(x.shape[a] for a in axes)
    return sum(_floating(x), axes, keepdims) * (1.0 / count if count else math.nan)


def max(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The maximum over ``axis`` (all axes by default).  ``max(dim=1)`` gives the values only -- numpy's
    ``amax``, PyTorch's ``torch.amax`` -- not PyTorch's ``(values, indices)``: use ``argmax`` for those."""
    return apply(Op.MAX, (x,), {"axes": normalize_axes(Op.MAX, axis, x.ndim), "keepdims": keepdims})


def min(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The minimum over ``axis``; like :func:`max`, the values only (``argmin`` gives the indices)."""
    if x.dtype.kind in "ub":  # negation would wrap (unsigned) or is undefined (bool)
        return (-max(-x.cast(int64), axis, keepdims)).cast(x.dtype)
    return -max(-x, axis, keepdims)


def argmax(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the maximum (no gradient); computed on the host.  Ties: the first index."""
    return _arg_extreme("argmax", np.argmax, x, axis, keepdims)


def argmin(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the minimum (no gradient); computed on the host.  Ties: the first index."""
    return _arg_extreme("argmin", np.argmin, x, axis, keepdims)


def _arg_extreme(name: str, np_fn, x: Tensor, axis, keepdims: bool) -> Tensor:
    if axis is not None:
        axis = _dim_arg(name, axis, builtins.max(x.ndim, 1))
    if x.numel == 0 or (axis is not None and x.ndim and x.shape[axis] == 0):
        raise ShapeError(f"{name}: reduction over an empty axis of shape {x.shape} has no identity")
    arr = x.numpy()
    out = np_fn(arr, axis=axis, keepdims=bool(keepdims)) if x.ndim else np_fn(arr)
    return tensor(out, dtype=int64, backend=x._be)


def _shift(x: Tensor, axis) -> Tensor:
    """The max along ``axis`` (kept), detached, with non-finite maxima replaced by 0: subtracting
    it keeps exp() in range, and a row of -inf (or one +inf) must not turn into inf - inf = nan.
    The results below are shift-invariant, so no gradient needs to flow through it."""
    m = max(x, axis, keepdims=True).detach()
    return where(m.abs() < math.inf, m, 0.0)


def logsumexp(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    m = _shift(x, axis)
    out = sum((x - m).exp(), axis, keepdims=True).log() + m
    return out if keepdims else squeeze(out, normalize_axes(Op.SUM, axis, x.ndim))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    e = (x - _shift(x, axis)).exp()
    return e / sum(e, axis, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    shifted = x - _shift(x, axis)
    return shifted - sum(shifted.exp(), axis, keepdims=True).log()


def _target_indices(target) -> np.ndarray:
    try:
        arr = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"cross_entropy: class targets must be an integer array: {exc}") from None
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"cross_entropy: class targets must be integers, got {arr.dtype}")
    return arr.astype(np.int64)


def cross_entropy(logits: Tensor, target, mask=None, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis of ``logits`` [N, C].

    ``target``: integer class indices [N] (or class probabilities [N, C]).  ``mask``: a boolean
    mask [N] or an index array selecting which rows count (e.g. the training nodes of a graph).
    """
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be [N, C], got {logits.shape}")
    if mask is not None:
        rows = _mask_rows(mask, logits.shape[0])
        logits = logits[rows]
        if isinstance(target, Tensor) and target.dtype.kind == "f":
            target = target[rows]
        else:
            target = _target_indices(target)[rows]
    logp = log_softmax(logits, -1)
    if isinstance(target, Tensor) and target.dtype.kind == "f":
        if target.shape != logits.shape:
            raise ShapeError(f"cross_entropy: probability targets {target.shape} must match logits {logits.shape}")
        losses = -(target * logp).sum(-1)
    else:
        idx = _target_indices(target)
        if idx.shape != (logits.shape[0],):
            raise ShapeError(f"cross_entropy: targets {idx.shape} must be [N] for logits {logits.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= logits.shape[1]):
            raise ShapeError(f"cross_entropy: target class out of range [0, {logits.shape[1]})")
        losses = -logp[np.arange(idx.shape[0]), idx]
    return reduce_losses(losses, reduction, "cross_entropy")


def reduce_losses(losses: Tensor, reduction: str, name: str) -> Tensor:
    """The ``reduction=`` argument every loss takes: "mean", "sum" or "none"."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _mask_rows(mask, n: int) -> np.ndarray:
    try:
        arr = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"mask must be a bool mask [{n}] or integer row indices: {exc}") from None
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ShapeError(f"mask of shape {arr.shape} does not match {n} rows")
        return np.flatnonzero(arr)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise DTypeError(f"mask must be a bool mask [{n}] or 1-D integer row indices, got {arr.dtype} {arr.shape}")
    rows = arr.astype(np.int64).reshape(-1)
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise IndexOutOfRangeError(f"mask: row index out of range for {n} rows")
    return rows


def mse(pred: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean squared error; ``pred`` and a tensor ``target`` must have the same shape (an [N, 1]
    prediction against [N] targets would otherwise broadcast to [N, N] silently)."""
    target = _as_operand(target, pred)
    if target.shape != pred.shape and target.ndim:
        raise ShapeError(f"mse: prediction of shape {pred.shape} and target of shape {target.shape} differ "
                         "(reshape one explicitly; broadcasting them would be a silent mistake)")
    d = pred - target
    return reduce_losses(d * d, reduction, "mse")


# -- movement -----------------------------------------------------------------------------------------

def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = _shape_arg(tuple(shape), "reshape")
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.numel % known:
            raise ShapeError(f"reshape: cannot reshape {x.shape} into {shape}")
        shape = tuple(x.numel // known if s == -1 else s for s in shape)
    if shape == x.shape:
        return x
    return apply(Op.RESHAPE, (x,), {"shape": shape})


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    perm = tuple(_dim_arg("permute", d, x.ndim) for d in dims) if x.ndim else _shape_arg(tuple(dims), "permute")
    if perm == tuple(range(x.ndim)):
        return x
    return apply(Op.PERMUTE, (x,), {"perm": perm})


def transpose(x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
    if is_sparse(x):
        return _sparse("transpose")(x)
    if x.ndim < 2:
        return x
    dim0, dim1 = _dim_arg("transpose", dim0, x.ndim), _dim_arg("transpose", dim1, x.ndim)
    perm = list(range(x.ndim))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return permute(x, perm)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = _shape_arg(tuple(shape), "expand")
    if shape == x.shape:
        return x
    return apply(Op.EXPAND, (x,), {"shape": shape})


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    dim = _dim_arg("unsqueeze", dim, x.ndim + 1)
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


def squeeze(x: Tensor, dim=None) -> Tensor:
    if dim is None:
        return reshape(x, tuple(s for s in x.shape if s != 1))
    dims = normalize_axes(Op.RESHAPE, dim, x.ndim)
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if not (i in dims and s == 1)))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _dim_arg("flatten", start_dim, x.ndim), _dim_arg("flatten", end_dim, x.ndim)
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def _normalize_index(index: Any, shape: tuple) -> tuple:
    """A numpy-style index with tensors/lists turned into int64 arrays and bool masks into indices."""
    if not isinstance(index, tuple):
        index = (index,)
    out: list = []
    dim = 0
    for pos, item in enumerate(index):
        if isinstance(item, Tensor):
            item = item.numpy()
        elif isinstance(item, np.ndarray) and dispatch._recording.get() is not None:
            dispatch._recording.get().host_array(item)  # pg.compile guards a numpy index by content
        if isinstance(item, list):
            try:
                item = np.asarray(item)
            except (ValueError, TypeError) as exc:  # ragged nested lists
                raise ShapeError(f"getitem: invalid index list for a tensor of shape {shape}: {exc}") from None
        if isinstance(item, np.ndarray):
            if item.dtype == bool and item.ndim == 0:
                raise DTypeError("getitem: a 0-d bool tensor is not a valid index")
            if item.dtype == bool:
                if item.shape != shape[dim:dim + item.ndim]:
                    raise ShapeError(f"getitem: boolean mask of shape {item.shape} does not match "
                                     f"dims {shape[dim:dim + item.ndim]} of a tensor of shape {shape}")
                out.extend(np.nonzero(item))
                dim += item.ndim
                continue
            if item.dtype.kind not in "iu":
                raise DTypeError(f"getitem: index arrays must be integer or bool, got {item.dtype}")
            out.append(item.astype(np.int64, copy=False))
            dim += 1
        elif isinstance(item, (bool, np.bool_)):
            raise DTypeError("getitem: a bare bool is not a valid index")
        elif isinstance(item, (int, np.integer)):
            out.append(int(item))
            dim += 1
        elif item is None or item is Ellipsis:
            out.append(item)
            if item is Ellipsis:
                dim = len(shape) - builtins.sum(_dims_consumed(i) for i in index[pos + 1:])
        elif isinstance(item, slice):
            out.append(item)
            dim += 1
        else:
            raise DTypeError(f"getitem: unsupported index {item!r}")
    return tuple(out)


def _dims_consumed(item: Any) -> int:
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, np.ndarray) and item.dtype == bool:
        return item.ndim
    return 1


def getitem(x: Tensor, index: Any) -> Tensor:
    if is_sparse(x):
        raise ShapeError("indexing a sparse tensor is not supported; use to_dense() or gather rows densely")
    return apply(Op.GETITEM, (x,), {"index": _normalize_index(index, x.shape)})


def index_add(src: Tensor, index: Any, shape: Sequence[int]) -> Tensor:
    """zeros(shape) with ``src`` added at ``index`` (repeated positions accumulate)."""
    shape = _shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), "index_add")
    return apply(Op.INDEX_ADD, (src,), {"index": _normalize_index(index, shape), "shape": shape})


def nonzero(x: Tensor, as_tuple: bool = False) -> Any:
    """PyTorch's ``torch.nonzero`` (see :meth:`Tensor.nonzero`); reads the values on the host."""
    if is_sparse(x):
        raise ShapeError("nonzero of a sparse tensor: its stored positions are x.pattern (rows, cols)")
    dispatch.note_host_read(x)  # a pg.compile capture guards what the indices came from
    host = x.numpy()
    if as_tuple:
        parts = np.nonzero(host.reshape(1) if host.ndim == 0 else host)
        return tuple(tensor_from_numpy(p.astype(np.int64), x._be) for p in parts)
    return tensor_from_numpy(np.argwhere(host).astype(np.int64), x._be)


def masked_fill(x: Tensor, mask: Any, value: Any) -> Tensor:
    """PyTorch's ``masked_fill``, out of place and differentiable: ``value`` (a number or a 0-d
    tensor) where the bool ``mask`` (broadcast to ``x``) is set, ``x`` elsewhere; ``x``'s dtype."""
    m = mask if isinstance(mask, Tensor) else tensor(np.asarray(mask), backend=x._be)
    if m.dtype != bool_:
        raise DTypeError(f"masked_fill: the mask must be a bool tensor, got {m.dtype} (tensor of shape {x.shape})")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
    out = where(m, value, x)
    if out.shape != x.shape:
        raise ShapeError(f"masked_fill: mask of shape {m.shape} does not broadcast to the tensor's {x.shape}")
    return out if out.dtype == x.dtype else out.cast(x.dtype)


def index_put(x: Tensor, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
    """PyTorch's ``index_put``, out of place and differentiable in ``x`` and ``values``.

    ``indices``: a tuple (or list) of index tensors / arrays, one per leading dimension (bool
    masks allowed), or one mask; ``values`` broadcast to ``x[indices]``.  ``accumulate=True``
    adds (repeated positions add up, as PyTorch); otherwise the positions are overwritten, and a
    position named twice is an error (PyTorch leaves the result undefined).
    """
    index = tuple(indices) if isinstance(indices, list) else indices
    norm = _normalize_index(index, x.shape)
    selected = np.zeros(x.shape, dtype=np.int64)
    np.add.at(selected, norm, 1)  # how often each position is named
    shape = np.zeros(x.shape, dtype=bool)[norm].shape
    v = values if isinstance(values, Tensor) else _as_operand(values, x)
    v = v if v.dtype == x.dtype else v.cast(x.dtype)
    if v.shape != shape:
        try:
            target = np.broadcast_shapes(v.shape, shape)
        except ValueError:
            target = None
        if target != shape:
            raise ShapeError(f"index_put: values of shape {v.shape} do not broadcast to x[indices] of shape {shape} "
                             f"(tensor of shape {x.shape})")
        v = expand(v.reshape((1,) * (len(shape) - v.ndim) + v.shape), shape)
    placed = index_add(v, norm, x.shape)
    if accumulate:
        return x + placed
    if (selected > 1).any():
        where_twice = tuple(int(i) for i in np.argwhere(selected > 1)[0])
        raise ShapeError(f"index_put: position {where_twice} of a tensor of shape {x.shape} is named more than once "
                         "(the result would depend on the order); pass accumulate=True to add")
    return where(tensor_from_numpy(selected > 0, x._be), placed, x)


def _tensor_list(what: str, tensors: Any) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Iterable):
        raise DTypeError(f"{what}: expects a sequence of tensors, got {type(tensors).__name__}")
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise DTypeError(f"{what}: expects tensors, got a {type(t).__name__}")
    return tensors


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _tensor_list("concat", tensors)
    if not tensors:
        raise ShapeError("concat: needs at least one tensor")
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ShapeError("concat: zero-dimensional tensors cannot be concatenated (use stack)")
    if any(t.ndim != ndim for t in tensors):
        raise ShapeError(f"concat: all tensors need the same number of dims, got "
                         f"{', '.join(str(t.shape) for t in tensors)}")
    axis = normalize_axes(Op.CONCAT, axis, ndim)[0]
    if len(tensors) == 1:
        return tensors[0]
    return apply(Op.CONCAT, tuple(tensors), {"axis": axis})


cat = concat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _tensor_list("stack", tensors)
    if not tensors:
        raise ShapeError("stack: needs at least one tensor")
    axis = _dim_arg("stack", axis, tensors[0].ndim + 1)
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ShapeError(f"stack: all tensors need the same shape, got {', '.join(str(t.shape) for t in tensors)}")
    parts = [unsqueeze(t, axis) for t in tensors]
    return parts[0] if len(parts) == 1 else apply(Op.CONCAT, tuple(parts), {"axis": axis})


def matmul(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse("matmul")(a, b)
    a, b = _pair(a, b)
    a_sparse = _sparse("maybe_sparsify_for_matmul")(a, b)
    if a_sparse is not None:
        return _sparse("matmul")(a_sparse, b)
    return apply(Op.MATMUL, (a, b))


# -- sparse primitives (the pattern rides in attrs; values are a dense 1-D operand) --------------------

def spmm(values: Tensor, x: Tensor, pattern) -> Tensor:
    """``A @ X`` for the sparse matrix (pattern, values): touches only A's nonzeros."""
    return apply(Op.SPMM, (values, x), {"pattern": pattern}, pattern.layout)


def sddmm(p: Tensor, q: Tensor, pattern) -> Tensor:
    """``(P @ Qᵀ)`` sampled at the pattern's nonzeros: one value per nonzero, O(nnz·F)."""
    return apply(Op.SDDMM, (p, q), {"pattern": pattern}, pattern.layout)


def segment_sum(values: Tensor, pattern) -> Tensor:
    """Row sums of the sparse matrix (pattern, values) (deterministic segment reduction)."""
    return apply(Op.SEGMENT_SUM, (values,), {"pattern": pattern}, pattern.layout)


def segment_max(values: Tensor, pattern) -> Tensor:
    """Row maxima over the nonzeros (no gradient; empty rows give 0)."""
    return apply(Op.SEGMENT_MAX, (values,), {"pattern": pattern}, pattern.layout)


# -- PyTorch's names ------------------------------------------------------------------------------------
# dim=/keepdim= wherever axis=/keepdims= are taken (see polygrad.torch_names); wrapped here, once,
# so each op keeps one signature in numpy's names.
sum = accept_torch_names(sum)  # noqa: A001
mean = accept_torch_names(mean)
max = accept_torch_names(max)  # noqa: A001
min = accept_torch_names(min)  # noqa: A001
argmax = accept_torch_names(argmax)
argmin = accept_torch_names(argmin)
logsumexp = accept_torch_names(logsumexp)
softmax = accept_torch_names(softmax)
log_softmax = accept_torch_names(log_softmax)
concat = accept_torch_names(concat)
stack = accept_torch_names(stack)
cat = concat
for _name in ("sum", "mean", "max", "min", "argmax", "argmin", "logsumexp", "softmax", "log_softmax"):
    setattr(Tensor, _name, accept_torch_names(getattr(Tensor, _name), f"Tensor.{_name}"))
del _name
