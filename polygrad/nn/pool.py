"""Global pooling: one vector per graph of a batch (``global_add_pool``, ``_mean_``, ``_max_``).

``batch[i]`` is the graph of node ``i`` (the vector :class:`polygrad.data.Batch` builds); the
result has one row per graph, ``size`` rows when given (graphs without nodes give 0), else
``batch.max() + 1``.  PyG's ``torch_geometric.nn.global_*_pool``; gradients through the scatter
reductions of :mod:`polygrad.sparse.graph_ops` (max: to the maximal nodes, ties split evenly).

Sum and mean over a *sorted* ``batch`` (every collated batch is: graph 0's nodes, then graph
1's, ...) run as one SpMM with the ``[num_graphs, N]`` pooling matrix, whose pattern is just
the node offsets: about 4x less time than the general scatter (whose ``index_add`` has to
group unsorted ids), and the backward is the transpose SpMM.  An unsorted ``batch`` takes the
scatter.  Both add each graph's nodes in node order: the same bits in float64; in float32 the
scatter accumulates in float64 and the SpMM in float32 (a few ulps apart, as PyTorch's own
float32 scatter would be).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.ir.errors import ShapeError, SparseIndexError
from polygrad.sparse.graph_ops import scatter
from polygrad.sparse.pattern import Pattern
from polygrad.sparse import SparseTensor
from polygrad.tensor import Tensor, tensor

__all__ = ["global_add_pool", "global_mean_pool", "global_max_pool"]


def _batch_ids(op: str, x: Tensor, batch: Any) -> np.ndarray:
    """``batch`` as int64 graph ids, refused when negative: a negative id would index rows from the
    end (add pool: silently into the last graph) or fail deep inside numpy (mean/max pool)."""
    if batch is None:  # one graph: all nodes
        return np.zeros(x.shape[0], dtype=np.int64)
    ids = batch.numpy() if isinstance(batch, Tensor) else np.asarray(batch)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise SparseIndexError(f"{op}: batch must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if ids.size and int(ids.min()) < 0:
        bad = int(np.flatnonzero(ids < 0)[0])
        raise SparseIndexError(f"{op}: batch[{bad}] = {ids[bad]} is negative; batch[i] is the "
                               "graph id (>= 0) of node i")
    return ids.astype(np.int64, copy=False)


def _sorted_pool(x: Tensor, ids: np.ndarray, size: int | None, mean: bool) -> Tensor | None:
    """``P @ x`` with ``P[g, i] = 1`` (or ``1 / count_g``) for the nodes ``i`` of graph ``g``, when
    ``ids`` is sorted and ``x`` is a dense float matrix; None otherwise (the caller scatters)."""
    n = ids.shape[0]
    if x.ndim != 2 or x.dtype.kind != "f" or getattr(x, "layout", "dense") != "dense" or n != x.shape[0]:
        return None
    if n > 1 and not bool((ids[1:] >= ids[:-1]).all()):
        return None
    groups = (int(ids[-1]) + 1 if n else 0) if size is None else int(size)
    if n and ids[-1] >= groups:
        raise SparseIndexError(f"global pool: batch holds graph id {int(ids[-1])}, size is {groups}")
    counts = np.bincount(ids, minlength=groups)
    indptr = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    pattern = Pattern((groups, n), indptr, np.arange(n, dtype=np.int64), "csr")
    weights = (1.0 / np.maximum(counts, 1))[ids] if mean else np.ones(n)
    return SparseTensor.from_pattern(pattern, tensor(weights.astype(x.dtype), backend=x.backend)) @ x


def _pool(x: Tensor, batch: Any, size: int | None, reduce: str) -> Tensor:
    op = f"global_{'add' if reduce == 'sum' else reduce}_pool"
    if not isinstance(x, Tensor):
        raise ShapeError(f"{op}: x must be a polygrad tensor, got {type(x).__name__}")
    ids = _batch_ids(op, x, batch)
    if reduce in ("sum", "mean"):
        out = _sorted_pool(x, ids, size, reduce == "mean")
        if out is not None:
            return out
    return scatter(x, ids, size, reduce)


def global_add_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Sum of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "sum")


def global_mean_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Mean of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "mean")


def global_max_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Feature-wise maximum over each graph's nodes: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "max")
