"""Graph helpers on sparse adjacency matrices: self loops and GCN normalisation."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.dtypes import default_float
from ..ir.errors import ShapeError, SparseIndexError
from ..tensor import Tensor, segment_sum, tensor_from_numpy, where
from .construct import _scatter
from .sparse_tensor import SparseTensor, _as_sparse, _describe


# =====================================================================================================
# graph helpers
# =====================================================================================================


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
    pattern, pa, pd, had_diag = a.pattern.union_diagonal()
    fill = np.zeros(pattern.nnz, dtype=_diag_fill_dtype(a, fill_value))
    fill[pd if mode == "add" else pd[~had_diag]] = fill_value
    values = _scatter(a._values, pa, pattern.nnz) + tensor_from_numpy(fill, a._be)
    return SparseTensor._wrap(pattern, values)


_add_self_loops = add_self_loops  # gcn_norm's flag of the same name shadows the function


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
        a = _add_self_loops(a, fill_value, mode="remaining")
    elif a.shape[0] != a.shape[1]:
        raise ShapeError(f"gcn_norm: needs a square matrix, got {_describe(a)}")
    values = a._values if a.dtype.kind == "f" else a._values.cast(default_float)
    deg = segment_sum(values, a.pattern)
    positive = deg > 0
    # where() keeps 0 ** -0.5 = inf (and its inf gradient) out of both the value and the gradient
    dinv = where(positive, where(positive, deg, 1.0) ** -0.5, 0.0)
    p = a.pattern
    # row ids expanded for this one gather, not cached on the pattern (nnz int64s kept for nothing)
    return SparseTensor._wrap(p, values * dinv[p.row_ids()] * dinv[p.cols])



# =====================================================================================================
# edge_index: the one validator every graph layer and graph helper uses
# =====================================================================================================


class EdgeIndexError(SparseIndexError, ShapeError):
    """A malformed or out-of-range ``edge_index``: both a SparseIndexError (the sparse
    constructors' error for bad indices) and a ShapeError (what graph layers raised before
    they shared this validator), so either ``except`` catches it."""


def edge_index_array(op: str, edge_index: Any, num_src: int | None = None,
                     num_dst: int | None = None) -> np.ndarray:
    """``edge_index`` (PyG's int ``[2, E]``: sources in row 0, destinations in row 1; a numpy
    array, a list or a dense tensor) as an int64 host array, or a :class:`SparseIndexError`
    (a ``ValueError``) naming ``op``, the dtype and shape, and the first out-of-range entry.

    ``num_src`` / ``num_dst`` bound rows 0 / 1 when given.  The result may share memory with
    the caller's array: a cache that keeps it must copy it.
    """
    if isinstance(edge_index, Tensor):
        if isinstance(edge_index, SparseTensor):
            raise EdgeIndexError(f"{op}: edge_index must be a dense integer [2, E] array, got a "
                                   f"{edge_index.layout} tensor of shape {edge_index.shape}")
        ei = np.asarray(edge_index._be.to_numpy(edge_index._data))
    else:
        ei = np.asarray(edge_index)
    if ei.size == 0 and ei.ndim == 2 and ei.shape[0] == 2 and ei.dtype.kind == "f":
        ei = ei.astype(np.int64)  # [[], []] arrives as float64
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
        raise EdgeIndexError(f"{op}: edge_index must be an integer array of shape [2, E], got "
                               f"{ei.dtype} {ei.shape}")
    ei = ei.astype(np.int64, copy=False)
    for row, bound in ((0, num_src), (1, num_dst)):
        if bound is not None and ei.shape[1]:
            bad = np.flatnonzero((ei[row] < 0) | (ei[row] >= bound))
            if bad.size:
                k = int(bad[0])
                raise EdgeIndexError(f"{op}: edge_index[{row}, {k}] = {ei[row, k]} is outside "
                                       f"[0, {bound}), the nodes of that row ({bad.size} such entries)")
    return ei
