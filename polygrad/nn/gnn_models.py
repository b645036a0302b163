"""Reference models on the graph layers: ``GAT``, ``GraphSAGE`` (node classification) and ``GIN``
(graph classification), the recipes the demos and the ``gat`` benchmark train.
"""
from __future__ import annotations

from typing import Any

from polygrad.tensor.activations import elu
from polygrad.tensor import Tensor, concat

from .convs import GATConv, GINConv, SAGEConv
from .gcn import check_depth, layer_sizes, sparse_input
from .layers import Linear, Sequential, ReLU, dropout
from .module import Module
from .pool import global_add_pool

__all__ = ["GAT", "GraphSAGE", "GIN", "sparse_input"]


class GAT(Module):
    """Veličković et al.'s GAT (PyG's ``examples/gat.py``) with PyG's ``GAT`` signature:
    ``GAT(in_channels, hidden_channels, num_layers, out_channels=None, dropout=0.6, heads=8)``.

    ``hidden_channels`` is each hidden layer's total width, split over ``heads`` concatenated
    heads (it must be divisible by ``heads``), as in PyG.  dropout -> GATConv -> ELU -> dropout
    -> ... -> GATConv(``out_heads`` heads, averaged) -> logits.  Unlike PyG's ``BasicGNN``
    (ReLU, the last layer averaging ``heads`` heads, dropout 0.0), this is the paper's recipe:
    ELU, ``out_heads=1``, input dropout, ``dropout=0.6``.
    """

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int, out_channels: int | None = None,
                 dropout: float = 0.6, *, heads: int = 8, out_heads: int = 1, dtype: Any = None,
                 backend: Any = None):
        num_layers = check_depth("GAT", num_layers)
        if hidden_channels % heads:
            raise ValueError(f"GAT: hidden_channels ({hidden_channels}) must be divisible by heads ({heads}): "
                             "it is the width of the concatenated heads, as in PyG")
        self.dropout = float(dropout)
        sizes = layer_sizes(in_channels, hidden_channels, num_layers, out_channels)
        self.convs = [GATConv(a, b // heads, heads=heads, dropout=dropout, dtype=dtype, backend=backend)
                      for a, b in sizes[:-1]]
        a, b = sizes[-1]
        self.convs.append(GATConv(a, b, heads=out_heads, concat=False, dropout=dropout, dtype=dtype,
                                  backend=backend))

    @property
    def conv1(self) -> GATConv:
        return self.convs[0]

    @property
    def conv2(self) -> GATConv:
        return self.convs[1]

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        h = dropout(sparse_input(x, self.convs[0].source_weight), self.dropout, self.training)
        for k, conv in enumerate(self.convs):
            h = conv(h, graph)
            if k < len(self.convs) - 1:
                h = dropout(elu(h), self.dropout, self.training)
        return h


class GraphSAGE(Module):
    """Hamilton et al.'s GraphSAGE with PyG's ``GraphSAGE`` signature:
    ``GraphSAGE(in_channels, hidden_channels, num_layers, out_channels=None, dropout=0.5)``:
    ``num_layers`` SAGEConv (ReLU and dropout between) -> logits.  Unlike PyG's ``BasicGNN``,
    the input features are dropped out too and ``dropout`` defaults to 0.5 (PyG: 0.0)."""

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int, out_channels: int | None = None,
                 dropout: float = 0.5, *, aggr: str = "mean", dtype: Any = None, backend: Any = None):
        num_layers = check_depth("GraphSAGE", num_layers)
        self.dropout = float(dropout)
        self.convs = [SAGEConv(a, b, aggr=aggr, dtype=dtype, backend=backend)
                      for a, b in layer_sizes(in_channels, hidden_channels, num_layers, out_channels)]

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        h = dropout(sparse_input(x, self.convs[0].lin_l.weight), self.dropout, self.training)
        for k, conv in enumerate(self.convs):
            h = conv(h, graph)
            if k < len(self.convs) - 1:
                h = dropout(h.relu(), self.dropout, self.training)
        return h


class GIN(Module):
    """Xu et al.'s GIN for graph classification, with PyG's ``GIN`` argument order:
    ``GIN(in_channels, hidden_channels, num_layers, out_channels=None)``: ``num_layers`` GINConv
    (2-layer MLPs, learnable eps), each layer's node states sum-pooled per graph and
    concatenated, then a linear readout to ``out_channels`` (``hidden_channels`` when None).
    Unlike PyG's ``GIN`` (node-level, no pooling), ``forward`` takes the ``batch`` vector and
    returns one row per graph."""

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int, out_channels: int | None = None,
                 *, train_eps: bool = True, dtype: Any = None, backend: Any = None):
        num_layers = check_depth("GIN", num_layers)

        def mlp(a: int, b: int) -> Sequential:
            return Sequential(Linear(a, b, dtype=dtype, backend=backend), ReLU(),
                              Linear(b, b, dtype=dtype, backend=backend), ReLU())
        sizes = [in_channels] + [hidden_channels] * num_layers
        self.convs = [GINConv(mlp(a, b), train_eps=train_eps, dtype=dtype, backend=backend)
                      for a, b in zip(sizes, sizes[1:])]
        out = hidden_channels if out_channels is None else out_channels
        self.readout = Linear(hidden_channels * num_layers, out, dtype=dtype, backend=backend)

    def forward(self, x: Tensor, graph: Any, batch: Any, num_graphs: int | None = None) -> Tensor:
        states = []
        h = x
        for conv in self.convs:
            h = conv(h, graph)
            states.append(h)
        # sum pooling is linear and column-wise: pooling the concatenated states once gives the
        # same forward bits as pooling each layer's, with one pooling op instead of num_layers
        return self.readout(global_add_pool(concat(states, axis=1), batch, num_graphs))
