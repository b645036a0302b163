"""Sparse tensors (COO / CSR), their ops, and the layout policy.

A :class:`SparseTensor` is a :class:`~polygrad.pattern.Pattern` (canonical CSR index arrays on the
host, shared and immutable) plus a dense 1-D :class:`~polygrad.tensor.Tensor` of values, one per
stored entry.  Only the values live in the autodiff graph, so every sparse op below is a few dense
ops on the values plus the pattern-aware primitives SPMM, SDDMM and SEGMENT_SUM/MAX
(``polygrad.tensor.spmm`` ...).  Consequences:

* the gradient of a sparse leaf is a sparse tensor with the leaf's pattern (``A.grad``);
* a leaf used in several places accumulates its values' gradient like any dense tensor;
* ``A + B`` of different patterns gives the union pattern, ``A * B`` the intersection, so adding
  two sparse gradients merges their patterns;
* reductions are segment (CSR) based or sort-free bincounts: deterministic, bitwise reproducible.

Canonical form is established once, at construction: entries sorted row-major, duplicates summed
(in input order, deterministically), explicit zeros *kept* as stored entries (they are structure:
a learnable edge weight may start at 0).  "coo" and "csr" are two labels of this one storage, so
no op ever re-sorts.  The transpose permutation (CSC order) is computed on first use and cached on
the pattern.

Elementwise functions (``relu``, ``exp``, ...) act on the stored values only: the implicit zeros
stay implicit, which is what attention-style GNNs want; for a function with f(0) != 0 this is not
the dense ``f(A)`` -- use ``A.to_dense().exp()`` for that.  Likewise ``sparse * dense`` ignores the
dense operand outside the pattern (``0 * inf`` is taken as 0).

:func:`choose_layout` is the one place the density / cost / memory policy lives.
"""
from __future__ import annotations

import math
import weakref
from numbers import Number
from typing import Any, Callable, Sequence

import numpy as np

from . import memory, sharing
from .config import config
from .dispatch import is_grad_enabled
from .dtypes import as_dtype, default_float
from .torch_names import accept_torch_names
from .errors import (DTypeError, GraphError, MixedBackendError, NonFiniteError, ShapeError,
                     SparseIndexError)
from .inference import normalize_axes
from .ops import Op
from .pattern import Pattern
from .registry import registry, resolve
from .tensor import (Tensor, _as_operand, index_add, segment_max, segment_sum, spmm, tensor,
                     tensor_from_numpy, where)
# the dense ops (polygrad's package namespace rebinds the name "tensor" to the function, so import
# them by name rather than through the module)
from .tensor import add as _dense_add, div as _dense_div, pow as _dense_pow

__all__ = [
    "SparseTensor", "sparse_coo", "sparse_csr", "from_edge_index", "from_scipy", "to_sparse", "to_dense",
    "is_sparse", "add_self_loops", "gcn_norm", "scale_rows", "scale_cols", "row_softmax",
    "union_pattern", "intersect_pattern", "choose_layout", "break_even_density",
]

LAYOUTS = ("csr", "coo")
_events = registry.events


# =====================================================================================================
# the layout policy (the ONE place it lives)
# =====================================================================================================

#: Cost-model constants: sparse beats dense matmul below the density ``break_even_density(F)``
#: = BREAK_EVEN_F16 * (F / 16) ** -BREAK_EVEN_EXPONENT (clipped to [BREAK_EVEN_MIN, BREAK_EVEN_MAX]).
#: Calibrated by ``python -m benchmarks sparse`` section (b) on this machine (2 shared cores, numpy
#: 2.4, OpenBLAS): A @ X forward + backward w.r.t. X, polygrad sparse (the numpy backend's own
#: kernels) vs polygrad dense (BLAS), 2708 x 2708 float32 with uniform random patterns, densities
#: 0.5%..40%; the break-even is where the time ratio crosses 1 (log-linear interpolation).  Three
#: runs gave 4.1% / 2.1% / 4.1% at F=16 and 2.9% / 2.5% / 2.3% at F=1433; the constants are their
#: means.  The pure-numpy SpMM's per-nonzero overhead is largest at small F, so its break-even
#: barely moves with F.  With faster SpMM kernels (the polygrad-scipy plugin) sparse wins up to
#: 17-32% at F=16 and 6-8% at F=1433 (same runs): these constants are then conservative (sparse is
#: never chosen where it would lose; some wins are left); ``pg.config.sparse_threshold`` overrides.
BREAK_EVEN_F16 = 0.034
BREAK_EVEN_F1433 = 0.0255
BREAK_EVEN_EXPONENT = math.log(BREAK_EVEN_F16 / BREAK_EVEN_F1433) / math.log(1433 / 16)
BREAK_EVEN_MIN = 0.002
BREAK_EVEN_MAX = 0.5
#: feature width assumed when a layout is chosen with no matmul in sight (``pg.tensor(layout="auto")``)
DEFAULT_FEATURE_WIDTH = 64


#: attribute a backend's (or a plugin's) forward SpMM kernel may carry to declare its own measured
#: break-even densities ``(at F=16, at F=1433)`` when it is faster or slower than the numpy kernels
#: these constants describe (e.g. a scipy.sparse SpMM); polygrad then uses them for that backend
BREAK_EVEN_ATTRIBUTE = "polygrad_break_even"


def _declared_break_even(backend: Any) -> tuple[float, float] | None:
    if backend is None:
        return None
    name = backend if isinstance(backend, str) else getattr(backend, "name", None)
    kernel = registry.tables.get(name, {}).get((Op.SPMM, "csr")) if name else None
    declared = getattr(kernel, BREAK_EVEN_ATTRIBUTE, None)
    if declared is None:
        return None
    try:
        d16, d1433 = (float(v) for v in declared)
    except (TypeError, ValueError):
        return None  # a malformed declaration is ignored, never fatal
    return (d16, d1433) if 0 < d16 <= 1 and 0 < d1433 <= 1 else None


def break_even_density(feature_width: int | None = None, backend: Any = None) -> float:
    """Density below which SpMM with ``feature_width`` columns beats a dense matmul (cost model).

    ``backend``: when its SpMM kernel declares its own break-evens (``BREAK_EVEN_ATTRIBUTE``),
    those are used instead of the numpy kernels' calibration.
    """
    f = max(1, int(feature_width or DEFAULT_FEATURE_WIDTH))
    declared = _declared_break_even(backend)
    d16, d1433 = declared if declared is not None else (BREAK_EVEN_F16, BREAK_EVEN_F1433)
    d = d16 * (f / 16) ** -(math.log(d16 / d1433) / math.log(1433 / 16))
    return min(BREAK_EVEN_MAX, max(BREAK_EVEN_MIN, d))


def _threshold(feature_width: int | None, backend: Any = None) -> tuple[float, str]:
    """(density limit, where it comes from) -- the user's threshold, else the cost model."""
    if config.sparse_threshold is not None:
        return config.sparse_threshold, "pg.config.sparse_threshold"
    f = int(feature_width or DEFAULT_FEATURE_WIDTH)
    return break_even_density(f, backend), "cost-model break-even at F=%d" % f


def choose_layout(shape: Sequence[int], nnz: int | Callable[[], int], *, op: str = "tensor",
                  feature_width: int | None = None, dtype: Any = None, backend: Any = None,
                  dense_grad: bool = False, layout: str = "csr",
                  sampled_density: float | None = None, dense_exists: bool = False) -> str:
    """``"dense"`` or ``layout`` (a sparse label) for a matrix of ``shape`` with ``nnz`` nonzeros.

    The rules, in order:

    1. ``dense_grad``: the caller needs a gradient at every entry (a dense leaf) -> dense;
    2. not 2-D, or fewer than ``pg.config.sparse_min_elements`` elements -> dense (bookkeeping
       costs more than it saves);
    3. the dense form would not fit the memory budget (``pg.config.memory_fraction``) -> sparse
       (skipped with ``dense_exists``: a dense operand already in memory costs nothing more);
    4. density below ``pg.config.sparse_threshold`` when it is set, else below
       :func:`break_even_density` for the feature width ``F`` of the matmul (and the backend's
       SpMM kernel, when it declares its own break-evens) -> sparse;
    5. otherwise dense.

    ``nnz`` may be a callable, evaluated only when a rule needs it (counting is O(n*m)); with a
    ``sampled_density`` (from a scattered sample) far above the threshold, rule 4 answers dense
    without counting.  Every decision is reported through the ``polygrad_layout_chosen`` event hook
    (when a plugin implements it) with the nnz (-1 when not counted), density, layout and reason.
    """
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    count: int | None = None if callable(nnz) else int(nnz)

    def nnz_now() -> int:
        nonlocal count
        if count is None:
            count = int(nnz())  # type: ignore[operator]
        return count

    itemsize = np.dtype(dtype).itemsize if dtype is not None else np.dtype(default_float).itemsize
    # reasons are formatted only when a plugin listens (this runs before large dense matmuls)
    if dense_grad:
        chosen, why = "dense", lambda: "a dense leaf requiring grad needs a gradient at every entry"
    elif len(shape) != 2:
        chosen, why = "dense", lambda: f"{len(shape)}-D: sparse layouts are 2-D"
    elif numel < config.sparse_min_elements:
        chosen, why = "dense", lambda: (f"{numel} elements < pg.config.sparse_min_elements="
                                        f"{config.sparse_min_elements}")
    elif not dense_exists and not memory.fits(numel * itemsize, backend):
        chosen, why = layout, lambda: (f"the dense form needs {memory.format_bytes(numel * itemsize)}, over "
                                       f"the memory budget (pg.config.memory_fraction={config.memory_fraction})")
    else:
        limit, source = _threshold(feature_width, backend)
        if count is None and sampled_density is not None and sampled_density > 2 * limit + 0.05:
            chosen, why = "dense", lambda: f"sampled density ~{sampled_density:.3g} >> {limit:.4g} ({source})"
        else:
            density = nnz_now() / numel
            if density < limit:
                chosen, why = layout, lambda: f"density {density:.4g} < {limit:.4g} ({source})"
            else:
                chosen, why = "dense", lambda: f"density {density:.4g} >= {limit:.4g} ({source})"
    hook = _events["polygrad_layout_chosen"]
    if hook is not None:
        if count is None and numel < max(config.sparse_min_elements, 1):
            nnz_now()  # tiny: counting is cheap and makes the report complete
        if count is not None:
            reported = count / numel if numel else 0.0
        else:
            reported = sampled_density if sampled_density is not None else float("nan")
        hook(op=op, shape=shape, nnz=-1 if count is None else count, density=reported, layout=chosen,
             reason=why())
    return chosen


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

    def __reduce__(self):
        """Pickle as the pattern (CSR arrays), values, layout, backend name, ``requires_grad``,
        ``.grad`` and name; unpickling validates through :func:`sparse_csr` (see
        :meth:`Tensor.__reduce__`)."""
        p, grad = self.pattern, self.grad
        sparse_grad = None if grad is None else grad.values.numpy().copy()
        return (_rebuild_sparse, (tuple(self.shape), np.array(p.indptr), np.array(p.cols),
                                  self.values.numpy().copy(), self.layout, self.backend,
                                  bool(self.requires_grad), sparse_grad, self.name))

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
    def requires_grad(self) -> bool:  # type: ignore[override]
        return self._values.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self._values.requires_grad = flag

    @property
    def _node(self):  # type: ignore[override]
        return self._values._node

    @property
    def grad(self) -> "SparseTensor | None":  # type: ignore[override]
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
            raise ShapeError(f"the grad of sparse {self._describe()} must be None or a sparse tensor with "
                             f"the same pattern, got {_describe(g)}")

    @property
    def _data(self):  # type: ignore[override]
        raise ShapeError(f"a sparse tensor ({self._describe()}) reached a dense-only operation; use "
                         ".to_dense() first, or operate on its .values")

    @property
    def data(self) -> "SparseTensor":  # type: ignore[override]
        """A detached view (same pattern, same value storage); assign to replace the values."""
        return self.detach()

    @data.setter
    def data(self, other) -> None:
        if isinstance(other, SparseTensor):
            if not other.pattern.same_as(self.pattern):
                raise ShapeError(f"SparseTensor.data: cannot set {other._describe()} on {self._describe()}: "
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

    def _describe(self) -> str:
        return f"{self.shape} {self.layout} nnz={self.nnz} {self.dtype} on {self.backend!r}"

    # -- conversion ---------------------------------------------------------------------------
    def with_values(self, values) -> "SparseTensor":
        """The same pattern with new values (a tensor of nnz entries; differentiable)."""
        if not isinstance(values, Tensor):
            values = tensor(np.asarray(values), backend=self._be)
        if values.shape != (self.nnz,):
            raise ShapeError(f"with_values: need {self.nnz} values for {self._describe()}, got shape {values.shape}")
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
        return to_sparse(self, layout)

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
                                 f"sparse {self._describe()}; pass grad=")
            seed = None
        elif isinstance(grad, SparseTensor):
            if not grad.pattern.same_as(self.pattern):
                raise ShapeError(f"backward(): sparse grad {grad._describe()} must have the pattern of "
                                 f"{self._describe()}")
            seed = grad._values
        else:
            seed = _gather_dense(self, grad, "backward")
        if self.nnz == 0:
            raise GraphError(f"backward() on sparse {self._describe()}: no stored entries, nothing to "
                             "differentiate")
        self._values.backward(seed, retain_graph=retain_graph, create_graph=create_graph)

    # -- operators that the dense Tensor implements with a direct apply() ------------------------
    def __neg__(self) -> "SparseTensor":
        return self.with_values(-self._values)

    def __abs__(self) -> "SparseTensor":
        return self.abs()

    def _no_compare(self, other):
        raise ShapeError(f"comparisons with sparse {self._describe()} are not defined elementwise (the implicit "
                         "zeros would compare too); compare its .values (same pattern: A.with_values(A.values > 0)) "
                         "or .to_dense()")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _no_compare  # type: ignore[assignment]
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
    def transpose(self, dim0: int = -2, dim1: int = -1) -> "SparseTensor":  # type: ignore[override]
        if dim0 % 2 == dim1 % 2:
            return self
        return transpose(self)

    @property
    def T(self) -> "SparseTensor":  # type: ignore[override]
        return transpose(self)

    def __repr__(self) -> str:
        opts = dict(separator=", ", threshold=12, edgeitems=3)
        head = "sparse_tensor("
        pad = " " * len(head)
        idx = np.array2string(self.indices, prefix=head + "indices=", **opts)
        vals = np.array2string(self._values.numpy(), prefix=pad + "values=", **opts)
        extra = f"dtype={self.dtype}, backend={self.backend!r}"
        if self.requires_grad:
            extra += ", requires_grad=True" if self._node is None else f", grad_fn={self.op}"
        return (f"{head}indices={idx},\n{pad}values={vals},\n{pad}shape={self.shape}, nnz={self.nnz}, "
                f"layout={self.layout!r}, {extra})")


# dim=/keepdim= as for dense tensors (see polygrad.torch_names)
SparseTensor.sum = accept_torch_names(SparseTensor.sum, "SparseTensor.sum")  # type: ignore[method-assign]
SparseTensor.softmax = accept_torch_names(SparseTensor.softmax, "SparseTensor.softmax")  # type: ignore[method-assign]


def is_sparse(x: Any) -> bool:
    """Whether ``x`` is a :class:`SparseTensor`."""
    return isinstance(x, SparseTensor)


def _describe(x: Any) -> str:
    if isinstance(x, SparseTensor):
        return f"sparse {x._describe()}"
    if isinstance(x, Tensor):
        return f"dense {x.shape} {x.dtype} on {x.backend!r}"
    return f"{type(x).__name__}"


# =====================================================================================================
# construction: validation and canonical form
# =====================================================================================================

def _check_shape(op: str, shape: Any) -> tuple[int, int]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{op}: shape must be a pair (rows, cols), got {shape!r}") from None
    if len(dims) != 2:
        raise ShapeError(f"{op}: sparse tensors are 2-D, got shape {shape!r}")
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or int(d) < 0:
            raise ShapeError(f"{op}: shape must be two non-negative ints, got {shape!r}")
        out.append(int(d))
    return out[0], out[1]


def _host_array(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.numpy()
    try:
        return np.asarray(x)
    except (ValueError, TypeError):  # ragged nested lists: reported as such by the caller
        return np.empty(0, dtype=object)


def _index_array(op: str, name: str, x: Any, ndim: int) -> np.ndarray:
    """An integer index array of ``ndim`` dims, or SparseIndexError.  Always a copy: the pattern
    must not change when the caller later edits their array (and is validated as it is used)."""
    arr = np.array(_host_array(x))
    if arr.dtype == object:
        raise SparseIndexError(f"{op}: {name} is ragged or not numeric")
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)  # [] and [[], []] come in as float64
    if arr.dtype.kind not in "iu":
        raise SparseIndexError(f"{op}: {name} must have an integer dtype, got {arr.dtype}")
    if arr.ndim != ndim:
        want = "[2, nnz]" if ndim == 2 else "1-D"
        raise SparseIndexError(f"{op}: {name} must be {want}, got shape {arr.shape}")
    return arr


def _check_index_dtype(op: str, name: str, arr: np.ndarray, bound: int, what: str = "") -> None:
    """The dtype must be able to represent every value below ``bound``."""
    if bound > 0 and np.iinfo(arr.dtype).max < bound - 1:
        what = what or f"address a dimension of size {bound}"
        raise SparseIndexError(f"{op}: {name} of dtype {arr.dtype} cannot {what} (max {np.iinfo(arr.dtype).max}); "
                               "use int64 indices")


def _check_range(op: str, name: str, arr: np.ndarray, bound: int) -> None:
    if arr.size == 0:
        return
    lo, hi = arr.min(), arr.max()
    if (arr.dtype.kind == "i" and lo < 0) or hi >= bound:
        bad = int(np.flatnonzero((arr < 0) | (arr >= bound))[0])
        raise SparseIndexError(f"{op}: {name}[{bad}] = {arr.flat[bad]} is out of range [0, {bound})")


def _values_tensor(op: str, values: Any, nnz: int, dtype: Any, backend: Any, allow_nonfinite: bool) -> Tensor:
    if isinstance(values, SparseTensor):
        raise DTypeError(f"{op}: values must be dense (a 1-D tensor or array), got {_describe(values)}")
    if isinstance(values, Tensor):
        if backend is not None and resolve(backend) is not values._be:
            if values.requires_grad:
                raise MixedBackendError(f"{op}: values live on {values.backend!r} but backend={backend!r} was "
                                        "asked; move them explicitly with values.to(name)")
            values = values.to(backend)
        vals = values if dtype is None else values.cast(dtype)
    else:
        arr = _host_array(values)  # ragged lists come back as object arrays
        if arr.dtype == object:
            raise DTypeError(f"{op}: values are ragged or not numeric")
        vals = tensor(values, dtype=dtype, backend=backend)  # Python floats -> default float, as pg.tensor
    if vals.shape != (nnz,):
        raise ShapeError(f"{op}: {nnz} indices but values of shape {vals.shape} (need a 1-D array of {nnz})")
    if not allow_nonfinite and vals.dtype.kind == "f" and nnz:
        host = vals.numpy()
        finite = np.isfinite(host)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise NonFiniteError(f"{op}: values[{bad}] = {host[bad]} is not finite; pass allow_nonfinite=True "
                                 "to store NaN/Inf")
    return vals


def _indptr_of(rows: np.ndarray, n: int) -> np.ndarray:
    indptr = np.zeros(n + 1, dtype=np.int64)
    if rows.size:
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr


def _pattern_sorted(shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, layout: str) -> Pattern:
    """A Pattern from row-major sorted, duplicate-free int64 rows / cols."""
    return Pattern(shape, _indptr_of(rows, shape[0]), cols, layout, rows=rows)


def _coalesce(op: str, shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, values: Tensor,
              layout: str) -> SparseTensor:
    """Canonical form: sort row-major (stable), sum duplicates in input order.  Vectorised."""
    nnz = rows.shape[0]
    if nnz > 1:
        dr = np.diff(rows)
        ordered = (dr > 0) | ((dr == 0) & (np.diff(cols) > 0))
        if not ordered.all():
            order = np.lexsort((cols, rows))  # stable: duplicates keep their input order
            r, c = rows[order], cols[order]
            first = np.empty(nnz, dtype=bool)
            first[0] = True
            np.not_equal(r[1:], r[:-1], out=first[1:])
            first[1:] |= c[1:] != c[:-1]
            if first.all():
                values = values[order]
            else:  # duplicates: each input entry is added into its slot (bincount: deterministic)
                slot = np.empty(nnz, dtype=np.int64)
                slot[order] = np.cumsum(first) - 1
                values = index_add(values, (slot,), (int(first.sum()),))
                r, c = r[first], c[first]
            rows, cols = np.ascontiguousarray(r), np.ascontiguousarray(c)
    return SparseTensor._wrap(_pattern_sorted(shape, rows, cols, layout), values)


def _finish(op: str, sp: SparseTensor, requires_grad: bool, layout: str) -> Tensor:
    """requires_grad (a fresh leaf of canonical values) and layout="auto"."""
    if requires_grad:
        if sp.dtype.kind != "f":
            raise DTypeError(f"{op}: only floating values can require grad, got {sp.dtype}")
        sp = SparseTensor._wrap(sp.pattern, sp._values.detach().requires_grad_(True))
    if layout == "auto":
        chosen = choose_layout(sp.shape, sp.nnz, op=op, dtype=sp.dtype, backend=sp._be, layout=sp.layout)
        if chosen == "dense":
            return to_dense(sp)
        sp = to_sparse(sp, chosen)
    return sp


def _check_layout(op: str, layout: str, allow_auto: bool = True) -> None:
    allowed = LAYOUTS + (("auto",) if allow_auto else ())
    if layout not in allowed:
        raise ValueError(f"{op}: layout must be one of {', '.join(map(repr, allowed))}, got {layout!r}")


def _guard_indptr_memory(op: str, n: int, backend: Any) -> None:
    memory.check(op, 8 * (n + 1), backend=backend, what=f"the row pointers of {n} rows")


def sparse_coo(indices: Any, values: Any, shape: Sequence[int], dtype: Any = None, requires_grad: bool = False,
               backend: Any = None, layout: str = "coo", allow_nonfinite: bool = False) -> Tensor:
    """A sparse matrix from COO ``indices`` (int ``[2, nnz]``: rows, cols) and ``values`` ``[nnz]``.

    Duplicate (row, col) pairs are **summed** (deterministically, in input order); entries are
    sorted row-major once; explicit zeros are kept.  ``values`` may be a polygrad tensor: its
    graph is kept, so the sparse tensor is differentiable w.r.t. it (unless ``requires_grad=True``,
    which makes the canonical values a fresh leaf).  ``layout="auto"`` lets :func:`choose_layout`
    return a dense tensor instead.  Errors: SparseIndexError (index dtype/shape/range), ShapeError
    (shape, nnz mismatch), NonFiniteError (NaN/Inf unless ``allow_nonfinite``).
    """
    op = "sparse_coo"
    _check_layout(op, layout)
    n, m = _check_shape(op, shape)
    idx = _index_array(op, "indices", indices, 2)
    if idx.shape[0] != 2:
        raise SparseIndexError(f"{op}: indices must be [2, nnz] (rows, cols), got shape {idx.shape}")
    _check_index_dtype(op, "indices", idx, max(n, m))
    _check_range(op, "row indices", idx[0], n)
    _check_range(op, "column indices", idx[1], m)
    be = resolve(backend) if backend is not None else None
    vals = _values_tensor(op, values, idx.shape[1], dtype, be, allow_nonfinite)
    _guard_indptr_memory(op, n, vals._be)
    rows = np.ascontiguousarray(idx[0], dtype=np.int64)
    cols = np.ascontiguousarray(idx[1], dtype=np.int64)
    sp = _coalesce(op, (n, m), rows, cols, vals, "coo" if layout == "auto" else layout)
    return _finish(op, sp, requires_grad, layout)


def sparse_csr(indptr: Any, indices: Any, values: Any, shape: Sequence[int], dtype: Any = None,
               requires_grad: bool = False, backend: Any = None, layout: str = "csr",
               allow_nonfinite: bool = False) -> Tensor:
    """A sparse matrix from CSR arrays (scipy's convention: ``indices`` are the column indices).

    Columns within a row may be unsorted or repeated: they are sorted and duplicates summed once,
    here.  Same options and errors as :func:`sparse_coo`, plus SparseIndexError for an ``indptr``
    of the wrong length, not starting at 0, decreasing, or not ending at ``len(indices)``.
    """
    op = "sparse_csr"
    _check_layout(op, layout)
    n, m = _check_shape(op, shape)
    ptr = _index_array(op, "indptr", indptr, 1)
    cols = _index_array(op, "indices", indices, 1)
    if ptr.shape[0] != n + 1:
        raise SparseIndexError(f"{op}: indptr must have rows+1 = {n + 1} entries for shape {(n, m)}, "
                               f"got {ptr.shape[0]}")
    nnz = cols.shape[0]
    _check_index_dtype(op, "indptr", ptr, nnz + 1, f"count {nnz} stored entries")
    _check_index_dtype(op, "indices", cols, m)
    if ptr[0] != 0:
        raise SparseIndexError(f"{op}: indptr[0] must be 0, got {ptr[0]}")
    steps = np.diff(ptr.astype(np.int64))
    if (steps < 0).any():
        bad = int(np.flatnonzero(steps < 0)[0])
        raise SparseIndexError(f"{op}: indptr must be non-decreasing, but indptr[{bad + 1}] = {ptr[bad + 1]} < "
                               f"indptr[{bad}] = {ptr[bad]}")
    if int(ptr[-1]) != nnz:
        raise SparseIndexError(f"{op}: indptr[-1] = {ptr[-1]} must equal the number of column indices ({nnz})")
    _check_range(op, "column indices", cols, m)
    be = resolve(backend) if backend is not None else None
    vals = _values_tensor(op, values, nnz, dtype, be, allow_nonfinite)
    rows = np.repeat(np.arange(n, dtype=np.int64), steps)
    sp = _coalesce(op, (n, m), rows, np.ascontiguousarray(cols, dtype=np.int64), vals,
                   "csr" if layout == "auto" else layout)
    return _finish(op, sp, requires_grad, layout)


def _rebuild_sparse(shape: tuple, indptr: np.ndarray, cols: np.ndarray, values: np.ndarray, layout: str,
                    backend: str, requires_grad: bool, grad: Any, name: Any) -> SparseTensor:
    """Unpickle a sparse tensor (:meth:`SparseTensor.__reduce__`)."""
    t = sparse_csr(indptr, cols, values, shape, backend=backend, layout=layout, allow_nonfinite=True,
                   requires_grad=requires_grad and values.dtype.kind == "f")
    if grad is not None:
        t.grad = sparse_csr(indptr, cols, grad, shape, backend=backend, layout=layout, allow_nonfinite=True)
    t.name = name
    return t


def from_edge_index(edge_index: Any, num_nodes: int | None = None, values: Any = None, *, dtype: Any = None,
                    requires_grad: bool = False, backend: Any = None, layout: str = "csr",
                    allow_nonfinite: bool = False) -> Tensor:
    """The ``num_nodes x num_nodes`` adjacency of a PyG-style ``edge_index`` (int ``[2, E]``).

    Entry ``A[edge_index[0, e], edge_index[1, e]] = values[e]`` (values default to ones of the
    default float dtype); repeated edges are summed.  ``num_nodes`` defaults to max index + 1.
    ``layout="auto"`` lets the cost model pick dense for small dense graphs.
    """
    op = "from_edge_index"
    idx = _index_array(op, "edge_index", edge_index, 2)
    if idx.shape[0] != 2:
        raise SparseIndexError(f"{op}: edge_index must be [2, E], got shape {idx.shape}")
    if num_nodes is None:
        num_nodes = int(idx.max()) + 1 if idx.size else 0
    if values is None:
        values = np.ones(idx.shape[1], dtype=as_dtype(dtype) if dtype is not None else default_float)
    out = sparse_coo(idx, values, (num_nodes, num_nodes), dtype=dtype, requires_grad=requires_grad,
                     backend=backend, layout="csr" if layout == "auto" else layout,
                     allow_nonfinite=allow_nonfinite)
    if layout == "auto":
        return _finish(op, out, False, "auto")  # type: ignore[arg-type]
    return out


def from_scipy(matrix: Any, dtype: Any = None, requires_grad: bool = False, backend: Any = None,
               layout: str | None = None, allow_nonfinite: bool = False) -> Tensor:
    """A SparseTensor from any ``scipy.sparse`` matrix/array (duplicates summed, explicit zeros kept).

    ``layout`` defaults to "coo" for a COO input and "csr" otherwise.
    """
    if not hasattr(matrix, "tocoo") or not hasattr(matrix, "shape"):
        raise DTypeError(f"from_scipy: expected a scipy.sparse matrix, got {type(matrix).__name__}")
    if layout is None:
        layout = "coo" if getattr(matrix, "format", "") == "coo" else "csr"
    coo = matrix.tocoo()
    rows = np.asarray(coo.row)
    cols = np.asarray(coo.col)
    return sparse_coo(np.stack([rows, cols]) if rows.size else np.zeros((2, 0), dtype=np.int64),
                      np.asarray(coo.data), tuple(matrix.shape), dtype=dtype, requires_grad=requires_grad,
                      backend=backend, layout=layout, allow_nonfinite=allow_nonfinite)


def _nonzero_sparse(t: Tensor, layout: str) -> SparseTensor:
    """The stored-nonzeros form of dense 2-D ``t``; differentiable w.r.t. ``t`` at its nonzeros."""
    n, m = t.shape
    host = t._be.to_numpy(t._data)  # internal read: does not mark the storage shared
    rows, cols = np.nonzero(host)  # row-major order: already canonical
    rows = rows.astype(np.int64, copy=False)
    cols = cols.astype(np.int64, copy=False)
    pattern = _pattern_sorted((n, m), rows, cols, layout)
    if t.requires_grad and is_grad_enabled():
        values = t.reshape(n * m)[rows * m + cols]
    else:
        values = tensor_from_numpy(np.ascontiguousarray(host[rows, cols]), t._be)
    return SparseTensor._wrap(pattern, values)


def to_sparse(t: Any, layout: str = "csr") -> SparseTensor:
    """Dense 2-D tensor -> SparseTensor of its nonzeros (differentiable); sparse -> relabelled."""
    _check_layout("to_sparse", layout, allow_auto=False)
    if isinstance(t, SparseTensor):
        return SparseTensor._wrap(t.pattern.with_layout(layout), t._values)
    if not isinstance(t, Tensor):
        t = tensor(t)
    if t.ndim != 2:
        raise ShapeError(f"to_sparse: sparse layouts are 2-D, got a tensor of shape {t.shape}")
    return _nonzero_sparse(t, layout)


def from_dense_data(data: Any, dtype: Any = None, requires_grad: bool = False, backend: Any = None,
                    layout: str = "auto", allow_nonfinite: bool = True,
                    feature_width: int | None = None) -> Tensor:
    """``pg.tensor(data, layout=...)`` for layout "auto", "csr" or "coo".

    "auto" keeps a mostly-zero 2-D matrix sparse when :func:`choose_layout` says so (at the matmul
    width ``feature_width``, default ``DEFAULT_FEATURE_WIDTH``); a tensor that requires grad stays
    dense under "auto" (its gradient is wanted at every entry).  "csr"/"coo" force a sparse tensor
    whose gradient lives on the nonzeros.  NaN/Inf are stored like any nonzero, as a dense tensor
    would hold them, unless ``allow_nonfinite=False`` asks for the constructors' NonFiniteError.
    """
    _check_layout("tensor", layout)
    if isinstance(data, SparseTensor):
        sp = data if dtype is None else data.cast(dtype)
        if backend is not None:
            sp = sp.to(backend)
        if layout != "auto":
            sp = to_sparse(sp, layout)
        if requires_grad:
            sp = SparseTensor._wrap(sp.pattern, sp._values.detach().requires_grad_(True))
        return sp
    dense = tensor(data, dtype=dtype, backend=backend)
    if layout == "auto":
        host = dense.numpy() if dense.ndim == 2 else None
        chosen = choose_layout(dense.shape, (lambda: int(np.count_nonzero(host))) if host is not None else 0,
                               op="tensor", feature_width=feature_width, dtype=dense.dtype, backend=dense._be,
                               dense_grad=requires_grad)
        if chosen == "dense":
            return dense.requires_grad_(True) if requires_grad else dense
        layout = chosen
    if dense.ndim != 2:
        raise ShapeError(f"tensor: layout={layout!r} needs 2-D data, got shape {dense.shape}")
    sp = _nonzero_sparse(dense, layout)
    if not allow_nonfinite and sp.dtype.kind == "f":
        _values_tensor("tensor", sp._values, sp.nnz, None, None, False)
    return _finish("tensor", sp, requires_grad, layout)


# =====================================================================================================
# patterns: union and intersection (vectorised merges)
# =====================================================================================================

def _keys(p: Pattern) -> np.ndarray | None:
    """Row-major linear keys (sorted, since the pattern is canonical), or None when they overflow."""
    if p.shape[0] * p.shape[1] >= 2 ** 63:
        return None
    return p.rows * p.shape[1] + p.cols


def _check_same_shape(op: str, a: SparseTensor, b: SparseTensor) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"op '{op}': {_describe(a)} and {_describe(b)}: shapes must match (sparse operands "
                         "do not broadcast)")
    if a._be is not b._be:
        raise MixedBackendError(f"op '{op}': {_describe(a)} and {_describe(b)} live on different backends "
                                f"({a.backend} and {b.backend}); move one explicitly with .to(name)")


def union_pattern(p: Pattern, q: Pattern) -> tuple[Pattern, np.ndarray, np.ndarray]:
    """(union pattern, position of each entry of p in it, position of each entry of q in it)."""
    if p.shape != q.shape:
        raise ShapeError(f"union_pattern: shapes {p.shape} and {q.shape} differ")
    kp, kq = _keys(p), _keys(q)
    if kp is not None and kq is not None:
        u = np.union1d(kp, kq)
        rows, cols = np.divmod(u, p.shape[1]) if p.shape[1] else (u, u)
        pattern = _pattern_sorted(p.shape, rows, cols, p.layout)
        return pattern, np.searchsorted(u, kp), np.searchsorted(u, kq)
    # keys would overflow int64: lexicographic merge on (row, col)
    rows = np.concatenate([p.rows, q.rows])
    cols = np.concatenate([p.cols, q.cols])
    order = np.lexsort((cols, rows))
    r, c = rows[order], cols[order]
    first = np.ones(r.shape[0], dtype=bool)
    first[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
    slot = np.empty(r.shape[0], dtype=np.int64)
    slot[order] = np.cumsum(first) - 1
    pattern = _pattern_sorted(p.shape, r[first], c[first], p.layout)
    return pattern, slot[:p.nnz], slot[p.nnz:]


def intersect_pattern(p: Pattern, q: Pattern) -> tuple[Pattern, np.ndarray, np.ndarray]:
    """(intersection pattern, index into p's entries, index into q's entries) of the common entries."""
    if p.shape != q.shape:
        raise ShapeError(f"intersect_pattern: shapes {p.shape} and {q.shape} differ")
    kp, kq = _keys(p), _keys(q)
    if kp is not None and kq is not None:
        _, ip, iq = np.intersect1d(kp, kq, assume_unique=True, return_indices=True)
    else:
        rows = np.concatenate([p.rows, q.rows])
        cols = np.concatenate([p.cols, q.cols])
        order = np.lexsort((cols, rows))
        r, c = rows[order], cols[order]
        same = (r[1:] == r[:-1]) & (c[1:] == c[:-1])  # a pair (i, i+1) is one entry of p and one of q
        first, second = order[:-1][same], order[1:][same]
        ip = np.minimum(first, second)
        iq = np.maximum(first, second) - p.nnz
    ip = ip.astype(np.int64, copy=False)
    iq = iq.astype(np.int64, copy=False)
    pattern = _pattern_sorted(p.shape, p.rows[ip], p.cols[ip], p.layout)
    return pattern, ip, iq


def _scatter(values: Tensor, positions: np.ndarray, size: int) -> Tensor:
    """values placed at ``positions`` of a zero vector of ``size`` (positions are unique)."""
    if positions.shape[0] == size:
        return values  # the positions are then 0..size-1 in order (both sorted, unique)
    return index_add(values, (positions,), (size,))


# =====================================================================================================
# ops (tensor.py routes add/sub/mul/div/pow/sum/transpose/matmul here when an operand is sparse)
# =====================================================================================================

def _is_zero_number(x: Any) -> bool:
    return isinstance(x, Number) and not isinstance(x, bool) and x == 0


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


def _densify(a: Any, op: str) -> Any:
    return to_dense(a, op) if isinstance(a, SparseTensor) else a


def add(a: Any, b: Any) -> Tensor:
    """sparse + sparse -> sparse (pattern union); sparse + dense/scalar -> dense (except + 0)."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        _check_same_shape("add", a, b)
        if a.pattern.same_as(b.pattern):
            return SparseTensor._wrap(a.pattern, a._values + b._values)
        pattern, pa, pb = union_pattern(a.pattern, b.pattern)
        return SparseTensor._wrap(pattern, _scatter(a._values, pa, pattern.nnz)
                                  + _scatter(b._values, pb, pattern.nnz))
    sp, other = (a, b) if isinstance(a, SparseTensor) else (b, a)
    if _is_zero_number(other):
        return sp
    other = _dense_operand(other, sp, "add")
    out_shape = tuple(np.broadcast_shapes(sp.shape, other.shape)) if _broadcastable(sp.shape, other.shape) \
        else None
    if out_shape is None:
        raise ShapeError(f"op 'add': {_describe(a)} + {_describe(b)}: shapes cannot be broadcast together")
    memory.check("add", memory.nbytes(out_shape, np.promote_types(sp.dtype, other.dtype)), backend=sp._be,
                 what=f"the dense {out_shape} result of adding a dense operand to {_describe(sp)}")
    dense = to_dense(sp, "add")
    return _dense_add(dense, other) if sp is a else _dense_add(other, dense)


def _broadcastable(s: tuple, t: tuple) -> bool:
    try:
        np.broadcast_shapes(s, t)
        return True
    except ValueError:
        return False


def sub(a: Any, b: Any) -> Tensor:
    """a - b = a + (-b) with the same layout rules as :func:`add`."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise DTypeError("sub: at least one operand must be a polygrad tensor")
    return add(a, -b if isinstance(b, (Tensor, Number)) else -np.asarray(b))


def mul(a: Any, b: Any) -> Tensor:
    """sparse * sparse -> intersection; sparse * dense/scalar -> sparse, pattern kept."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        _check_same_shape("mul", a, b)
        if a.pattern.same_as(b.pattern):
            return SparseTensor._wrap(a.pattern, a._values * b._values)
        pattern, ia, ib = intersect_pattern(a.pattern, b.pattern)
        return SparseTensor._wrap(pattern, a._values[ia] * b._values[ib])
    sp, other = (a, b) if isinstance(a, SparseTensor) else (b, a)
    if isinstance(other, Number) and not isinstance(other, bool):
        return SparseTensor._wrap(sp.pattern, sp._values * other)
    g = _gather_dense(sp, other, "mul")
    return SparseTensor._wrap(sp.pattern, sp._values * g if sp is a else g * sp._values)


def div(a: Any, b: Any) -> Tensor:
    """sparse / dense-or-scalar -> sparse (pattern kept); a division *by* a sparse matrix divides by
    its implicit zeros, so it is computed densely (inf/nan where IEEE says so)."""
    if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
        if isinstance(b, Number) and not isinstance(b, bool):
            return SparseTensor._wrap(a.pattern, a._values / b)
        return SparseTensor._wrap(a.pattern, a._values / _gather_dense(a, b, "div"))
    return _dense_div(_densify(a, "div"), _densify(b, "div"))


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001
    """sparse ** positive scalar -> sparse (0 ** p = 0); any other power is computed densely."""
    if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
        exponent = b
        if isinstance(b, Tensor) and b.numel == 1:
            exponent = b.item()
        elif not isinstance(b, Tensor) and np.ndim(b) == 0:
            exponent = float(np.asarray(b))
        if isinstance(exponent, Number) and exponent > 0:
            if isinstance(b, Tensor):
                return SparseTensor._wrap(a.pattern, a._values ** _dense_operand(b, a, "pow").reshape(()))
            return SparseTensor._wrap(a.pattern, a._values ** b)
    return _dense_pow(_densify(a, "pow"), _densify(b, "pow"))


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


def _check_output_memory(op: str, shape: tuple, dtype: Any, backend: Any, what: str) -> None:
    memory.check(op, memory.nbytes(shape, dtype), backend=backend, what=what)


def matmul(a: Any, b: Any) -> Tensor:
    """sparse @ dense -> dense (SpMM); dense @ sparse -> dense (through Aᵀ); sparse @ sparse -> sparse."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        return _spgemm(a, b)
    if isinstance(a, SparseTensor):
        x = _dense_operand(b, a, "matmul")
        if x.ndim not in (1, 2) or x.shape[0] != a.shape[1]:
            raise ShapeError(f"op 'matmul': {_describe(a)} @ dense {x.shape}: the dense operand must be 1-D or "
                             f"2-D with {a.shape[1]} rows")
        out_shape = (a.shape[0],) + x.shape[1:]
        _check_output_memory("matmul", out_shape, np.promote_types(a.dtype, x.dtype), a._be,
                             f"the dense {out_shape} result of {_describe(a)} @ dense {x.shape}")
        return spmm(a._values, x, a.pattern)
    x = _dense_operand(a, b, "matmul")
    if x.ndim not in (1, 2) or x.shape[-1] != b.shape[0]:
        raise ShapeError(f"op 'matmul': dense {x.shape} @ {_describe(b)}: the dense operand must be 1-D or 2-D "
                         f"with {b.shape[0]} columns")
    out_shape = x.shape[:-1] + (b.shape[1],)
    _check_output_memory("matmul", out_shape, np.promote_types(b.dtype, x.dtype), b._be,
                         f"the dense {out_shape} result of dense {x.shape} @ {_describe(b)}")
    bt = transpose(b)  # X @ A = (Aᵀ @ Xᵀ)ᵀ
    if x.ndim == 1:
        return spmm(bt._values, x, bt.pattern)
    return spmm(bt._values, x.T, bt.pattern).T


def _spgemm(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """sparse @ sparse, kept sparse: every product a_ik * b_kj is formed once (O(flops) memory, checked
    against the budget) and summed into its (i, j) slot by a deterministic scatter."""
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"op 'matmul': {_describe(a)} @ {_describe(b)}: inner dimensions differ")
    if a._be is not b._be:
        raise MixedBackendError(f"op 'matmul': {_describe(a)} and {_describe(b)} live on different backends; "
                                "move one with .to(name)")
    pa, pb = a.pattern, b.pattern
    n, m = a.shape[0], b.shape[1]
    counts = np.diff(pb.indptr)[pa.cols]
    total = int(counts.sum())
    itemsize = np.promote_types(a.dtype, b.dtype).itemsize
    memory.check("matmul", total * (4 * 8 + 2 * itemsize), backend=a._be,
                 what=f"the {total} partial products of {_describe(a)} @ {_describe(b)}")
    ia = np.repeat(np.arange(pa.nnz, dtype=np.int64), counts)
    starts = np.repeat(pb.indptr[pa.cols] - (np.cumsum(counts) - counts), counts)
    ib = starts + np.arange(total, dtype=np.int64)
    rows, cols = pa.rows[ia], pb.cols[ib]
    products = a._values[ia] * b._values[ib]
    if total == 0:
        return SparseTensor._wrap(_pattern_sorted((n, m), rows, cols, a.layout), products)
    return _coalesce("matmul", (n, m), rows, cols, products, a.layout)


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


def _diag_fill_dtype(a: SparseTensor, fill: Any) -> np.dtype:
    if a.dtype.kind == "f" or (isinstance(fill, (int, np.integer)) and not isinstance(fill, bool)):
        return a.dtype
    return np.dtype(default_float)


def add_self_loops(a: Any, fill_value: float = 1.0, mode: str = "add") -> SparseTensor:
    """A with ``fill_value`` on the diagonal, as a sparse tensor (pattern union with the diagonal).

    ``mode="add"``: A + fill_value * I (an existing diagonal entry is increased).
    ``mode="remaining"``: only missing diagonal entries get ``fill_value``; existing ones keep their
    value (PyG's ``add_remaining_self_loops``, what ``gcn_norm`` uses).  Differentiable in A.
    """
    op = "add_self_loops"
    a = _as_sparse(op, a)
    if mode not in ("add", "remaining"):
        raise ValueError(f"{op}: mode must be 'add' or 'remaining', got {mode!r}")
    n, m = a.shape
    if n != m:
        raise ShapeError(f"{op}: needs a square matrix, got {_describe(a)}")
    loops = np.arange(n, dtype=np.int64)
    diag = Pattern((n, n), np.arange(n + 1, dtype=np.int64), loops, a.layout, rows=loops)
    pattern, pa, pd = union_pattern(a.pattern, diag)
    fill = np.zeros(pattern.nnz, dtype=_diag_fill_dtype(a, fill_value))
    if mode == "add":
        fill[pd] = fill_value
    else:
        present = np.zeros(pattern.nnz, dtype=bool)
        present[pa] = True
        fill[pd[~present[pd]]] = fill_value
    values = _scatter(a._values, pa, pattern.nnz) + tensor_from_numpy(fill, a._be)
    return SparseTensor._wrap(pattern, values)


def gcn_norm(a: Any, add_self_loops: bool = True, fill_value: float = 1.0) -> SparseTensor:
    """GCN's propagation matrix ``D^-1/2 (A + I) D^-1/2`` (Kipf & Welling), sparse.

    Self loops are added where missing (``mode="remaining"``, as PyG's ``gcn_norm`` does: an
    existing self loop keeps its weight), D is the row sum of the result, and rows of degree 0
    stay 0.  Differentiable w.r.t. A's values (the degrees included) when they require grad.
    ``polygrad.data.normalized_adjacency`` (the numpy reference) agrees on simple graphs; on a
    graph with duplicate edges or weighted self loops it differs: it de-duplicates edges and sets
    every self loop to 1, while here duplicates are summed at construction.
    """
    a = _as_sparse("gcn_norm", a)
    if add_self_loops:
        a = globals()["add_self_loops"](a, fill_value, mode="remaining")
    elif a.shape[0] != a.shape[1]:
        raise ShapeError(f"gcn_norm: needs a square matrix, got {_describe(a)}")
    values = a._values if a.dtype.kind == "f" else a._values.cast(default_float)
    deg = segment_sum(values, a.pattern)
    positive = deg > 0
    # where() keeps 0 ** -0.5 = inf (and its inf gradient) out of both the value and the gradient
    dinv = where(positive, where(positive, deg, 1.0) ** -0.5, 0.0)
    p = a.pattern
    return SparseTensor._wrap(p, values * dinv[p.rows] * dinv[p.cols])


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


# =====================================================================================================
# automatic sparsification of a dense matmul operand (cached per tensor storage)
# =====================================================================================================

class _CacheEntry:
    __slots__ = ("token", "nnz", "sampled", "sparse")

    def __init__(self, token: Any):
        self.token = token
        self.nnz: int | None = None
        self.sampled: float | None = None
        self.sparse: SparseTensor | None = None


# id(tensor) -> entry; an entry is dropped when its tensor dies (weakref callback), and ignored
# when the tensor's storage (``t._data``) was replaced (``t.data = ...``) since it was made.
_matmul_cache: dict[int, tuple[weakref.ref, _CacheEntry]] = {}
#: entries sampled to estimate a density: at a true density of 3% the chance that 256 samples
#: exceed the rejection bound (2 x break-even + 5%, ~11%) is below 1e-9, and the gather costs a
#: few microseconds even on matrices that do not fit in cache
_SAMPLE = 256
_sample_positions: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _storage_token(data: Any) -> Any:
    try:
        return weakref.ref(data)
    except TypeError:  # arrays without weakref support (the scalar backend's): hold them
        return data


def _token_matches(token: Any, data: Any) -> bool:
    return (token() if isinstance(token, weakref.ref) else token) is data


def _still_matches(entry: _CacheEntry, host: np.ndarray) -> bool:
    """Whether the cached sparse form still equals ``host`` (exact: same nonzero count, and the
    same values at the cached positions -- a zero that became nonzero changes the count unless a
    cached position changed too)."""
    sp = entry.sparse
    if sp is None:
        return True  # only the layout estimate is cached: a stale one costs speed, never correctness
    p = sp.pattern
    values = sp._values._be.to_numpy(sp._values._data)
    return (int(np.count_nonzero(host)) == sp.nnz
            and np.array_equal(host[p.rows, p.cols], values, equal_nan=True))


def _cache_entry(a: Tensor) -> _CacheEntry:
    key = id(a)
    found = _matmul_cache.get(key)
    data = a._data
    if found is not None and found[0]() is a:
        entry = found[1]
        # storage shared with the user (pg.from_numpy, t.numpy()) may have been written since:
        # re-validate the content (O(n*m), still cheaper than a dense matmul); polygrad itself
        # never writes into a storage, so an unshared one is served as is
        if _token_matches(entry.token, data) and (
                not sharing.is_shared(data) or _still_matches(entry, a._be.to_numpy(data))):
            return entry
    entry = _CacheEntry(_storage_token(data))
    ref = weakref.ref(a, lambda _r, k=key: _matmul_cache.pop(k, None))
    _matmul_cache[key] = (ref, entry)
    return entry


def _sampled_density(host: np.ndarray) -> float:
    """Fraction of nonzeros among _SAMPLE scattered entries (no copy, even of a transposed view).

    Positions come from multiplicative hashing of 0.._SAMPLE-1 (computed once per shape), so the
    sample is deterministic and does not alias with banded or block patterns as a stride could.
    """
    n, m = host.shape
    numel = n * m
    if numel <= _SAMPLE:
        return float(np.count_nonzero(host)) / numel if numel else 0.0
    where_ = _sample_positions.get((n, m))
    if where_ is None:
        pos = (np.arange(_SAMPLE, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(numel)
        where_ = np.divmod(pos.astype(np.int64), m)
        if len(_sample_positions) > 256:  # a bounded memo: shapes come and go
            _sample_positions.clear()
        _sample_positions[(n, m)] = where_
    return float(np.count_nonzero(host[where_])) / _SAMPLE


def maybe_sparsify_for_matmul(a: Tensor, b: Tensor) -> SparseTensor | None:
    """A sparse form of dense ``a`` when the layout policy says ``a @ b`` is cheaper sparse, else None.

    Only a 2-D floating ``a`` that is not itself differentiated qualifies: a dense leaf requiring
    grad needs a gradient at its zeros too, which a sparse form would not give.  The nonzero count
    and the sparse form are cached on the tensor's storage (converted once; a new ``t.data``
    invalidates them; a storage shared with the user -- ``pg.from_numpy``, ``t.numpy()`` -- is
    re-validated against the cached form before each use, so in-place writes are never missed).
    """
    if a.ndim != 2 or b.ndim not in (1, 2) or a.dtype.kind != "f" or b.dtype.kind != "f":
        return None
    if a.requires_grad and is_grad_enabled():
        return None
    if a._be.lazy:  # counting its nonzeros would compute the matrix and gather it onto this process
        return None
    if a.shape[0] * a.shape[1] < config.sparse_min_elements and _events["polygrad_layout_chosen"] is None:
        return None  # choose_layout's size rule, without the bookkeeping (the common small matmul)
    entry = _cache_entry(a)
    host: list = []

    def host_array() -> np.ndarray:
        if not host:
            host.append(a._be.to_numpy(a._data))  # internal read: does not mark the storage shared
        return host[0]

    def count() -> int:
        if entry.nnz is None:
            entry.nnz = int(np.count_nonzero(host_array()))
        return entry.nnz

    if entry.nnz is None and entry.sampled is None and a.shape[0] * a.shape[1] >= config.sparse_min_elements:
        # a scattered sample lets the policy reject a clearly dense operand without an O(n*m) count
        entry.sampled = _sampled_density(host_array())
    chosen = choose_layout(a.shape, count if entry.nnz is None else entry.nnz, op="matmul",
                           feature_width=b.shape[1] if b.ndim == 2 else 1, dtype=a.dtype, backend=a._be,
                           sampled_density=entry.sampled, dense_exists=True)
    if chosen == "dense":
        return None
    if entry.sparse is None:
        entry.sparse = _nonzero_sparse(a.detach(), "csr")
        entry.nnz = entry.sparse.nnz
    return entry.sparse
