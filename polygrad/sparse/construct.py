"""Construction: validation of user input, canonical form (sorted, duplicates summed), conversions,
and the pattern merges (union, intersection) the ops and graph helpers build on."""
from __future__ import annotations

import copyreg
from typing import Any, Sequence

import numpy as np

from ..runtime import memory
from ..engine.dispatch import is_grad_enabled
from ..ir.dtypes import as_dtype, default_float
from ..ir.errors import DTypeError, MixedBackendError, NonFiniteError, ShapeError, SparseIndexError
from .pattern import Pattern
from ..runtime.registry import resolve
from ..tensor import Tensor, index_add, tensor, tensor_from_numpy
from .layout import _check_layout, choose_layout
from .sparse_tensor import SparseTensor, _describe, to_dense


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


def _coalesce(op: str, shape: tuple[int, int], rows: np.ndarray, cols: np.ndarray, values: Tensor,
              layout: str) -> SparseTensor:
    """Canonical form: sorted row-major, duplicates summed (in input order, deterministically)."""
    pattern, perm, slot = Pattern.from_coo(shape, rows, cols, layout)
    if perm is not None:
        values = values[perm]
    elif slot is not None:  # each input entry is added into its slot (bincount: deterministic)
        values = index_add(values, (slot,), (pattern.nnz,))
    return SparseTensor._wrap(pattern, values)


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
    return _coo_from_own_indices(op, "indices", _index_array(op, "indices", indices, 2), values, shape, dtype,
                                 requires_grad, backend, layout, allow_nonfinite)


def _coo_from_own_indices(op: str, name: str, idx: np.ndarray, values: Any, shape: Sequence[int], dtype: Any,
                          requires_grad: bool, backend: Any, layout: str, allow_nonfinite: bool) -> Tensor:
    """:func:`sparse_coo` on ``idx``, an index array of ours (a copy nobody else can edit)."""
    _check_layout(op, layout)
    n, m = _check_shape(op, shape)
    if idx.shape[0] != 2:
        want = "[2, E]" if name == "edge_index" else "[2, nnz] (rows, cols)"
        raise SparseIndexError(f"{op}: {name} must be {want}, got shape {idx.shape}")
    _check_index_dtype(op, name, idx, max(n, m))
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
    steps: np.ndarray = np.diff(ptr.astype(np.int64))
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
                    backend: str, requires_grad: bool, grad: Any, name: Any) -> Tensor:
    """Unpickle a sparse tensor: through :func:`sparse_csr`, so a hostile pickle is validated
    like any construction."""
    t = sparse_csr(indptr, cols, values, shape, backend=backend, layout=layout, allow_nonfinite=True,
                   requires_grad=requires_grad and values.dtype.kind == "f")
    if grad is not None:
        t.grad = sparse_csr(indptr, cols, grad, shape, backend=backend, layout=layout, allow_nonfinite=True)
    t.name = name
    return t


def _reduce_sparse(t: SparseTensor) -> tuple:
    """Pickle a sparse tensor as its pattern (CSR arrays), values, layout, backend *name*,
    ``requires_grad``, ``.grad`` and name (see :meth:`Tensor.__reduce__`)."""
    p, grad = t.pattern, t.grad
    sparse_grad = None if grad is None else grad.values.numpy().copy()
    return (_rebuild_sparse, (tuple(t.shape), np.array(p.indptr), np.array(p.cols), t.values.numpy().copy(),
                              t.layout, t.backend, bool(t.requires_grad), sparse_grad, t.name))


# Registered here, beside the constructor it rebuilds with: the class's own module comes before
# construction in the layering.  pickle and copy consult copyreg before Tensor.__reduce__.
copyreg.pickle(SparseTensor, _reduce_sparse)


def from_edge_index(edge_index: Any, num_nodes: int | None = None, values: Any = None, *, dtype: Any = None,
                    requires_grad: bool = False, backend: Any = None, layout: str = "csr",
                    allow_nonfinite: bool = False) -> Tensor:
    """The ``num_nodes x num_nodes`` adjacency of a PyG-style ``edge_index`` (int ``[2, E]``).

    Entry ``A[edge_index[0, e], edge_index[1, e]] = values[e]`` (values default to ones of the
    default float dtype); repeated edges are summed.  ``num_nodes`` defaults to max index + 1.
    ``layout="auto"`` lets the cost model pick dense for small dense graphs.
    """
    op = "from_edge_index"
    idx = _index_array(op, "edge_index", edge_index, 2)  # our copy: built on without copying again
    if idx.shape[0] != 2:
        raise SparseIndexError(f"{op}: edge_index must be [2, E], got shape {idx.shape}")
    if num_nodes is None:
        num_nodes = int(idx.max()) + 1 if idx.size else 0
    if values is None:
        values = np.ones(idx.shape[1], dtype=as_dtype(dtype) if dtype is not None else default_float)
    out = _coo_from_own_indices(op, "edge_index", idx, values, (num_nodes, num_nodes), dtype, requires_grad,
                                backend, "csr" if layout == "auto" else layout, allow_nonfinite)
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
    pattern = Pattern.from_sorted((n, m), rows, cols, layout)
    if t.requires_grad and is_grad_enabled():
        values = t.reshape(n * m)[rows * m + cols]
    else:
        values = tensor_from_numpy(np.ascontiguousarray(host[rows, cols]), t._be)
    return SparseTensor._wrap(pattern, values)


def to_sparse(t: Any, layout: str = "csr") -> SparseTensor:
    """Dense 2-D tensor -> SparseTensor of its nonzeros (differentiable); sparse -> relabelled."""
    _check_layout("to_sparse", layout, allow_auto=False)
    if isinstance(t, SparseTensor):
        return t.to_sparse(layout)
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



def union_pattern(p: Pattern, q: Pattern) -> tuple[Pattern, np.ndarray, np.ndarray]:
    """(union pattern, position of each entry of p in it, position of each entry of q in it)."""
    if p.shape != q.shape:
        raise ShapeError(f"union_pattern: shapes {p.shape} and {q.shape} differ")
    kp, kq = _keys(p), _keys(q)
    if kp is not None and kq is not None:
        merged = np.concatenate([kp, kq])
        merged.sort(kind="stable")  # timsort on two sorted runs: one linear merge
        first = np.empty(merged.shape[0], dtype=bool)
        first[:1] = True
        np.not_equal(merged[1:], merged[:-1], out=first[1:])
        u = merged[first]
        del merged, first
        rows, cols = np.divmod(u, p.shape[1]) if p.shape[1] else (u, u)
        pattern = Pattern.from_sorted(p.shape, rows, cols, p.layout)
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
    pattern = Pattern.from_sorted(p.shape, r[first], c[first], p.layout)
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
    pattern = Pattern.from_sorted(p.shape, p.rows[ip], p.cols[ip], p.layout)
    return pattern, ip, iq


def _scatter(values: Tensor, positions: np.ndarray, size: int) -> Tensor:
    """values placed at ``positions`` of a zero vector of ``size`` (positions are unique)."""
    if positions.shape[0] == size:
        return values  # the positions are then 0..size-1 in order (both sorted, unique)
    if not (values.requires_grad and is_grad_enabled()):  # no graph to keep: one host assignment
        host = np.zeros(size, dtype=values.dtype)
        host[positions] = values.numpy()
        return tensor_from_numpy(host, values._be)
    return index_add(values, (positions,), (size,))

