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
from polygrad.dispatch import note_host_read
from polygrad.errors import ShapeError
from polygrad.tensor import Tensor

from . import init as _init
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


def _fingerprint(graph: Any) -> tuple:
    """What the adjacency is computed from, as host views (compared with np.array_equal on each
    call; :func:`_owned` copies it only when a new adjacency is cached)."""
    if is_sparse(graph):
        p = graph.pattern
        values = graph.values
        note_host_read(values)  # a compiled step guards what its cached adjacency came from
        return ("sparse", tuple(graph.shape), np.asarray(p.indptr), np.asarray(p.cols),
                np.asarray(values._be.to_numpy(values._data)))
    if isinstance(graph, Tensor):
        note_host_read(graph)
    data = graph._be.to_numpy(graph._data) if isinstance(graph, Tensor) else np.asarray(graph)
    return ("edge_index", np.asarray(data))


def _owned(fingerprint: tuple) -> tuple:
    """A fingerprint whose arrays are copies: the user's later in-place edits cannot reach it."""
    return tuple(np.array(x) if isinstance(x, np.ndarray) else x for x in fingerprint)


def _same_fingerprint(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        (np.array_equal(x, y, equal_nan=x.dtype.kind == "f" and y.dtype.kind == "f") and x.dtype == y.dtype)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) else x == y
        for x, y in zip(a, b))


def _edge_index_array(graph: Any) -> np.ndarray:
    ei = graph.numpy() if isinstance(graph, Tensor) else np.asarray(graph)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise ShapeError(f"GCNConv: edge_index must be an integer array of shape [2, E], got "
                         f"{ei.dtype} {ei.shape}")
    return ei.astype(np.int64, copy=False)


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

    def adjacency(self, graph: Any, num_nodes: int) -> Any:
        """The (normalised, cached) sparse propagation matrix for ``graph`` on ``num_nodes`` nodes."""
        key = (num_nodes, self.weight.backend, self.weight.dtype)
        fingerprint = _fingerprint(graph) if self.cached else None
        if (fingerprint is not None and self._cache is not None and self._cache_key[1] == key
                and _same_fingerprint(self._cache_key[0], fingerprint)):
            return self._cache
        if is_sparse(graph):
            adj = graph
            if adj.shape != (num_nodes, num_nodes):
                raise ShapeError(f"GCNConv: adjacency of shape {adj.shape} does not fit {num_nodes} nodes")
        else:
            ei = _edge_index_array(graph)
            if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
                raise ShapeError(f"GCNConv: edge_index refers to nodes outside [0, {num_nodes})")
            adj = _require("from_edge_index")(ei, num_nodes=num_nodes, dtype=self.weight.dtype,
                                              backend=self.weight.backend)
        if self.normalize:
            gcn_norm = _require("gcn_norm")
            adj = gcn_norm(adj) if self.add_self_loops else gcn_norm(adj, add_self_loops=False)
        if adj.dtype != self.weight.dtype:
            adj = adj.cast(self.weight.dtype)
        # an adjacency whose values carry gradient is rebuilt every call (a cached one would be
        # backpropagated through twice)
        if fingerprint is not None and not getattr(adj, "requires_grad", False):
            pg.materialize(adj)  # a lazy backend computes it once, not in every epoch's graph
            self._cache_key, self._cache = (_owned(fingerprint), key), adj
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

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        return self.propagate(x, self.adjacency(graph, x.shape[0]))

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, cached={self.cached}"


class GCN(Module):
    """Kipf & Welling's two-layer GCN for node classification.

    dropout(x) -> GCNConv -> ReLU -> dropout -> GCNConv -> logits.  Dropout on the input features
    (sparse dropout: only stored values are dropped) is what the reference implementation does;
    set ``input_dropout=False`` for PyG's example variant.  Both layers share one cached
    normalised adjacency.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.5,
                 input_dropout: bool = True, bias: bool = True, dtype: Any = None, backend: Any = None):
        self.dropout = float(dropout)
        self.input_dropout = bool(input_dropout)
        self.conv1 = GCNConv(in_channels, hidden_channels, bias=bias, dtype=dtype, backend=backend)
        self.conv2 = GCNConv(hidden_channels, out_channels, bias=bias, dtype=dtype, backend=backend)

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        adj = self.conv1.adjacency(graph, x.shape[0])
        x = sparse_input(x, self.conv1.weight)  # asked *before* dropout (see sparse_input)
        if self.input_dropout:
            x = dropout(x, self.dropout, self.training)
        h = self.conv1.propagate(x, adj).relu()
        h = dropout(h, self.dropout, self.training)
        return self.conv2.propagate(h, adj)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, input_dropout={self.input_dropout}"
