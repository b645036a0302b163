"""Global pooling: one vector per graph of a batch (``global_add_pool``, ``_mean_``, ``_max_``).

``batch[i]`` is the graph of node ``i`` (the vector :class:`polygrad.data.Batch` builds); the
result has one row per graph, ``size`` rows when given (graphs without nodes give 0), else
``batch.max() + 1``.  PyG's ``torch_geometric.nn.global_*_pool``; gradients through the scatter
reductions of :mod:`polygrad.graph_ops` (max: to the maximal nodes, ties split evenly).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.errors import SparseIndexError
from polygrad.graph_ops import scatter
from polygrad.tensor import Tensor

__all__ = ["global_add_pool", "global_mean_pool", "global_max_pool"]


def _checked_batch(op: str, batch: Any) -> Any:
    """``batch`` with no negative graph id: a negative id would index rows from the end (add pool:
    silently into the last graph) or fail deep inside numpy (mean/max pool)."""
    ids = batch.numpy() if isinstance(batch, Tensor) else np.asarray(batch)
    if ids.size and ids.dtype.kind == "i" and ids.min() < 0:
        bad = int(np.flatnonzero(ids.reshape(-1) < 0)[0])
        raise SparseIndexError(f"{op}: batch[{bad}] = {ids.reshape(-1)[bad]} is negative; batch[i] is the "
                               "graph id (>= 0) of node i")
    return batch


def _pool(x: Tensor, batch: Any, size: int | None, reduce: str) -> Tensor:
    if batch is None:  # one graph: all nodes
        batch = np.zeros(x.shape[0], dtype=np.int64)
    return scatter(x, _checked_batch(f"global_{'add' if reduce == 'sum' else reduce}_pool", batch), size, reduce)


def global_add_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Sum of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "sum")


def global_mean_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Mean of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "mean")


def global_max_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Feature-wise maximum over each graph's nodes: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "max")
