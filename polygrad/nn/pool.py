"""Global pooling: one vector per graph of a batch (``global_add_pool``, ``_mean_``, ``_max_``).

``batch[i]`` is the graph of node ``i`` (the vector :class:`polygrad.data.Batch` builds); the
result has one row per graph, ``size`` rows when given (graphs without nodes give 0), else
``batch.max() + 1``.  PyG's ``torch_geometric.nn.global_*_pool``; gradients through the scatter
reductions of :mod:`polygrad.graph_ops` (max: to the maximal nodes, ties split evenly).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.graph_ops import scatter
from polygrad.tensor import Tensor

__all__ = ["global_add_pool", "global_mean_pool", "global_max_pool"]


def _pool(x: Tensor, batch: Any, size: int | None, reduce: str) -> Tensor:
    if batch is None:  # one graph: all nodes
        batch = np.zeros(x.shape[0], dtype=np.int64)
    return scatter(x, batch, size, reduce)


def global_add_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Sum of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "sum")


def global_mean_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Mean of each graph's node features: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "mean")


def global_max_pool(x: Tensor, batch: Any = None, size: int | None = None) -> Tensor:
    """Feature-wise maximum over each graph's nodes: ``[num_graphs, F]``."""
    return _pool(x, batch, size, "max")
