"""Graph primitives for message passing: SDDMM, edge softmax, gather / scatter (sum, mean, max).

All are composites of existing primitives (SDDMM, SPMM, SEGMENT_SUM/MAX, GETITEM, INDEX_ADD), so
their gradients come from the gradient table, they run on every backend and through the scalar
fallback, and every gradient stays O(nnz): nothing here is ever ``N x N``.

Direction convention (PyG's ``flow="source_to_target"``): an ``edge_index`` column ``(j, i)``
sends a message from source ``j`` to destination ``i``.  A *graph pattern* (:func:`graph_pattern`)
stores it as the nonzero ``(row=i, col=j)``, so ``A @ X`` sums messages into destinations and a
per-row softmax normalises over each destination's incoming edges.  A sparse adjacency tensor the
user builds is read the same way: rows are destinations.

Multi-head edge values ``[nnz, H]`` are handled by the *head expansion* of a pattern
(:func:`expand_pattern`): the ``(N*H) x (M*H)`` pattern holding entry ``(i*H+h, j*H+h)`` for every
nonzero ``(i, j)`` and head ``h``.  On it, H heads are one 1-D problem, so one segment reduction
(or one SpMM) serves all heads; it is built once per (pattern, H) and cached.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..ir.errors import DTypeError, ShapeError, SparseIndexError
from .pattern import Pattern
from . import SparseTensor, is_sparse
from .graph import edge_index_array
from ..tensor import Tensor, _floating, index_add, segment_max, segment_sum, tensor, where
from ..tensor import sddmm as _sddmm_primitive

__all__ = ["sddmm", "edge_softmax", "gather", "scatter", "scatter_sum", "scatter_mean", "scatter_max",
           "graph_pattern", "expand_pattern", "segment_softmax"]

REDUCTIONS = ("sum", "mean", "max")


# -- patterns -------------------------------------------------------------------------------------

def _pattern_of(op: str, graph: Any) -> Pattern:
    if isinstance(graph, Pattern):
        return graph
    if is_sparse(graph):
        return graph.pattern
    raise DTypeError(f"{op}: expected a sparse tensor or a Pattern, got {type(graph).__name__}"
                     + (f" of shape {graph.shape}" if isinstance(graph, Tensor) else ""))


def graph_pattern(edge_index: Any, num_nodes: int, num_src_nodes: int | None = None,
                  layout: str = "csr") -> tuple[Pattern, np.ndarray]:
    """(pattern, edge order) of a PyG ``edge_index`` [2, E]: rows are destinations, cols sources.

    ``edge order`` lists the input edges in the pattern's (row-major) order, so per-edge data
    given in ``edge_index`` order is ``data[order]`` in pattern order.  Repeated edges are kept
    once (the first occurrence): a pattern has no duplicates (the graph layers keep every copy:
    :class:`polygrad.nn.graph_cache.EdgeGraph`).  ``num_src_nodes`` (default
    ``num_nodes``) sizes a bipartite graph (sampled blocks: sources ⊇ destinations).
    """
    n_dst, n_src = int(num_nodes), int(num_nodes if num_src_nodes is None else num_src_nodes)
    ei = edge_index_array("graph_pattern", edge_index, n_src, n_dst)
    src, dst = ei[0], ei[1]
    order = np.lexsort((src, dst))
    rows, cols = dst[order], src[order]
    if rows.size > 1:
        first = np.ones(rows.size, dtype=bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        if not first.all():
            order, rows, cols = order[first], rows[first], cols[first]
    indptr = np.zeros(n_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_dst), out=indptr[1:])
    for a in (rows, cols, order):
        a.flags.writeable = False  # read-only: backends may cache device copies of pattern arrays
    return Pattern((n_dst, n_src), indptr, np.ascontiguousarray(cols), layout, rows=np.ascontiguousarray(rows)), order


_EXPANDED: "weakref.WeakKeyDictionary[Pattern, dict[int, tuple[Pattern, np.ndarray, np.ndarray]]]" = \
    weakref.WeakKeyDictionary()


def expand_pattern(pattern: Pattern, heads: int) -> tuple[Pattern, np.ndarray, np.ndarray]:
    """(head-expanded pattern, to_expanded, from_expanded) for ``heads`` heads; cached.

    ``values[nnz, H].reshape(-1)[to_expanded]`` are the expanded pattern's values (row-major), and
    ``expanded_values[from_expanded].reshape(nnz, H)`` maps back.  Entry order of row ``i*H+h``
    is row ``i``'s order, so the expanded pattern is canonical without a sort.
    """
    per = _EXPANDED.setdefault(pattern, {})
    hit = per.get(heads)
    if hit is not None:
        return hit
    h = int(heads)
    n, m = pattern.shape
    indptr, rows, cols = pattern.indptr, pattern.rows, pattern.cols
    nnz = pattern.nnz
    deg = np.diff(indptr)
    k = np.arange(h, dtype=np.int64)
    offset = np.arange(nnz, dtype=np.int64) - indptr[rows]            # position within its row
    pos = (indptr[rows] * h + offset)[:, None] + k[None, :] * deg[rows][:, None]  # slot of (e, h)
    to_expanded = np.empty(nnz * h, dtype=np.int64)
    to_expanded[pos.ravel()] = np.arange(nnz * h, dtype=np.int64)     # flat (e, h) -> its slot
    from_expanded = pos.ravel().copy()
    e_rows = np.empty(nnz * h, dtype=np.int64)
    e_cols = np.empty(nnz * h, dtype=np.int64)
    e_rows[pos.ravel()] = (rows[:, None] * h + k[None, :]).ravel()
    e_cols[pos.ravel()] = (cols[:, None] * h + k[None, :]).ravel()
    e_indptr = np.zeros(n * h + 1, dtype=np.int64)
    np.cumsum(np.repeat(deg, h), out=e_indptr[1:])
    for a in (to_expanded, from_expanded, e_rows, e_cols):
        a.flags.writeable = False
    expanded = Pattern((n * h, m * h), e_indptr, e_cols, pattern.layout, rows=e_rows)
    per[heads] = (expanded, to_expanded, from_expanded)
    return per[heads]


# -- SDDMM and edge softmax ------------------------------------------------------------------------

def sddmm(pattern_or_sparse: Any, a: Tensor, b: Tensor) -> Any:
    """``(a @ bᵀ)`` sampled at a sparsity pattern: ``out[e] = a[row_e] · b[col_e]``, O(nnz·F).

    Given a sparse tensor, returns a sparse tensor with its pattern holding these values (the
    sparse tensor's own values are not used: multiply by it for the "sampled" product ``A * (a bᵀ)``);
    given a :class:`~polygrad.sparse.pattern.Pattern`, returns the 1-D values.  ``a`` is ``[rows, F]``,
    ``b`` is ``[cols, F]`` (1-D vectors are taken as F = 1).  Differentiable in ``a`` and ``b``.
    """
    pattern = _pattern_of("sddmm", pattern_or_sparse)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or is_sparse(a) or is_sparse(b):
        raise DTypeError(f"sddmm: a and b must be dense tensors, got {type(a).__name__} and {type(b).__name__}")
    a = a.reshape(a.shape[0], 1) if a.ndim == 1 else a
    b = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    values = _sddmm_primitive(a, b, pattern)
    return SparseTensor._wrap(pattern, values) if is_sparse(pattern_or_sparse) else values


def segment_softmax(values: Tensor, pattern: Pattern) -> Tensor:
    """Softmax of 1-D ``values`` within each row of ``pattern`` (the shared kernel of edge softmax).

    Shifted by the row maximum (detached: softmax is shift-invariant), exponentiated, divided by
    the row sum.  A fully masked row (all -inf) is shifted by 0 and divided by 1, so it gives
    zeros rather than nan (as PyG's ``softmax``).
    """
    m = segment_max(values.detach(), pattern)
    shift = where(m > -np.inf, m, 0.0)
    e = (values - shift[pattern.rows]).exp()
    total = segment_sum(e, pattern)
    return e / where(total > 0, total, 1.0)[pattern.rows]


def edge_softmax(pattern_or_sparse: Any, scores: Any = None) -> Any:
    """Softmax of edge ``scores`` normalised over each destination row (GAT's attention).

    ``pattern_or_sparse``: a sparse adjacency (whose values are the scores when ``scores`` is
    omitted) or a Pattern; ``scores``: ``[nnz]`` or ``[nnz, H]`` (H heads,
    each normalised on its own), in the pattern's (row-major) order.  Returns the same shape;
    a sparse tensor in gives a sparse tensor out when ``scores`` is 1-D.  PyG's
    ``torch_geometric.utils.softmax(src, index)`` with ``index`` = destinations.
    """
    op = "edge_softmax"
    pattern = _pattern_of(op, pattern_or_sparse)
    if scores is None and is_sparse(pattern_or_sparse):
        scores = pattern_or_sparse.values
    if not isinstance(scores, Tensor) or is_sparse(scores):
        raise DTypeError(f"{op}: scores must be a dense tensor [nnz] or [nnz, H], got {type(scores).__name__}")
    if scores.ndim not in (1, 2) or scores.shape[0] != pattern.nnz:
        raise ShapeError(f"{op}: scores of shape {scores.shape} do not fit a pattern with nnz={pattern.nnz} "
                         f"(need [{pattern.nnz}] or [{pattern.nnz}, H])")
    scores = _floating(scores)
    if scores.ndim == 1:
        out = segment_softmax(scores, pattern)
        return SparseTensor._wrap(pattern, out) if is_sparse(pattern_or_sparse) else out
    heads = scores.shape[1]
    expanded, to_expanded, from_expanded = expand_pattern(pattern, heads)
    flat = segment_softmax(scores.reshape(-1)[to_expanded], expanded)
    return flat[from_expanded].reshape(pattern.nnz, heads)


# -- gather / scatter ------------------------------------------------------------------------------

def _index(op: str, index: Any, size: int | None = None) -> np.ndarray:
    idx = index.numpy() if isinstance(index, Tensor) else np.asarray(index)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise SparseIndexError(f"{op}: index must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    # checked with or without a size: a negative index would wrap to the last rows silently
    if idx.size and (idx.min() < 0 or (size is not None and idx.max() >= size)):
        bad = int(np.flatnonzero((idx < 0) | (idx >= (size if size is not None else np.iinfo(np.int64).max)))[0])
        upper = size if size is not None else "inf"
        raise SparseIndexError(f"{op}: index[{bad}] = {idx[bad]} is out of range [0, {upper})")
    return idx


def gather(x: Tensor, index: Any) -> Tensor:
    """Rows ``x[index]`` (one per edge, e.g. ``x_j = gather(x, edge_index[0])``); backward adds
    the gradient rows back into place (deterministic INDEX_ADD)."""
    return x[_index("gather", index, x.shape[0])]


def _dim_size(op: str, idx: np.ndarray, dim_size: int | None) -> int:
    if dim_size is None:
        return int(idx.max()) + 1 if idx.size else 0
    return int(dim_size)


def _check_src(op: str, src: Tensor, idx: np.ndarray) -> None:
    if not isinstance(src, Tensor) or is_sparse(src):
        raise DTypeError(f"{op}: src must be a dense tensor, got {type(src).__name__}")
    if src.ndim < 1 or src.shape[0] != idx.shape[0]:
        raise ShapeError(f"{op}: src of shape {src.shape} needs one row per index entry ({idx.shape[0]})")


def scatter_sum(src: Tensor, index: Any, dim_size: int | None = None) -> Tensor:
    """``out[i] = sum of src[e] over e with index[e] == i`` (rows; empty groups give 0)."""
    op = "scatter_sum"
    idx = _index(op, index, dim_size)
    _check_src(op, src, idx)
    n = _dim_size(op, idx, dim_size)
    return index_add(src, (idx,), (n,) + src.shape[1:])


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(idx, minlength=n)[:n]


def scatter_mean(src: Tensor, index: Any, dim_size: int | None = None) -> Tensor:
    """Mean of the rows of ``src`` per group of ``index`` (empty groups give 0, as PyG)."""
    op = "scatter_mean"
    idx = _index(op, index, dim_size)
    _check_src(op, src, idx)
    n = _dim_size(op, idx, dim_size)
    total = index_add(_floating(src), (idx,), (n,) + src.shape[1:])
    inv = 1.0 / np.maximum(_counts(idx, n), 1)
    return total * tensor(inv.reshape((n,) + (1,) * (src.ndim - 1)).astype(total.dtype), backend=total._be)


def _feature_major_groups(idx: np.ndarray, n: int, width: int) -> tuple[Pattern, np.ndarray | None]:
    """(pattern, order) to reduce ``width`` columns of grouped entries with one 1-D segment op.

    The entries are taken in ``order`` (a stable sort by group; None when ``idx`` is already
    sorted, as a graph pattern's destinations are) and laid out feature-major (``values.T``):
    column k's entries of group i are then the contiguous run ``k*E + indptr[i] .. k*E +
    indptr[i+1]``, i.e. row ``k*n + i`` of a ``[width*n, width*E]`` pattern whose row pointers
    are arithmetic -- no per-entry sort or index shuffle.
    """
    e = idx.shape[0]
    order = None if e < 2 or (np.diff(idx) >= 0).all() else np.argsort(idx, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(_counts(idx, n), out=indptr[1:])
    starts = (indptr[:-1][None, :] + (np.arange(width, dtype=np.int64) * e)[:, None]).ravel()
    fm_indptr = np.append(starts, width * e)
    return Pattern((width * n, width * e), fm_indptr, np.arange(width * e, dtype=np.int64)), order


def scatter_max(src: Tensor, index: Any, dim_size: int | None = None) -> Tensor:
    """Maximum of the rows of ``src`` per group of ``index`` (empty groups give 0, as PyG).

    Gradient: to the maximal entries, split evenly among ties (polygrad's max convention).  The
    maxima and tie counts come from 1-D segment reductions over the entries laid out
    feature-major (all columns at once, :func:`_feature_major_groups`); the result is the sum of
    ``src * w`` per group with the constant tie weights ``w``, which has both the right value and
    the right gradient.  With ``index`` sorted (message passing) that sum is a segment sum too,
    whose backward is a gather: no scatter anywhere.
    """
    op = "scatter_max"
    idx = _index(op, index, dim_size)
    _check_src(op, src, idx)
    n = _dim_size(op, idx, dim_size)
    src = _floating(src)
    width = int(np.prod(src.shape[1:], dtype=np.int64))
    if idx.size == 0 or width == 0:
        return index_add(src, (idx,), (n,) + src.shape[1:])
    pattern, order = _feature_major_groups(idx, n, width)

    def feature_major(t: Tensor) -> Tensor:  # [E, width] -> [width * E], grouped within each column
        return (t if order is None else t[order]).T.reshape(-1)

    def per_group(v: Tensor) -> Tensor:      # [width * n] -> [n, width]
        return v.reshape(width, n).T

    flat = src.reshape(idx.shape[0], width)
    best = per_group(segment_max(feature_major(flat.detach()), pattern))
    hit = (flat.detach() == best[idx]).cast(src.dtype)          # 1 at the maxima (ties included)
    ties = per_group(segment_sum(feature_major(hit), pattern))
    weighted = flat * (hit / where(ties > 0, ties, 1.0)[idx])
    if order is None:
        return per_group(segment_sum(feature_major(weighted), pattern)).reshape((n,) + src.shape[1:])
    return index_add(weighted.reshape(src.shape), (idx,), (n,) + src.shape[1:])


def scatter(src: Tensor, index: Any, dim_size: int | None = None, reduce: str = "sum") -> Tensor:
    """Reduce the rows of ``src`` [E, ...] into ``dim_size`` groups by ``index`` [E]: ``reduce`` is
    "sum" (also "add"), "mean" or "max" (``torch_scatter.scatter`` / PyG ``utils.scatter``)."""
    if reduce in ("sum", "add"):
        return scatter_sum(src, index, dim_size)
    if reduce == "mean":
        return scatter_mean(src, index, dim_size)
    if reduce == "max":
        return scatter_max(src, index, dim_size)
    raise ValueError(f"scatter: reduce must be one of 'sum', 'mean', 'max', got {reduce!r}")
