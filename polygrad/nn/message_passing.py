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

PyG's semantics, argument for argument:

* ``message(...)`` builds one message per edge, **in edge_index order**.  Its arguments are
  filled by name from the keyword arguments of ``propagate``: ``x_j`` / ``x_i`` are ``x``'s rows
  at each edge's source / destination (any ``foo_j`` / ``foo_i`` likewise; a pair
  ``x=(x_src, x_dst)`` gives a bipartite graph); any other argument is passed as given, so a
  per-edge tensor computed from ``edge_index`` (PyG's tutorial passes ``norm=``) lines up with
  ``x_j``.  Also available: ``index`` / ``edge_index_i`` (destinations), ``edge_index_j``,
  ``size_i``, ``size_j``, ``dim_size``.
* ``aggregate(messages, index, dim_size)``: "sum", "mean" or "max" of the messages per
  destination (deterministic segment / bincount reductions; empty neighbourhoods give 0).
* ``update(aggregated, ...)``: the node-wise output (identity by default).
* ``flow``: "source_to_target" (default: ``edge_index[0]`` sends to ``edge_index[1]``) or
  "target_to_source".  ``size=(N, M)``: the node counts of ``edge_index``'s rows 0 and 1 (an
  int N means (N, N)); by default read from the node tensors, else the largest index + 1.
* An ``edge_index`` is a multigraph: a repeated edge sends its message once per copy (a mean
  counts every copy, ``edge_weight``s of copies add up), as in PyG.

When ``message`` is not overridden (``x_j``, times a 1-D ``edge_weight`` when given: an
extension of PyG's default) and the aggregation is sum or mean, ``propagate`` is one SpMM over
the graph's de-duplicated pattern with each entry weighted by the sum over its copies: no
per-edge tensor is made, and the gradient (SpMM's transpose, SDDMM for edge weights) is O(nnz).
The graph is a PyG ``edge_index`` ``[2, E]`` or a sparse adjacency tensor whose rows are
destinations (its edges are then in the adjacency's order).  Its structure is cached per layer
by content, and shared by the layers of one forward pass (:mod:`polygrad.nn.graph_cache`):
editing the ``edge_index`` in place is seen.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from polygrad.ir.errors import ShapeError
from polygrad.sparse.graph_ops import REDUCTIONS, scatter, scatter_sum
from polygrad.sparse.pattern import Pattern
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor, spmm, tensor

from .graph_cache import FLOWS, EdgeGraph, GraphCache, self_loop_edge_index
from .module import Module

__all__ = ["MessagePassing", "GraphCache", "EdgeGraph", "self_loop_edge_index"]


def _rows(value: Any) -> int | None:
    return int(value.shape[0]) if isinstance(value, Tensor) else None


class MessagePassing(Module):
    """Base class: override ``message`` / ``aggregate`` / ``update``; call ``propagate``."""

    #: per-edge keyword arguments of ``propagate`` checked to have one row per given edge
    edge_args: tuple[str, ...] = ("edge_weight", "edge_attr")

    def __init__(self, aggr: str = "sum", add_self_loops: bool = False, flow: str = "source_to_target"):
        if aggr == "add":
            aggr = "sum"
        if aggr not in REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: aggr must be one of {REDUCTIONS} (or 'add'), got {aggr!r}")
        if flow not in FLOWS:
            raise ValueError(f"{type(self).__name__}: flow must be one of {FLOWS}, got {flow!r}")
        self.aggr = aggr
        self.flow = flow
        self._self_loops = bool(add_self_loops)
        self._graphs = GraphCache()

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
    def edge_graph(self, graph: Any, size: Any = None) -> EdgeGraph:
        """The cached structure of ``graph`` (``size``: node counts of edge_index rows 0 and 1)."""
        sizes = self._sizes(size)
        return self._graphs.get(graph, (sizes[0], sizes[1]), flow=self.flow, self_loops=self._self_loops,
                                op=type(self).__name__)

    def pattern(self, graph: Any, num_nodes: int) -> tuple[Pattern, np.ndarray]:
        """(de-duplicated destination-major pattern, the first edge of each of its entries)."""
        g = self.edge_graph(graph, num_nodes)
        return g.pattern, g.entry_edge

    def _sizes(self, size: Any) -> list[int | None]:
        if size is None:
            return [None, None]
        if isinstance(size, (int, np.integer)):
            return [int(size), int(size)]
        if isinstance(size, (tuple, list)) and len(size) == 2:
            return [None if s is None else int(s) for s in size]
        raise ShapeError(f"{type(self).__name__}.propagate: size must be N, (N, M) or None, got {size!r}")

    def _set_size(self, sizes: list[int | None], dim: int, value: Any, name: str) -> None:
        rows = _rows(value)
        if rows is None:
            return
        if sizes[dim] is None:
            sizes[dim] = rows
        elif sizes[dim] != rows:
            raise ShapeError(f"{type(self).__name__}: {name} has {rows} rows where edge_index row {dim} "
                             f"addresses {sizes[dim]} nodes")

    def _node_args(self, kwargs: dict) -> list[tuple[str, int]]:
        """(propagate argument, edge_index row it is read at) for every node tensor ``message`` reads."""
        i, j = (1, 0) if self.flow == "source_to_target" else (0, 1)
        if self._fast(kwargs):
            return [("x", j)]
        out = []
        for name in _message_params(self):
            if name.endswith(("_i", "_j")) and name not in kwargs and name[:-2] in kwargs:
                out.append((name[:-2], i if name.endswith("_i") else j))
        return out

    def _fast(self, kwargs: dict) -> bool:
        w = kwargs.get("edge_weight")
        return (type(self).message is MessagePassing.message and self.aggr in ("sum", "mean")
                and "x" in kwargs and kwargs.get("edge_attr") is None
                and (w is None or (isinstance(w, Tensor) and w.ndim == 1)))

    def propagate(self, graph: Any, size: Any = None, **kwargs: Any) -> Tensor:
        """Run message -> aggregate -> update over ``graph`` (PyG's ``propagate``)."""
        sizes = self._sizes(size)
        i, j = (1, 0) if self.flow == "source_to_target" else (0, 1)
        for name, dim in self._node_args(kwargs):
            data = kwargs[name]
            if isinstance(data, (tuple, list)):
                if len(data) != 2:
                    raise ShapeError(f"{type(self).__name__}: {name} must be a tensor or a pair "
                                     f"(source, destination), got {len(data)} items")
                self._set_size(sizes, 0, data[0], f"{name}[0]")
                self._set_size(sizes, 1, data[1], f"{name}[1]")
            else:
                self._set_size(sizes, dim, data, name)
        if sizes[i] is None and sizes[j] is not None:
            sizes[i] = sizes[j]       # PyG: size_i defaults to size_j (and back)
        elif sizes[j] is None and sizes[i] is not None:
            sizes[j] = sizes[i]
        g = self._graphs.get(graph, (sizes[0], sizes[1]), flow=self.flow, self_loops=self._self_loops,
                             op=type(self).__name__)
        for name in self.edge_args:
            if kwargs.get(name) is not None:
                kwargs[name] = self._edge_tensor(name, kwargs[name], g)
        if self._fast(kwargs):
            out = self._spmm(self._pick(kwargs["x"], j, "x"), g, kwargs.get("edge_weight"))
        else:
            messages = self.message(**self._collect(g, kwargs, i, j))
            out = self.aggregate(messages, g.dst, g.num_dst)
        return self.update(out, **kwargs)

    @staticmethod
    def _pick(data: Any, dim: int, name: str) -> Any:
        if isinstance(data, (tuple, list)):
            data = data[dim]
            if data is None:
                raise ShapeError(f"message passing: {name}[{dim}] is None but the message reads it")
        return data.to_dense() if is_sparse(data) else data

    def _edge_tensor(self, name: str, value: Any, g: EdgeGraph) -> Tensor:
        if not isinstance(value, Tensor):
            value = tensor(np.asarray(value))
        if value.ndim < 1 or value.shape[0] != g.given_edges:
            raise ShapeError(f"{type(self).__name__}: {name} of shape {value.shape} needs one row per edge "
                             f"({g.given_edges}, in edge_index order or the adjacency's order)")
        if g.kept is not None:
            raise ShapeError(f"{type(self).__name__}: {name} cannot follow the self loops this layer adds "
                             "(add them to edge_index and edge data yourself, with add_self_loops=False)")
        return value

    def _spmm(self, x: Tensor, g: EdgeGraph, edge_weight: Tensor | None) -> Tensor:
        if x.shape[0] != g.num_src:
            raise ShapeError(f"{type(self).__name__}: x has {x.shape[0]} rows for a graph of {g.num_src} source nodes")
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype("float64")
        mean = self.aggr == "mean"
        if edge_weight is None:
            weights = _constant(g, "weights", mean, dtype, x.backend)
        else:
            # an entry's weight is the sum of its copies' weights (PyG sums their messages)
            weights = scatter_sum(edge_weight, g.slot, g.pattern.nnz) if g.duplicates else edge_weight[g.entry_edge]
            if mean:
                weights = weights * _constant(g, "inverse_degree", True, weights.dtype, x.backend)
        return spmm(weights, x, g.pattern)

    def _collect(self, g: EdgeGraph, kwargs: dict, i: int, j: int) -> dict:
        params = _message_params(self)
        special = {"index": g.dst, "edge_index_i": g.dst, "edge_index_j": g.src, "size_i": g.num_dst,
                   "size_j": g.num_src, "dim_size": g.num_dst, "ptr": None}
        args: dict[str, Any] = {}
        for name in params:
            if name in kwargs:
                args[name] = kwargs[name]
            elif name in special:
                args[name] = special[name]
            elif name.endswith(("_i", "_j")) and name[:-2] in kwargs:
                side = i if name.endswith("_i") else j
                node = self._pick(kwargs[name[:-2]], side, name[:-2])
                args[name] = node[g.dst if name.endswith("_i") else g.src]
            elif params[name].default is inspect.Parameter.empty:
                raise TypeError(f"{type(self).__name__}.message needs {name!r}, which propagate() was not given")
        return args


def _message_params(layer: MessagePassing) -> Mapping[str, inspect.Parameter]:
    """``message``'s parameters, read once per class (``inspect.signature`` costs ~10 us a call);
    a ``message`` set on the instance itself is read every time."""
    if "message" in vars(layer):
        return inspect.signature(layer.message).parameters
    cls = type(layer)
    params = _MESSAGE_PARAMS.get(cls)
    if params is None:
        params = _MESSAGE_PARAMS[cls] = inspect.signature(layer.message).parameters
    return params


_MESSAGE_PARAMS: dict[type, Mapping[str, inspect.Parameter]] = {}


def _constant(g: EdgeGraph, kind: str, mean: bool, dtype: Any, backend: Any) -> Tensor:
    """Per-entry constants of a graph, made once per graph, dtype and backend (not per call):
    "weights" -- an entry's multiplicity, over its destination's in-degree for a mean;
    "inverse_degree" -- 1 / in-degree of the entry's destination (copies counted)."""
    def make(graph: EdgeGraph) -> Tensor:
        inv = 1.0 / np.maximum(graph.in_degree, 1.0)
        rows = graph.pattern.rows
        if kind == "weights":
            w = graph.multiplicity * inv[rows] if mean else graph.multiplicity
        else:
            w = inv[rows]
        return tensor(np.asarray(w, dtype=dtype), backend=backend)

    return g.derived((kind, mean, np.dtype(dtype).str, str(backend)), make)
