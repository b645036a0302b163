"""Reference models on the graph layers: ``GAT``, ``GraphSAGE`` (node classification) and ``GIN``
(graph classification), the recipes the demos and the ``gat`` benchmark train.
"""
from __future__ import annotations

from typing import Any

from polygrad.activations import elu
from polygrad.tensor import Tensor, concat

from .convs import GATConv, GINConv, SAGEConv
from .gcn import sparse_input
from .layers import Linear, Sequential, ReLU, dropout
from .module import Module
from .pool import global_add_pool

__all__ = ["GAT", "GraphSAGE", "GIN", "sparse_input"]


class GAT(Module):
    """Veličković et al.'s two-layer GAT (PyG's ``examples/gat.py``): dropout -> GATConv(heads,
    concat) -> ELU -> dropout -> GATConv(1 head, or ``out_heads`` averaged) -> logits."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, heads: int = 8,
                 out_heads: int = 1, dropout: float = 0.6, dtype: Any = None, backend: Any = None):
        self.dropout = float(dropout)
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads, dropout=dropout, dtype=dtype, backend=backend)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=out_heads, concat=False,
                             dropout=dropout, dtype=dtype, backend=backend)

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        x = dropout(sparse_input(x, self.conv1.weight), self.dropout, self.training)
        h = elu(self.conv1(x, graph))
        h = dropout(h, self.dropout, self.training)
        return self.conv2(h, graph)


class GraphSAGE(Module):
    """Hamilton et al.'s GraphSAGE: ``num_layers`` SAGEConv (ReLU and dropout between) -> logits."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 aggr: str = "mean", dropout: float = 0.5, dtype: Any = None, backend: Any = None):
        if num_layers < 1:
            raise ValueError(f"GraphSAGE: num_layers must be >= 1, got {num_layers}")
        self.dropout = float(dropout)
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = [SAGEConv(a, b, aggr=aggr, dtype=dtype, backend=backend) for a, b in zip(sizes, sizes[1:])]

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        h = dropout(sparse_input(x, self.convs[0].lin_l.weight), self.dropout, self.training)
        for k, conv in enumerate(self.convs):
            h = conv(h, graph)
            if k < len(self.convs) - 1:
                h = dropout(h.relu(), self.dropout, self.training)
        return h


class GIN(Module):
    """Xu et al.'s GIN for graph classification: ``num_layers`` GINConv (2-layer MLPs, learnable
    eps), each layer's node states sum-pooled per graph and concatenated, then a linear readout."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int = 3,
                 train_eps: bool = True, dtype: Any = None, backend: Any = None):
        def mlp(a: int, b: int) -> Sequential:
            return Sequential(Linear(a, b, dtype=dtype, backend=backend), ReLU(),
                              Linear(b, b, dtype=dtype, backend=backend), ReLU())
        sizes = [in_channels] + [hidden_channels] * num_layers
        self.convs = [GINConv(mlp(a, b), train_eps=train_eps, dtype=dtype, backend=backend)
                      for a, b in zip(sizes, sizes[1:])]
        self.readout = Linear(hidden_channels * num_layers, out_channels, dtype=dtype, backend=backend)

    def forward(self, x: Tensor, graph: Any, batch: Any, num_graphs: int | None = None) -> Tensor:
        pooled = []
        h = x
        for conv in self.convs:
            h = conv(h, graph)
            pooled.append(global_add_pool(h, batch, num_graphs))
        return self.readout(concat(pooled, axis=1))
