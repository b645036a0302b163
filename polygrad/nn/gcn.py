"""Graph convolution (Kipf & Welling 2017): ``GCNConv`` and the two-layer ``GCN`` model.

``H' = D^-1/2 (A + I) D^-1/2 (H W) + b``: the features are transformed first (``H W``, an SpMM
when ``H`` is the sparse bag-of-words input) and then propagated over the normalised adjacency
(another SpMM), so nothing ``N x N`` or ``N x F_in`` is ever made dense.  The normalised
adjacency is computed once per graph and cached (``cached=True``), keyed by the graph's
*content* (a copy of the ``edge_index``, or of a sparse adjacency's pattern and values, compared
on every call in O(E)), so passing a different graph -- or editing the same ``edge_index``
array in place -- recomputes it instead of silently reusing a stale one (PyG's ``cached=True``
would).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

import polygrad as pg
from polygrad.engine.dispatch import note_host_read
from polygrad.ir.errors import ShapeError
from polygrad.sparse.graph import edge_index_array
from polygrad.tensor import Tensor

from . import init as _init
from .graph_cache import fingerprint, owned, same_fingerprint
from .layers import dropout
from .module import Module

__all__ = ["GCNConv", "GCN", "csr_to_tensor", "sparse_input"]


is_sparse = pg.is_sparse


def sparse_input(x: Any, weight: Tensor) -> Any:
    """``x`` as CSR when the layout policy says so (a bag-of-words input such as Cora's, 1.3%
    dense), decided once per storage and cached: dropout then touches only its nonzeros and
    ``x @ W`` runs as an SpMM every epoch, instead of a fresh dense matrix being re-examined."""
    if is_sparse(x):
        return x
    sparse_x = pg.maybe_sparsify_for_matmul(x, weight)
    return x if sparse_x is None else sparse_x


def _require(name: str) -> Callable[..., Any]:
    fn = getattr(pg, name, None)
    if fn is None:
        raise pg.errors.BackendError(f"GCNConv needs pg.{name} from polygrad.sparse, which this polygrad "
                                     "build does not provide")
    return fn


def csr_to_tensor(csr: Any, backend: Any = None, dtype: Any = None) -> Tensor:
    """A :class:`polygrad.data.CSRMatrix` (e.g. Planetoid features) as a polygrad sparse CSR tensor."""
    values = csr.data if dtype is None else csr.data.astype(dtype)
    return _require("sparse_csr")(csr.indptr, csr.indices, values, csr.shape, backend=backend)


def _host(t: Any) -> np.ndarray:
    if isinstance(t, Tensor):
        note_host_read(t)
        return np.asarray(t._be.to_numpy(t._data))
    return np.asarray(t)


def _edge_weight_tensor(edge_weight: Any, num_edges: int, dtype: Any, backend: Any) -> Tensor:
    w = edge_weight if isinstance(edge_weight, Tensor) else pg.tensor(np.asarray(edge_weight), dtype=dtype,
                                                                      backend=backend)
    if w.ndim != 1 or w.shape[0] != num_edges:
        raise ShapeError(f"GCNConv: edge_weight of shape {w.shape} must be [{num_edges}] (one weight per "
                         "edge of edge_index, in its order)")
    return w


def _self_looped(src: np.ndarray, dst: np.ndarray, weight: Tensor | None, num_nodes: int, fill: float,
                 dtype: Any, backend: Any) -> tuple[np.ndarray, np.ndarray, Tensor]:
    """PyG's ``add_remaining_self_loops``: every self loop of the input is dropped and one loop per
    node added, weighted ``fill`` -- or, for a node that had a loop, that loop's weight (the last
    copy's, where PyG's scatter assignment leaves the last)."""
    kept = np.flatnonzero(src != dst)
    loops = np.arange(num_nodes, dtype=np.int64)
    e = src.shape[0]
    last_loop = np.full(num_nodes, -1, dtype=np.int64)
    at_loop = np.flatnonzero(src == dst)
    np.maximum.at(last_loop, src[at_loop], at_loop)
    rows, cols = np.concatenate([dst[kept], loops]), np.concatenate([src[kept], loops])
    if weight is None:
        values = pg.tensor(np.ones(kept.shape[0] + num_nodes), dtype=dtype, backend=backend)
        return rows, cols, values
    fill_t = pg.tensor(np.full(1, fill), dtype=weight.dtype, backend=weight.backend)
    extended = pg.concat([weight, fill_t], axis=0)
    loop_values = extended[np.where(last_loop >= 0, last_loop, e)]
    return rows, cols, pg.concat([weight[kept], loop_values], axis=0)


class GCNConv(Module):
    """One graph-convolution layer: ``out = Â (x W) + b`` with ``Â = D^-1/2 (A + I) D^-1/2``.

    ``graph`` is a PyG-style ``edge_index`` (int ``[2, E]``, numpy or tensor) or a sparse
    adjacency tensor.  ``normalize=False`` uses the given adjacency as is (already normalised);
    ``add_self_loops=False`` normalises ``A`` without adding ``I``.  Weights use Glorot init
    (as Kipf & Welling's reference code).
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, cached: bool = True,
                 normalize: bool = True, add_self_loops: bool = True,
                 init: "str | Callable[..., Any]" = "glorot", dtype: Any = None, backend: Any = None):
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.cached = bool(cached)
        self.normalize = bool(normalize)
        self.add_self_loops = bool(add_self_loops)
        self.weight = _init.make(init, (self.in_channels, self.out_channels), dtype, backend)
        self.bias = _init.zeros((self.out_channels,), dtype, backend) if bias else None
        self._cache_key: Any = None      # (fingerprint of the graph's content, num_nodes/backend/dtype)
        self._cache: Any = None

    def adjacency(self, graph: Any, num_nodes: int, edge_weight: Any = None) -> Any:
        """The (normalised, cached) sparse propagation matrix for ``graph`` on ``num_nodes`` nodes.

        Rows are destinations: ``out_i = sum over edges j -> i`` (PyG's ``source_to_target``), so
        a directed graph propagates as in PyG.  A repeated edge counts once per copy (its degree
        and its weights add up, as PyG's ``gcn_norm``)."""
        key = (num_nodes, self.weight.backend, self.weight.dtype)
        grad_weight = isinstance(edge_weight, Tensor) and edge_weight.requires_grad
        fp = None
        if self.cached and not grad_weight:
            fp = fingerprint(graph) + (("edge_weight", _host(edge_weight)) if edge_weight is not None else ())
        if (fp is not None and self._cache is not None and self._cache_key[1] == key
                and same_fingerprint(self._cache_key[0], fp)):
            return self._cache
        dtype, backend = self.weight.dtype, self.weight.backend
        if is_sparse(graph):
            adj = graph
            if adj.shape != (num_nodes, num_nodes):
                raise ShapeError(f"GCNConv: adjacency of shape {adj.shape} does not fit {num_nodes} nodes")
            if edge_weight is not None:
                raise ShapeError("GCNConv: edge_weight goes with an edge_index; a sparse adjacency carries "
                                 "its weights as its values")
            if self.normalize:
                gcn_norm = _require("gcn_norm")
                adj = gcn_norm(adj) if self.add_self_loops else gcn_norm(adj, add_self_loops=False)
        else:
            ei = edge_index_array("GCNConv", graph, num_nodes, num_nodes)
            src, dst = ei[0], ei[1]
            w = None if edge_weight is None else _edge_weight_tensor(edge_weight, ei.shape[1], dtype, backend)
            values: Tensor | None
            if self.normalize and self.add_self_loops:
                rows, cols, values = _self_looped(src, dst, w, num_nodes, 1.0, dtype, backend)
            else:
                rows, cols, values = dst, src, w
            adj = _require("from_edge_index")(np.stack([rows, cols]), num_nodes=num_nodes, values=values,
                                              dtype=dtype, backend=backend)
            if self.normalize:
                adj = _require("gcn_norm")(adj, add_self_loops=False)
        if adj.dtype != self.weight.dtype:
            adj = adj.cast(self.weight.dtype)
        # an adjacency whose values carry gradient is rebuilt every call (a cached one would be
        # backpropagated through twice)
        if fp is not None and not getattr(adj, "requires_grad", False):
            pg.materialize(adj)  # a lazy backend computes it once, not in every epoch's graph
            self._cache_key, self._cache = (owned(fp), key), adj
        return adj

    def _move_tensors(self, be: Any) -> None:
        super()._move_tensors(be)
        if self._cache_key is not None:  # the cached adjacency moved with the weights: keep using it
            graph, (num_nodes, _, dtype) = self._cache_key
            self._cache_key = (graph, (num_nodes, be.name, dtype))

    def propagate(self, x: Tensor, adj: Any) -> Tensor:
        """``adj @ (x @ W) + b`` for an already normalised ``adj``."""
        if x.ndim != 2 or x.shape[1] != self.in_channels:
            raise ShapeError(f"GCNConv({self.in_channels} -> {self.out_channels}): node features of "
                             f"shape {x.shape} ({getattr(x, 'layout', 'dense')}) must be [N, {self.in_channels}]")
        out = adj @ (x @ self.weight)
        return out + self.bias if self.bias is not None else out

    def forward(self, x: Tensor, graph: Any, edge_weight: Any = None) -> Tensor:
        """``edge_weight`` [E]: one weight per edge of an ``edge_index`` graph (PyG's argument)."""
        return self.propagate(x, self.adjacency(graph, x.shape[0], edge_weight))

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, cached={self.cached}"


def check_depth(model: str, num_layers: Any) -> int:
    """``num_layers`` as an int >= 1, or a ValueError that says what the argument means (PyG's)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 1:
        raise ValueError(f"{model}: num_layers (the third argument, as in PyG's "
                         f"{model}(in_channels, hidden_channels, num_layers, out_channels)) must be an int "
                         f">= 1, got {num_layers!r}")
    return int(num_layers)


def layer_sizes(in_channels: int, hidden_channels: int, num_layers: int,
                out_channels: int | None) -> list[tuple[int, int]]:
    """PyG's ``BasicGNN`` widths: ``num_layers`` layers in -> hidden -> ... -> out (or hidden)."""
    widths = [in_channels] + [hidden_channels] * (num_layers - 1)
    widths.append(hidden_channels if out_channels is None else out_channels)
    return list(zip(widths, widths[1:]))


class GCN(Module):
    """Kipf & Welling's GCN for node classification, with PyG's ``GCN`` signature:
    ``GCN(in_channels, hidden_channels, num_layers, out_channels=None, dropout=0.5)`` builds
    ``num_layers`` GCNConv layers ``in -> hidden -> ... -> out_channels`` (``hidden`` when None).

    dropout(x) -> GCNConv -> ReLU -> dropout -> ... -> GCNConv -> logits.  Dropout on the input
    features (sparse dropout: only stored values are dropped) is what the reference
    implementation does; set ``input_dropout=False`` for PyG's variant.  Unlike PyG, ``dropout``
    defaults to the paper's 0.5 (PyG's ``BasicGNN``: 0.0).  All layers share one cached
    normalised adjacency.  ``conv1`` / ``conv2`` name the first and second layer.
    """

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int, out_channels: int | None = None,
                 dropout: float = 0.5, *, input_dropout: bool = True, bias: bool = True, dtype: Any = None,
                 backend: Any = None):
        num_layers = check_depth("GCN", num_layers)
        self.dropout = float(dropout)
        self.input_dropout = bool(input_dropout)
        self.convs = [GCNConv(a, b, bias=bias, dtype=dtype, backend=backend)
                      for a, b in layer_sizes(in_channels, hidden_channels, num_layers, out_channels)]

    @property
    def conv1(self) -> GCNConv:
        return self.convs[0]

    @property
    def conv2(self) -> GCNConv:
        return self.convs[1]

    def forward(self, x: Tensor, graph: Any, edge_weight: Any = None) -> Tensor:
        first = self.convs[0]
        adj = first.adjacency(graph, x.shape[0], edge_weight)
        h = sparse_input(x, first.weight)  # asked *before* dropout (see sparse_input)
        if self.input_dropout:
            h = dropout(h, self.dropout, self.training)
        for k, conv in enumerate(self.convs):
            h = conv.propagate(h, adj)
            if k < len(self.convs) - 1:
                h = dropout(h.relu(), self.dropout, self.training)
        return h

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, input_dropout={self.input_dropout}"
