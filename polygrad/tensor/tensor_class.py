"""``Tensor``: the user-facing n-d array with autodiff.

Its methods and operators are the functions of this package (one definition per op: ``x + y`` is
:func:`~polygrad.tensor.elementwise.add`, ``x.sum()`` is :func:`~polygrad.tensor.reductions.sum`, ...).
"""
from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from ..engine import dispatch
from ..runtime import sharing
from ..engine.autodiff import backward as _backward
from ..engine.dispatch import apply
from ..ir.dtypes import as_dtype, bool_, float32, float64, int64
from ..ir.errors import DTypeError, GraphError, ShapeError
from ..engine.graph import TensorBase
from ..ir.ops import Op
from ..runtime.registry import resolve
from .torch_names import accept_torch_names

from .elementwise import _compare, _constant, abs, add, clip, div, maximum, minimum, mul, pow, sigmoid, sub  # noqa: A004
from .creation import _filled, _rebuild_tensor
from .args import _floating, _shape_arg
from .sparse_routing import _sparse
from .reductions import _mean, _reduce_attrs, _sum, argmax, argmin, log_softmax, logsumexp, max, min, softmax
from .movement import expand, flatten, permute, reshape, squeeze, transpose, unsqueeze
from .indexing import getitem, index_put, masked_fill, nonzero
from .linalg import _dense_matmul, matmul


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
        be, given = self._be, new
        if not be.owns(new):
            new = be.from_numpy(np.asarray(new, dtype=self.dtype))
        if be.shape(new) != self.shape:
            raise ShapeError(f"Tensor.update_: values of shape {be.shape(new)} for a tensor of shape {self.shape}")
        if be.dtype(new) != self.dtype:
            new = be.from_numpy(be.to_numpy(new).astype(self.dtype))
        if new is given:  # kept without a copy: the caller can still write into it, as after pg.from_numpy
            sharing.mark_shared(new)
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
        """DLPack export of the backend array (zero-copy for numpy/cupy); see polygrad.tensor.interop."""
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
    # Fast paths, each what the function beside it does for these operands: two plain dense
    # tensors (never sparse, nothing to wrap) go straight to the primitive; a Python int or float
    # next to a floating tensor becomes a cached constant of its dtype (elementwise._constant).
    def __add__(self, other):
        if type(self) is Tensor:
            if type(other) is Tensor:
                return apply(_ADD, (self, other))
            if type(other) in _NUMBER and self.dtype.kind == "f":
                return apply(_ADD, (self, _constant(other, self.dtype, self._be)))
        return add(self, other)

    def __radd__(self, other):
        if type(self) is Tensor and type(other) in _NUMBER and self.dtype.kind == "f":
            return apply(_ADD, (_constant(other, self.dtype, self._be), self))
        return add(other, self)

    def __sub__(self, other): return sub(self, other)

    def __rsub__(self, other):
        if type(self) is Tensor and type(other) in _NUMBER and self.dtype.kind == "f":
            return apply(_ADD, (_constant(other, self.dtype, self._be), apply(_NEG, (self,))))
        return sub(other, self)

    def __mul__(self, other):
        if type(self) is Tensor:
            if type(other) is Tensor:
                return apply(_MUL, (self, other))
            if type(other) in _NUMBER and self.dtype.kind == "f":
                return apply(_MUL, (self, _constant(other, self.dtype, self._be)))
        return mul(self, other)

    def __rmul__(self, other):
        if type(self) is Tensor and type(other) in _NUMBER and self.dtype.kind == "f":
            return apply(_MUL, (_constant(other, self.dtype, self._be), self))
        return mul(other, self)

    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __pow__(self, other): return pow(self, other)
    def __rpow__(self, other): return pow(other, self)

    def __matmul__(self, other):
        if type(self) is Tensor and type(other) is Tensor:
            return _dense_matmul(self, other)
        return matmul(self, other)

    def __rmatmul__(self, other): return matmul(other, self)
    def __neg__(self): return apply(Op.NEG, (self,))
    def __pos__(self): return self
    def __lt__(self, other): return _compare(Op.LT, self, other)
    def __le__(self, other): return _compare(Op.LE, self, other)
    def __gt__(self, other): return _compare(Op.GT, self, other)
    def __ge__(self, other): return _compare(Op.GE, self, other)
    # == and != with an operand no tensor compares with (None, a string, any other object) return
    # NotImplemented, so Python falls back to identity (x == None is False, as for a torch tensor)
    def __eq__(self, other): return NotImplemented if _foreign(other) else _compare(Op.EQ, self, other)
    def __ne__(self, other): return NotImplemented if _foreign(other) else _compare(Op.NE, self, other)
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
    def expm1(self): return apply(Op.EXPM1, (_floating(self),))
    def relu(self): return apply(_RELU, (self,))
    def reciprocal(self): return apply(Op.RECIPROCAL, (_floating(self),))
    def sigmoid(self): return sigmoid(self)
    # x ** 0.5, so pow's IEEE edge values: the gradient at -0.0 is +inf and at -inf is 0, where
    # PyTorch's (sqrt and pow(x, 0.5) alike, through rsqrt) are -inf and NaN; elsewhere the same
    def sqrt(self): return _floating(self) ** 0.5
    def abs(self): return abs(self)
    def maximum(self, other): return maximum(self, other)
    def minimum(self, other): return minimum(self, other)
    def clip(self, lo=None, hi=None): return clip(self, lo, hi)

    # -- reductions -----------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: builtins.bool = False):
        if axis is None and type(self) is Tensor and type(keepdims) is builtins.bool:  # reductions.sum's dense case
            return apply(_SUM, (self,), _reduce_attrs(_SUM, None, len(self.shape), keepdims))
        return _sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims: builtins.bool = False): return _mean(self, axis, keepdims)
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
def _foreign(x: Any) -> builtins.bool:
    """Whether ``x`` is no operand of a comparison: not a tensor, a number, an array or a list."""
    return not isinstance(x, (TensorBase, int, float, builtins.bool, np.ndarray, np.generic, list, tuple))


_SUM = Op.SUM
_NUMBER = frozenset({int, float})  # the Python numbers a floating tensor takes as constants of its dtype
_ADD, _MUL, _NEG, _RELU = Op.ADD, Op.MUL, Op.NEG, Op.RELU  # (an Enum member lookup is not free)
TensorBase._new = staticmethod(Tensor._make)  # how the lower layers, and this package's functions, make tensors


def dlpack_source(t: Tensor) -> Any:
    """The array a tensor exports through DLPack: its backend array when that speaks DLPack
    (numpy, cupy: zero-copy), else a host copy (e.g. the scalar backend's lists)."""
    data = t._data
    if hasattr(data, "__dlpack__") and hasattr(data, "__dlpack_device__"):
        return data
    return t.numpy()


# PyTorch's dim=/keepdim= on the methods too (see polygrad.tensor.torch_names)
for _name in ("sum", "mean", "max", "min", "argmax", "argmin", "logsumexp", "softmax", "log_softmax"):
    setattr(Tensor, _name, accept_torch_names(getattr(Tensor, _name), f"Tensor.{_name}"))
del _name
