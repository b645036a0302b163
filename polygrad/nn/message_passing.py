"""``MessagePassing``: the base class of graph layers (PyG's API, run as SpMM / segment ops).

A layer defines up to three methods and calls :meth:`MessagePassing.propagate`::

    class MeanConv(nn.MessagePassing):                 # out_i = W · mean_j x_j + b
        def __init__(self, fin, fout):
            super().__init__(aggr="mean")
            self.lin = nn.Linear(fin, fout)

        def forward(self, x, edge_index):
            return self.lin(self.propagate(edge_index, x=x))

    class EdgeGatedConv(nn.MessagePassing):            # a message that needs both ends of an edge
        def message(self, x_i, x_j):
            return x_j * (x_i * x_j).sum(-1, keepdims=True).sigmoid()

* ``message(...)`` builds one message per edge.  Its arguments are filled by name from the
  keyword arguments of ``propagate``: ``x_j`` / ``x_i`` are ``x``'s rows at each edge's source /
  destination (any ``foo_j`` / ``foo_i`` likewise), ``index`` is the destinations, per-edge
  tensors named in ``edge_args`` (``edge_weight``, ``edge_attr``) come in edge order.
* ``aggregate(messages, index, dim_size)``: "sum", "mean" or "max" of the messages per
  destination (deterministic segment / bincount reductions; empty neighbourhoods give 0).
* ``update(aggregated, ...)``: the node-wise output (identity by default).

When ``message`` is not overridden (``x_j``, optionally times ``edge_weight``) and the
aggregation is sum or mean, ``propagate`` is one SpMM over the cached adjacency pattern: no
per-edge tensor is ever made, and the gradient (SpMM's transpose, SDDMM for edge weights) is
O(nnz).  The graph is a PyG ``edge_index`` ``[2, E]`` (source row 0, destination row 1), or a sparse
adjacency tensor whose rows are destinations.  The pattern built from it is cached per graph
object (like ``GCNConv(cached=True)``); repeated edges count once.
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from polygrad.errors import ShapeError
from polygrad.graph_ops import REDUCTIONS, graph_pattern, scatter
from polygrad.pattern import Pattern
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor, spmm, tensor

from .module import Module

__all__ = ["MessagePassing", "GraphCache", "self_loop_edge_index"]


def self_loop_edge_index(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """``edge_index`` without its self loops, plus one self loop per node (PyG's GAT convention)."""
    keep = edge_index[0] != edge_index[1]
    loops = np.arange(num_nodes, dtype=np.int64)
    return np.concatenate([edge_index[:, keep], np.stack([loops, loops])], axis=1)


class GraphCache:
    """The destination-major :class:`Pattern` of a graph (and its edge order), cached per object.

    Keyed by the identity of the graph object (kept alive while cached) and the node count, so
    passing another graph rebuilds it instead of reusing a stale one.
    """

    def __init__(self, self_loops: bool = False):
        self.self_loops = self_loops
        self._key: Any = None
        self._value: tuple[Pattern, np.ndarray | None] | None = None
        self.num_edges = 0  # edges of the cached graph as given (per-edge data must have as many rows)

    def get(self, graph: Any, num_nodes: int) -> tuple[Pattern, np.ndarray | None]:
        """(pattern, order): ``order`` maps edge-indexed data to pattern order (None for a sparse graph)."""
        if self._value is not None and self._key[0] is graph and self._key[1] == num_nodes:
            return self._value
        if isinstance(graph, Pattern):
            value: tuple[Pattern, np.ndarray | None] = (graph, None)
        elif is_sparse(graph):
            if graph.shape[0] != num_nodes:
                raise ShapeError(f"message passing: adjacency of shape {graph.shape} does not fit {num_nodes} nodes")
            pattern = graph.pattern
            if self.self_loops:
                ei = np.stack([pattern.cols, pattern.rows])
                pattern, _ = graph_pattern(self_loop_edge_index(ei, num_nodes), num_nodes)
            value = (pattern, None)
        else:
            ei = graph.numpy() if isinstance(graph, Tensor) else np.asarray(graph)
            if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
                raise ShapeError(f"message passing: edge_index must be an integer array [2, E], "
                                 f"got {ei.dtype} {ei.shape}")
            ei = ei.astype(np.int64, copy=False)
            if self.self_loops:
                if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
                    raise ShapeError(f"message passing: edge_index refers to nodes outside [0, {num_nodes})")
                pattern, _ = graph_pattern(self_loop_edge_index(ei, num_nodes), num_nodes)
                value = (pattern, None)  # edge data cannot follow added loops
            else:
                value = graph_pattern(ei, num_nodes)
        self._key, self._value = (graph, num_nodes), value
        self.num_edges = value[0].nnz if is_sparse(graph) or isinstance(graph, Pattern) else int(ei.shape[1])
        return value


class MessagePassing(Module):
    """Base class: override ``message`` / ``aggregate`` / ``update``; call ``propagate``."""

    #: per-edge keyword arguments of ``propagate`` (given in edge_index order; reordered for message)
    edge_args: tuple[str, ...] = ("edge_weight", "edge_attr")

    def __init__(self, aggr: str = "sum", add_self_loops: bool = False):
        if aggr == "add":
            aggr = "sum"
        if aggr not in REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: aggr must be one of {REDUCTIONS} (or 'add'), got {aggr!r}")
        self.aggr = aggr
        self._graphs = GraphCache(self_loops=add_self_loops)

    # -- the three overridable steps ----------------------------------------------------------------
    def message(self, x_j: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        """One message per edge: the source's features, scaled by ``edge_weight`` when given."""
        if edge_weight is None:
            return x_j
        return x_j * edge_weight.reshape((edge_weight.shape[0],) + (1,) * (x_j.ndim - 1))

    def aggregate(self, messages: Tensor, index: np.ndarray, dim_size: int) -> Tensor:
        """Reduce the messages per destination ``index`` with ``self.aggr``."""
        return scatter(messages, index, dim_size, self.aggr)

    def update(self, aggregated: Tensor, **kwargs: Any) -> Tensor:
        return aggregated

    # -- the engine ---------------------------------------------------------------------------------
    def pattern(self, graph: Any, num_nodes: int) -> tuple[Pattern, np.ndarray | None]:
        """The cached (destination-major pattern, edge order) of ``graph``."""
        return self._graphs.get(graph, num_nodes)

    def _fast(self, kwargs: dict) -> bool:
        return (type(self).message is MessagePassing.message and self.aggr in ("sum", "mean")
                and "x" in kwargs and kwargs.get("edge_attr") is None)

    def propagate(self, graph: Any, size: int | None = None, **kwargs: Any) -> Tensor:
        """Run message -> aggregate -> update over ``graph``; ``size`` = node count (default x's rows)."""
        x: Any = kwargs.get("x")  # node features: a Tensor for the built-in message()
        if size is None:
            if not isinstance(x, Tensor):
                raise ShapeError(f"{type(self).__name__}.propagate: pass x=... or size=N (the node count)")
            size = x.shape[0]
        pattern, order = self.pattern(graph, size)
        if isinstance(x, Tensor) and x.shape[0] != pattern.shape[1]:
            raise ShapeError(f"{type(self).__name__}: x has {x.shape[0]} rows for a graph of {pattern.shape[1]} nodes")
        edge = {k: self._edge_tensor(k, kwargs[k], pattern, order) for k in self.edge_args
                if kwargs.get(k) is not None}
        if self._fast(kwargs):
            out = self._spmm(x, pattern, edge.get("edge_weight"))
        else:
            out = self.aggregate(self.message(**self._collect(pattern, kwargs, edge)), pattern.rows, pattern.shape[0])
        return self.update(out, **kwargs)

    def _edge_tensor(self, name: str, value: Any, pattern: Pattern, order: np.ndarray | None) -> Tensor:
        if not isinstance(value, Tensor):
            value = tensor(np.asarray(value))
        n_edges = pattern.nnz if order is None else self._graphs.num_edges
        if value.ndim < 1 or value.shape[0] != n_edges:
            where = "in the adjacency's order" if order is None else "in edge_index order"
            raise ShapeError(f"{type(self).__name__}: {name} of shape {value.shape} needs one row per edge "
                             f"({n_edges}, {where})")
        return value if order is None else value[order]

    def _spmm(self, x: Tensor, pattern: Pattern, edge_weight: Tensor | None) -> Tensor:
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype("float64")
        if edge_weight is None:
            weights = _edge_weights(pattern, self.aggr == "mean", dtype, x.backend)
        else:
            weights = edge_weight
            if self.aggr == "mean":
                weights = weights * _edge_weights(pattern, True, dtype, x.backend)
        if is_sparse(x):
            x = x.to_dense()  # sparse @ sparse features: propagate after the linear map instead (SAGEConv does)
        return spmm(weights, x, pattern)

    def _collect(self, pattern: Pattern, kwargs: dict, edge: dict) -> dict:
        params = inspect.signature(self.message).parameters
        args: dict[str, Any] = {}
        for name in params:
            if name in edge:
                args[name] = edge[name]
            elif name == "index":
                args[name] = pattern.rows
            elif name in kwargs:
                args[name] = kwargs[name]
            elif name.endswith(("_i", "_j")) and name[:-2] in kwargs:
                node = kwargs[name[:-2]]
                if is_sparse(node):
                    node = node.to_dense()
                args[name] = node[pattern.rows if name.endswith("_i") else pattern.cols]
            elif params[name].default is inspect.Parameter.empty:
                raise TypeError(f"{type(self).__name__}.message needs {name!r}, which propagate() was not given")
        return args


def _edge_weights(pattern: Pattern, mean: bool, dtype: Any, backend: Any) -> Tensor:
    """Per-edge weights of an unweighted aggregation: 1 / in-degree of the edge's row for a mean,
    else ones; a constant of the graph, made once per pattern, dtype and backend (not per call)."""
    def make(p: Pattern) -> Tensor:
        w = (1.0 / np.maximum(np.diff(p.indptr), 1))[p.rows] if mean else np.ones(p.nnz)
        return tensor(w.astype(dtype), backend=backend)

    return pattern.derived(("message_passing.weights", mean, np.dtype(dtype).str, str(backend)), make)
