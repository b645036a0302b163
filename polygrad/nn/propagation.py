"""Propagation layers over a normalised adjacency, PyG's signatures: ``SGConv``, ``APPNP``, ``ChebConv``.

Each normalises the graph as PyG does (``gcn_norm``: remaining self loops, symmetric degree
normalisation; ChebConv: the scaled Laplacian of ``get_laplacian``), with the edge weights as
polygrad tensors, so the gradient reaches a given ``edge_weight`` through the degrees too.  The
index work (which edges, which self loops) depends on the graph only: it is cached per graph
*content* (a copy of ``edge_index`` compared on each call, O(E)), and the normalised graph is
the same array object on every call, so :class:`MessagePassing` reuses its pattern; the
propagation itself is one SpMM per hop.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad.ir.errors import ShapeError
from polygrad.sparse.graph_ops import scatter_sum
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor, concat, index_add, tensor, where

from . import init as _init
from .layers import Linear, dropout
from .message_passing import MessagePassing

__all__ = ["SGConv", "APPNP", "ChebConv", "gcn_norm", "scaled_laplacian"]


class StructureCache:
    """Index arrays derived from an ``edge_index``, rebuilt only when its content or the node
    count changes (the derived arrays are then the same objects, call after call)."""

    def __init__(self) -> None:
        self._key: tuple[np.ndarray, int, Any] | None = None
        self._value: Any = None

    def get(self, edge_index: np.ndarray, num_nodes: int, tag: Any, build: Callable[[], Any]) -> Any:
        key = self._key
        if (key is not None and key[1] == num_nodes and key[2] == tag and key[0].shape == edge_index.shape
                and np.array_equal(key[0], edge_index)):
            return self._value
        self._value = build()
        self._key = (np.array(edge_index), num_nodes, tag)
        return self._value


def _edge_index(layer: str, edge_index: Any, num_nodes: int) -> np.ndarray:
    ei = edge_index.numpy() if isinstance(edge_index, Tensor) else np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise ShapeError(f"{layer}: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise ShapeError(f"{layer}: edge_index refers to nodes outside [0, {num_nodes})")
    return ei.astype(np.int64, copy=False)


def _edge_weight(layer: str, edge_weight: Any, num_edges: int, like: Tensor) -> Tensor:
    """The given weights as a floating tensor ``[E]`` (ones when None)."""
    if edge_weight is None:
        return tensor(np.ones(num_edges, dtype=like.dtype), backend=like._be)
    if not isinstance(edge_weight, Tensor):
        edge_weight = tensor(np.asarray(edge_weight, dtype=like.dtype), backend=like._be)
    if edge_weight.shape != (num_edges,):
        raise ShapeError(f"{layer}: edge_weight of shape {edge_weight.shape} must be [{num_edges}] (one per edge)")
    return edge_weight if edge_weight.dtype.kind == "f" else edge_weight.cast(like.dtype)


def _inv_pow(deg: Tensor, power: float) -> Tensor:
    """``deg ** power`` with 0 where ``deg == 0`` (PyG's ``masked_fill(inf, 0)``), without the
    infinite gradient a plain power would send back through the masked entries."""
    zero = deg == 0
    return where(zero, 0.0, where(zero, 1.0, deg) ** power)


def _remaining_loops(ei: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(edge_index with one self loop per node, kept non-loop edges, nodes that had a loop, the
    edge each of those loops came from): PyG's ``add_remaining_self_loops`` index work."""
    keep = np.flatnonzero(ei[0] != ei[1])
    loops = np.flatnonzero(ei[0] == ei[1])
    nodes = np.arange(num_nodes, dtype=np.int64)
    out = np.concatenate([ei[:, keep], np.stack([nodes, nodes])], axis=1)
    out.flags.writeable = False
    return out, keep, ei[0, loops], loops


def _frozen(edge_index: np.ndarray) -> np.ndarray:
    """A read-only copy: one array object per graph content, so MessagePassing's pattern cache hits."""
    out = np.array(edge_index)
    out.flags.writeable = False
    return out


def gcn_norm(edge_index: np.ndarray, edge_weight: Tensor, num_nodes: int, add_self_loops: bool,
             structure: StructureCache) -> tuple[np.ndarray, Tensor]:
    """PyG's ``gcn_norm`` (``improved=False``, flow source -> target): ``(edge_index, weights)`` with
    weights ``d_src^-1/2 · w · d_dst^-1/2``, ``d`` the weighted in-degree (self loops included).

    ``add_self_loops``: every existing self loop is replaced by one per node, weighted as the
    existing loop was (1 for a node without one), as ``add_remaining_self_loops``.
    """
    if add_self_loops:
        ei, keep, loop_nodes, loop_edges = structure.get(
            edge_index, num_nodes, "gcn_norm", lambda: _remaining_loops(edge_index, num_nodes))
        fill = np.ones(num_nodes, dtype=edge_weight.dtype)
        fill[loop_nodes] = 0.0
        loop_w = tensor(fill, backend=edge_weight._be)
        if loop_edges.size:
            loop_w = loop_w + index_add(edge_weight[loop_edges], (loop_nodes,), (num_nodes,))
        weight = concat([edge_weight[keep], loop_w]) if keep.size else loop_w
    else:
        ei, weight = structure.get(edge_index, num_nodes, "plain", lambda: _frozen(edge_index)), edge_weight
    deg = scatter_sum(weight, ei[1], num_nodes)
    dinv = _inv_pow(deg, -0.5)
    return ei, dinv[ei[0]] * weight * dinv[ei[1]]


def _check_x(layer: str, x: Any, channels: int | None = None) -> Tensor:
    if is_sparse(x):
        x = x.to_dense()
    if not isinstance(x, Tensor) or x.ndim != 2 or (channels is not None and x.shape[1] != channels):
        want = f"[N, {channels}]" if channels is not None else "[N, F]"
        raise ShapeError(f"{layer}: node features of shape {getattr(x, 'shape', type(x).__name__)} must be {want}")
    return x


class SGConv(MessagePassing):
    """Simplified graph convolution (Wu et al. 2019), PyG's ``SGConv``: ``X' = Â^K X Θ`` with
    ``Â = D^-1/2 (A + I) D^-1/2`` (``edge_weight`` scales A's entries).

    ``cached=True`` keeps ``Â^K X`` between calls, as PyG; differs on purpose: polygrad checks
    that ``x`` and the graph are the ones it was computed from (their content) and recomputes
    otherwise, where PyG reuses it for any input; a call with ``edge_weight`` is never cached.
    PyG's parameter names (``lin.weight``, ``lin.bias``).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr="sum")
        if K < 0:
            raise ValueError(f"SGConv: K must be >= 0, got {K}")
        self.in_channels, self.out_channels, self.K = int(in_channels), int(out_channels), int(K)
        self.cached, self.add_self_loops = bool(cached), bool(add_self_loops)
        self.lin = Linear(self.in_channels, self.out_channels, bias=bias, dtype=dtype, backend=backend)
        self._structure = StructureCache()
        self._cached_x: tuple[np.ndarray, np.ndarray, Tensor] | None = None

    def forward(self, x: Tensor, edge_index: Any, edge_weight: Any = None) -> Tensor:
        x = _check_x("SGConv", x, self.in_channels)
        n = x.shape[0]
        ei = _edge_index("SGConv", edge_index, n)
        if self.cached and self._cached_x is not None and edge_weight is None:
            host_x, host_ei, propagated = self._cached_x
            if (host_x.shape == x.shape and host_ei.shape == ei.shape and np.array_equal(host_ei, ei)
                    and np.array_equal(host_x, x.numpy())):
                return self.lin(propagated)
        graph, norm = gcn_norm(ei, _edge_weight("SGConv", edge_weight, ei.shape[1], x), n,
                               self.add_self_loops, self._structure)
        h = x
        for _ in range(self.K):
            h = self.propagate(graph, x=h, edge_weight=norm)
        if self.cached and edge_weight is None:
            self._cached_x = (np.array(x.numpy()), np.array(ei), h.detach())
        return self.lin(h)

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, K={self.K}"


class APPNP(MessagePassing):
    """Personalised-PageRank propagation (Klicpera et al. 2019), PyG's ``APPNP``:
    ``H_0 = X``, ``H_{k+1} = (1 - alpha) Â H_k + alpha X``, K times; no parameters.

    ``dropout`` drops the normalised edge weights in training, anew at every hop (as PyG);
    ``normalize=False`` takes ``edge_weight`` (or ones) as given; ``cached`` is accepted for
    PyG's signature: the graph's index work is always cached by content, and the weights are
    recomputed each call (O(E)) so a gradient to ``edge_weight`` stays correct.
    """

    def __init__(self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True):
        super().__init__(aggr="sum")
        if K < 0:
            raise ValueError(f"APPNP: K must be >= 0, got {K}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"APPNP: dropout must be in [0, 1], got {dropout}")
        self.K, self.alpha, self.dropout = int(K), float(alpha), float(dropout)
        self.cached, self.add_self_loops, self.normalize = bool(cached), bool(add_self_loops), bool(normalize)
        self._structure = StructureCache()

    def forward(self, x: Tensor, edge_index: Any, edge_weight: Any = None) -> Tensor:
        x = _check_x("APPNP", x)
        n = x.shape[0]
        ei = _edge_index("APPNP", edge_index, n)
        weight = _edge_weight("APPNP", edge_weight, ei.shape[1], x)
        graph = ei
        if self.normalize:
            graph, weight = gcn_norm(ei, weight, n, self.add_self_loops, self._structure)
        else:
            graph = self._structure.get(ei, n, "plain", lambda: _frozen(ei))
        h = x
        for _ in range(self.K):
            w = dropout(weight, self.dropout, self.training) if self.dropout > 0 else weight
            h = self.propagate(graph, x=h, edge_weight=w) * (1.0 - self.alpha) + x * self.alpha
        return h

    def extra_repr(self) -> str:
        return f"K={self.K}, alpha={self.alpha}"


def _laplacian_structure(ei: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Laplacian edge_index: the non-loop edges then one loop per node, kept edges, loop mask)."""
    keep = np.flatnonzero(ei[0] != ei[1])
    nodes = np.arange(num_nodes, dtype=np.int64)
    out = np.concatenate([ei[:, keep], np.stack([nodes, nodes])], axis=1)
    out.flags.writeable = False
    is_loop = np.zeros(out.shape[1], dtype=bool)
    is_loop[keep.size:] = True
    return out, keep, is_loop


def scaled_laplacian(edge_index: np.ndarray, edge_weight: Tensor, num_nodes: int, normalization: str | None,
                     lambda_max: Any, batch: Any, structure: StructureCache) -> tuple[np.ndarray, Tensor]:
    """ChebConv's ``2 L / lambda_max - I`` as (edge_index, weights): PyG's ``get_laplacian``
    (self loops removed; degrees summed over each edge's *source*, as PyG) then ChebConv's
    ``__norm__`` (``lambda_max`` defaults to twice the largest Laplacian entry)."""
    ei, keep, is_loop = structure.get(edge_index, num_nodes, "laplacian",
                                      lambda: _laplacian_structure(edge_index, num_nodes))
    src, dst = ei[0, :keep.size], ei[1, :keep.size]
    w = edge_weight[keep]
    deg = scatter_sum(w, src, num_nodes)
    if normalization is None:        # L = D - A
        lap = concat([-w, deg])
    else:
        if normalization == "sym":   # L = I - D^-1/2 A D^-1/2
            dinv = _inv_pow(deg, -0.5)
            off = dinv[src] * w * dinv[dst]
        else:                        # "rw": L = I - D^-1 A
            off = _inv_pow(deg, -1.0)[src] * w
        lap = concat([-off, tensor(np.ones(num_nodes, dtype=w.dtype), backend=w._be)])
    if lambda_max is None:
        lam: Any = lap.max() * 2.0
    elif isinstance(lambda_max, Tensor):
        lam = lambda_max
    else:
        lam = tensor(np.asarray(lambda_max, dtype=lap.dtype), backend=lap._be)
    if batch is not None and isinstance(lam, Tensor) and lam.numel > 1:
        b = batch.numpy() if isinstance(batch, Tensor) else np.asarray(batch)
        lam = lam[np.asarray(b, dtype=np.int64)[ei[0]]]
    scaled = (lap * 2.0) / lam
    scaled = where(scaled == np.inf, 0.0, scaled)
    return ei, scaled - tensor(is_loop.astype(scaled.dtype), backend=scaled._be)


class ChebConv(MessagePassing):
    """Chebyshev spectral graph convolution (Defferrard et al. 2016), PyG's ``ChebConv``:
    ``out = sum_k T_k(L̂) X Θ_k + b`` with ``L̂ = 2 L / lambda_max - I``, ``T_0 = X``, ``T_1 = L̂ X``,
    ``T_k = 2 L̂ T_{k-1} - T_{k-2}``.

    ``normalization``: "sym" (default), "rw" or None (``L = D - A``); ``lambda_max`` (a number,
    or one per graph with ``batch``) defaults to twice the largest entry of ``L``, as PyG's code
    does.  PyG's parameter names (``lins.k.weight``, ``bias``).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int, normalization: str | None = "sym",
                 bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr="sum")
        if K < 1:
            raise ValueError(f"ChebConv: K must be >= 1, got {K}")
        if normalization not in (None, "sym", "rw"):
            raise ValueError(f"ChebConv: normalization must be None, 'sym' or 'rw', got {normalization!r}")
        self.in_channels, self.out_channels, self.normalization = int(in_channels), int(out_channels), normalization
        self.lins = [Linear(self.in_channels, self.out_channels, bias=False, dtype=dtype, backend=backend)
                     for _ in range(int(K))]
        self.bias = _init.zeros((self.out_channels,), dtype, backend) if bias else None
        self._structure = StructureCache()

    def forward(self, x: Tensor, edge_index: Any, edge_weight: Any = None, batch: Any = None,
                lambda_max: Any = None) -> Tensor:
        x = _check_x("ChebConv", x, self.in_channels)
        n = x.shape[0]
        ei = _edge_index("ChebConv", edge_index, n)
        graph, norm = scaled_laplacian(ei, _edge_weight("ChebConv", edge_weight, ei.shape[1], x), n,
                                       self.normalization, lambda_max, batch, self._structure)
        tx0 = x
        out = self.lins[0](tx0)
        if len(self.lins) > 1:
            tx1 = self.propagate(graph, x=x, edge_weight=norm)
            out = out + self.lins[1](tx1)
            for lin in self.lins[2:]:
                tx2 = self.propagate(graph, x=tx1, edge_weight=norm) * 2.0 - tx0
                out = out + lin(tx2)
                tx0, tx1 = tx1, tx2
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels} -> {self.out_channels}, K={len(self.lins)}, "
                f"normalization={self.normalization!r}")
