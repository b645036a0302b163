"""The sparse tensor: a shared :class:`~polygrad.sparse.pattern.Pattern` plus a dense 1-D tensor of values.

Also the few value-level operations its methods are made of (transpose, sums, densification,
row/column scaling, row softmax), so the container depends on nothing above it in this package.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..runtime import memory
from ..engine.dispatch import is_grad_enabled
from ..ir.dtypes import default_float
from ..ir.errors import DTypeError, GraphError, MixedBackendError, ShapeError
from ..engine.inference import normalize_axes
from ..ir.ops import Op
from .pattern import Pattern
from ..runtime.registry import resolve
from ..tensor.torch_names import accept_torch_names
from ..tensor import Tensor, index_add, segment_max, segment_sum, tensor, tensor_from_numpy
from ..tensor.elementwise import _as_operand
from .layout import _check_layout


# =====================================================================================================
# the container
# =====================================================================================================

class SparseTensor(Tensor):
    """A 2-D sparse matrix: a canonical :class:`Pattern` and a dense 1-D tensor of ``nnz`` values.

    Build with :func:`sparse_coo`, :func:`sparse_csr`, :func:`from_edge_index`, :func:`from_scipy`,
    ``t.to_sparse()`` or ``pg.tensor(data, layout="auto")``.  ``A.values`` is an ordinary tensor
    (the optimiser's parameter for learnable sparse weights); ``A.grad`` is a SparseTensor with
    A's pattern.  Ops: ``A @ X``, ``X @ A``, ``A @ B``, ``A.T``, ``+ - * /`` with sparse, dense
    and scalars, ``**`` a positive scalar, ``sum(axis)``, elementwise functions on the values,
    ``row_softmax()``, ``to_dense()``.  Dense-only ops (indexing, reshape, ...) raise ShapeError.
    """

    __slots__ = ("pattern", "_values", "_grad_view")
    pattern: Pattern
    _values: Tensor  # the nnz stored values: the only part in the autodiff graph
    _grad_view: "SparseTensor | None"

    @classmethod
    def _wrap(cls, pattern: Pattern, values: Tensor) -> "SparseTensor":
        t = object.__new__(cls)
        t.pattern = pattern
        t._values = values
        t._be = values._be
        t.shape = pattern.shape
        t.name = None
        t._grad_view = None
        return t

    @classmethod
    def from_pattern(cls, pattern: Pattern, values: Tensor) -> "SparseTensor":
        """A sparse tensor over an existing :class:`Pattern` and a dense 1-D tensor of its ``nnz``
        values, in canonical order (for backends that build patterns themselves, e.g. one kept
        partitioned on a cluster's workers)."""
        if not isinstance(pattern, Pattern) or not isinstance(values, Tensor):
            raise TypeError(f"SparseTensor.from_pattern needs a Pattern and a Tensor, got "
                            f"{type(pattern).__name__} and {type(values).__name__}")
        if values.shape != (pattern.nnz,) or getattr(values, "layout", "dense") != "dense":
            raise ShapeError(f"SparseTensor.from_pattern: values must be a dense 1-D tensor of "
                             f"nnz={pattern.nnz} entries, got {values.shape}")
        return cls._wrap(pattern, values)

    # -- what the dense Tensor keeps in slots, a sparse one derives from its values ---------------
    @property
    def values(self) -> Tensor:
        """The stored values: a dense 1-D tensor of length nnz, in canonical (row-major) order."""
        return self._values

    @property
    def layout(self) -> str:  # type: ignore[override]
        return self.pattern.layout

    @property
    def dtype(self) -> np.dtype:  # type: ignore[override]
        return self._values.dtype

    @property
    def requires_grad(self) -> bool:
        return self._values.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self._values.requires_grad = flag

    @property
    def _node(self):  # type: ignore[override]
        return self._values._node

    @property
    def grad(self) -> "SparseTensor | None":
        """The gradient: a SparseTensor with this tensor's pattern (None before backward)."""
        g = self._values.grad
        if g is None:
            return None
        view = self._grad_view
        if view is None or view._values is not g:
            view = SparseTensor._wrap(self.pattern, g)
            self._grad_view = view
        return view

    @grad.setter
    def grad(self, g) -> None:
        if g is None:
            self._values.grad = None
        elif isinstance(g, SparseTensor) and g.pattern.same_as(self.pattern):
            self._values.grad = g._values
        else:
            raise ShapeError(f"the grad of {_describe(self)} must be None or a sparse tensor with "
                             f"the same pattern, got {_describe(g)}")

    @property
    def _data(self):
        raise ShapeError(f"{_describe(self)} reached a dense-only operation; use "
                         ".to_dense() first, or operate on its .values")

    @property  # type: ignore[override]  # settable property, narrowed to SparseTensor (sparse only takes sparse)
    def data(self) -> "SparseTensor":
        """A detached view (same pattern, same value storage); assign to replace the values."""
        return self.detach()

    @data.setter
    def data(self, other) -> None:
        if isinstance(other, SparseTensor):
            if not other.pattern.same_as(self.pattern):
                raise ShapeError(f"SparseTensor.data: cannot set {_describe(other)} on {_describe(self)}: "
                                 "patterns differ")
            other = other._values
        self._values.data = other

    # -- properties ---------------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of stored entries (explicit zeros included)."""
        return self.pattern.nnz

    @property
    def density(self) -> float:
        return self.pattern.density

    @property
    def indices(self) -> np.ndarray:
        """COO indices, int64 ``[2, nnz]`` (rows, cols), row-major sorted; host numpy."""
        return np.stack([self.pattern.rows, self.pattern.cols])

    @property
    def indptr(self) -> np.ndarray:
        """CSR row pointers, int64 ``[nrows + 1]``; host numpy."""
        return self.pattern.indptr

    @property
    def col_indices(self) -> np.ndarray:
        """CSR column indices, int64 ``[nnz]``; host numpy."""
        return self.pattern.cols

    @property
    def row_indices(self) -> np.ndarray:
        return self.pattern.rows

    def is_coalesced(self) -> bool:
        """Always True: duplicates are summed and entries sorted once, at construction."""
        return True

    def coalesce(self) -> "SparseTensor":
        return self

    # -- conversion ---------------------------------------------------------------------------
    def with_values(self, values) -> "SparseTensor":
        """The same pattern with new values (a tensor of nnz entries; differentiable)."""
        if not isinstance(values, Tensor):
            values = tensor(np.asarray(values), backend=self._be)
        if values.shape != (self.nnz,):
            raise ShapeError(f"with_values: need {self.nnz} values for {_describe(self)}, got shape {values.shape}")
        if values._be is not self._be:
            raise MixedBackendError(f"with_values: values on {values.backend!r} for a sparse tensor on "
                                    f"{self.backend!r}; move one with .to(name)")
        return SparseTensor._wrap(self.pattern, values)

    def numpy(self) -> np.ndarray:
        """The dense matrix as a numpy array (refused with MemoryBudgetError when too large)."""
        n, m = self.shape
        memory.check("to_dense", memory.nbytes(self.shape, self.dtype), backend=self._be,
                     what=f"a dense {self.shape} {self.dtype} matrix")
        out = np.zeros((n, m), dtype=self.dtype)
        out[self.pattern.rows, self.pattern.cols] = self._values.numpy()
        return out

    def to_scipy(self):
        """A ``scipy.sparse.csr_matrix`` (layout "csr") or ``coo_matrix`` (layout "coo"); needs scipy."""
        try:
            import scipy.sparse as sp
        except ImportError:
            raise ImportError("SparseTensor.to_scipy() needs scipy (pip install scipy)") from None
        data = self._values.numpy()
        if self.layout == "coo":
            return sp.coo_matrix((data, (self.pattern.rows, self.pattern.cols)), shape=self.shape)
        return sp.csr_matrix((data, self.pattern.cols, self.pattern.indptr), shape=self.shape)

    def to_dense(self) -> Tensor:
        return to_dense(self)

    def to_sparse(self, layout: str = "csr") -> "SparseTensor":
        """The same tensor under another sparse label (both share the canonical storage)."""
        _check_layout("to_sparse", layout, allow_auto=False)
        return SparseTensor._wrap(self.pattern.with_layout(layout), self._values)

    def detach(self) -> "SparseTensor":
        return SparseTensor._wrap(self.pattern, self._values.detach())

    def to(self, backend: Any) -> "SparseTensor":
        """A copy on another backend (the pattern is shared; its index arrays are converted once)."""
        be = resolve(backend)
        if be is self._be:
            return self
        return SparseTensor._wrap(self.pattern, self._values.to(be))

    def cast(self, dtype: Any) -> "SparseTensor":
        return self.with_values(self._values.cast(dtype))

    astype = cast

    # -- autodiff -----------------------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False, create_graph: bool = False) -> None:
        """Backward from this sparse tensor; ``grad`` is sparse with the same pattern, or dense."""
        if grad is None:
            if math.prod(self.shape) != 1:
                raise GraphError(f"backward() without a gradient needs a single-element output, got "
                                 f"{_describe(self)}; pass grad=")
            seed = None
        elif isinstance(grad, SparseTensor):
            if not grad.pattern.same_as(self.pattern):
                raise ShapeError(f"backward(): grad {_describe(grad)} must have the pattern of "
                                 f"{_describe(self)}")
            seed = grad._values
        else:
            seed = _gather_dense(self, grad, "backward")
        if self.nnz == 0:
            raise GraphError(f"backward() on {_describe(self)}: no stored entries, nothing to "
                             "differentiate")
        self._values.backward(seed, retain_graph=retain_graph, create_graph=create_graph)

    # -- operators that the dense Tensor implements with a direct apply() ------------------------
    def __neg__(self) -> "SparseTensor":
        return self.with_values(-self._values)

    def __abs__(self) -> "SparseTensor":
        return self.abs()

    def _no_compare(self, other):
        raise ShapeError(f"comparisons with {_describe(self)} are not defined elementwise (the implicit "
                         "zeros would compare too); compare its .values (same pattern: A.with_values(A.values > 0)) "
                         "or .to_dense()")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _no_compare
    __hash__ = Tensor.__hash__

    # -- elementwise on the stored values (implicit zeros stay implicit) ------------------------
    def exp(self): return self.with_values(self._values.exp())
    def log(self): return self.with_values(self._values.log())
    def tanh(self): return self.with_values(self._values.tanh())
    def relu(self): return self.with_values(self._values.relu())
    def reciprocal(self): return self.with_values(self._values.reciprocal())
    def sigmoid(self): return self.with_values(self._values.sigmoid())
    def sqrt(self): return self.with_values(self._values.sqrt())
    def abs(self): return self.with_values(self._values.abs())

    def apply_values(self, fn: Callable[[Tensor], Tensor]) -> "SparseTensor":
        """``fn`` applied to the values (any differentiable tensor function), pattern kept."""
        return self.with_values(fn(self._values))

    # -- reductions -----------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return sparse_sum(self, axis, keepdims)

    def softmax(self, axis: int = -1) -> "SparseTensor":
        """Softmax over the stored entries of each row (axis=-1/1) or column (axis=0/-2)."""
        (ax,) = normalize_axes(Op.SUM, axis, 2)
        return row_softmax(self) if ax == 1 else transpose(row_softmax(transpose(self)))

    def row_softmax(self) -> "SparseTensor":
        return row_softmax(self)

    def scale_rows(self, d) -> "SparseTensor":
        return scale_rows(self, d)

    def scale_cols(self, d) -> "SparseTensor":
        return scale_cols(self, d)

    # -- movement -------------------------------------------------------------------------------
    def transpose(self, dim0: int = -2, dim1: int = -1) -> "SparseTensor":
        if dim0 % 2 == dim1 % 2:
            return self
        return transpose(self)

    @property
    def T(self) -> "SparseTensor":
        return transpose(self)

    def __repr__(self) -> str:
        opts: dict[str, Any] = dict(separator=", ", threshold=12, edgeitems=3)
        head = "sparse_tensor("
        pad = " " * len(head)
        idx = np.array2string(self.indices, prefix=head + "indices=", **opts)
        vals = np.array2string(self._values.numpy(), prefix=pad + "values=", **opts)
        extra = f"dtype={self.dtype}, backend={self.backend!r}"
        if self.requires_grad:
            extra += ", requires_grad=True" if self._node is None else f", grad_fn={self.op}"
        return (f"{head}indices={idx},\n{pad}values={vals},\n{pad}shape={self.shape}, nnz={self.nnz}, "
                f"layout={self.layout!r}, {extra})")


# dim=/keepdim= as for dense tensors (see polygrad.tensor.torch_names)
SparseTensor.sum = accept_torch_names(SparseTensor.sum, "SparseTensor.sum")  # type: ignore[method-assign]
SparseTensor.softmax = accept_torch_names(SparseTensor.softmax, "SparseTensor.softmax")  # type: ignore[method-assign]


def _describe(x: Any) -> str:
    """An operand as error messages name it: layout, shape, dtype and backend."""
    if isinstance(x, SparseTensor):
        return f"sparse {x.shape} {x.layout} nnz={x.nnz} {x.dtype} on {x.backend!r}"
    if isinstance(x, Tensor):
        return f"dense {x.shape} {x.dtype} on {x.backend!r}"
    return f"{type(x).__name__}"



def _dense_operand(x: Any, like: SparseTensor, op: str) -> Tensor:
    if isinstance(x, Tensor):
        if x._be is not like._be:
            raise MixedBackendError(f"op '{op}': {_describe(like)} and {_describe(x)} live on different "
                                    f"backends ({like.backend} and {x.backend}); move one with .to(name)")
        return x
    return _as_operand(x, like._values)


def _gather_dense(a: SparseTensor, b: Any, op: str) -> Tensor:
    """Dense (or scalar) ``b``, broadcast to a's shape, read at a's stored entries: [nnz] or []."""
    b = _dense_operand(b, a, op)
    n, m = a.shape
    if b.ndim > 2:
        raise ShapeError(f"op '{op}': {_describe(a)} with dense {b.shape}: the result would be {b.ndim}-D, "
                         "sparse tensors are 2-D")
    try:
        full = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        full = None
    if full != a.shape:
        raise ShapeError(f"op '{op}': dense operand of shape {b.shape} does not broadcast to the sparse "
                         f"{a.shape} ({a.layout}) without growing it")
    s0, s1 = (1,) * (2 - b.ndim) + tuple(b.shape)
    p = a.pattern
    if s0 == 1 and s1 == 1:
        return b.reshape(())
    if s0 == 1:
        return b.reshape(m)[p.cols]
    if s1 == 1:
        return b.reshape(n)[p.rows]
    return b.reshape(n * m)[p.rows * m + p.cols]



def sparse_sum(x: SparseTensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Sum over rows (axis=1: per-row totals), columns (axis=0) or all; segment based, deterministic."""
    axes = normalize_axes(Op.SUM, axis, 2)
    if not axes:
        return x
    n, m = x.shape
    if axes == (0, 1):
        total = x._values.sum()
        return total.reshape(1, 1) if keepdims else total
    if axes == (1,):
        out = segment_sum(x._values, x.pattern)
        return out.reshape(n, 1) if keepdims else out
    t_pattern, perm = x.pattern.transpose()
    out = segment_sum(x._values[perm], t_pattern)
    return out.reshape(1, m) if keepdims else out


def transpose(x: SparseTensor) -> SparseTensor:
    """Aᵀ: the cached transposed pattern and the values permuted (a gather: differentiable)."""
    t_pattern, perm = x.pattern.transpose()
    return SparseTensor._wrap(t_pattern, x._values[perm])



def to_dense(x: Any, op: str = "to_dense") -> Tensor:
    """The dense matrix of a sparse tensor, differentiable w.r.t. its values (dense input: itself).

    Refused with MemoryBudgetError when the dense form (plus the scatter's temporaries) would
    exceed ``pg.config.memory_fraction`` of the available memory.
    """
    if not isinstance(x, SparseTensor):
        return x
    n, m = x.shape
    dense_bytes = memory.nbytes(x.shape, x.dtype)
    needs_graph = x.requires_grad and is_grad_enabled()
    # the differentiable path scatters through a float64 bincount: count its temporaries too
    memory.check(op, dense_bytes + (8 * n * m if needs_graph else 0), backend=x._be,
                 what=f"a dense {x.shape} {x.dtype} matrix from {_describe(x)}")
    if not needs_graph:
        return tensor_from_numpy(x.numpy(), x._be)
    flat = index_add(x._values, (x.pattern.rows * m + x.pattern.cols,), (n * m,))
    return flat.reshape(n, m)


# =====================================================================================================
# graph helpers
# =====================================================================================================

def _as_sparse(op: str, a: Any) -> SparseTensor:
    if not isinstance(a, SparseTensor):
        raise DTypeError(f"{op}: expected a sparse tensor, got {_describe(a)} (convert with .to_sparse())")
    return a


def _vector(op: str, d: Any, like: SparseTensor, size: int, what: str) -> Tensor:
    v = _dense_operand(d, like, op)
    if v.shape not in ((size,),):
        raise ShapeError(f"{op}: {what} must be a vector of {size} entries for {_describe(like)}, got {v.shape}")
    return v


def scale_rows(a: Any, d: Any) -> SparseTensor:
    """``diag(d) @ A``: row i multiplied by d[i] (pattern kept; differentiable in A and d)."""
    a = _as_sparse("scale_rows", a)
    v = _vector("scale_rows", d, a, a.shape[0], "the row scale")
    return SparseTensor._wrap(a.pattern, a._values * v[a.pattern.rows])


def scale_cols(a: Any, d: Any) -> SparseTensor:
    """``A @ diag(d)``: column j multiplied by d[j] (pattern kept; differentiable in A and d)."""
    a = _as_sparse("scale_cols", a)
    v = _vector("scale_cols", d, a, a.shape[1], "the column scale")
    return SparseTensor._wrap(a.pattern, a._values * v[a.pattern.cols])



def row_softmax(a: Any) -> SparseTensor:
    """Softmax over the stored entries of each row (attention-style GNNs); empty rows stay empty.

    Shifted by the row maximum (no gradient: softmax is shift-invariant), exponentiated, divided
    by the row sum (a segment reduction): deterministic, differentiable in the values.
    """
    a = _as_sparse("row_softmax", a)
    values = a._values if a.dtype.kind == "f" else a._values.cast(default_float)
    p = a.pattern
    shift = segment_max(values.detach(), p)
    e = (values - shift[p.rows]).exp()
    total = segment_sum(e, p)
    return SparseTensor._wrap(p, e / total[p.rows])

