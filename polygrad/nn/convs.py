"""Graph layers on :class:`MessagePassing`: ``GATConv``, ``SAGEConv``, ``GINConv`` (PyG's signatures).

Graphs are PyG ``edge_index`` ``[2, E]`` arrays (source row 0, destination row 1) or sparse
adjacency tensors whose rows are destinations; node features may be dense or sparse (a sparse
bag-of-words input makes the first linear map an SpMM).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad.tensor.activations import leaky_relu
from polygrad.ir.errors import ShapeError
from polygrad.sparse.graph_ops import expand_pattern, scatter, segment_softmax
from polygrad.sparse.pattern import Pattern
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor, addcmul, concat, segment_sum, spmm, tensor

from . import init as _init
from .layers import Linear, dropout
from .graph_cache import EdgeGraph
from .message_passing import MessagePassing
from .module import Module

__all__ = ["GATConv", "SAGEConv", "GINConv"]


def _check_x(layer: str, x: Tensor, channels: int) -> None:
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != channels:
        raise ShapeError(f"{layer}: node features of shape {getattr(x, 'shape', type(x).__name__)} "
                         f"({getattr(x, 'layout', 'dense')}) must be [N, {channels}]")


class GATConv(MessagePassing):
    """Graph attention (Veličković et al. 2018), PyG's ``GATConv``.

    ``h = x W`` split into ``heads`` heads of ``out_channels``; the score of edge j -> i in head k
    is ``LeakyReLU(a_dst,k · h_i,k + a_src,k · h_j,k [+ a_edge,k · (W_e e_ji)_k])``, softmax-
    normalised over i's incoming edges, dropped out with ``dropout`` (attention dropout, training
    only), and the output is ``sum_j alpha_ij,k h_j,k``: heads concatenated (``concat=True``,
    ``[N, heads*out]``) or averaged; plus ``bias``.  Self loops are added (existing ones
    replaced, as PyG); with ``edge_dim`` each loop's edge features are ``fill_value``: "mean"
    (of the node's incoming edges' features, PyG's default), "add", "max" or a number.

    ``in_channels``: an int (one weight maps sources and destinations: ``weight``, PyG's
    ``lin``) or a pair ``(F_src, F_dst)`` for a bipartite graph whose sides differ (``lin_src``
    and ``lin_dst``, as PyG).

    A repeated edge is its own entry in the softmax, as in PyG.  Unlike PyG, ``edge_attr``
    passed to a layer built without ``edge_dim`` is an error rather than ignored.
    ``return_attention_weights=True`` also returns ``(edge_index, alpha)``: the edges attended
    over (self loops included, PyG's order) and ``alpha`` ``[E, heads]`` in that order.

    How it runs: all heads at once on head-expanded patterns (:func:`~polygrad.sparse.graph_ops.
    expand_pattern`), so scores are gathers, the softmax is one segment reduction and the
    aggregation is one SpMM; the attention gradient is an SDDMM.  Nothing is ``N x N``.
    """

    def __init__(self, in_channels: "int | tuple[int, int]", out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: int | None = None, fill_value: "float | str" = "mean",
                 bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr="sum", add_self_loops=add_self_loops)
        if heads < 1:
            raise ValueError(f"GATConv: heads must be >= 1, got {heads}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"GATConv: dropout must be in [0, 1], got {dropout}")
        if isinstance(fill_value, str) and fill_value not in _LOOP_FILLS:
            raise ValueError(f"GATConv: fill_value must be a number or one of {tuple(_LOOP_FILLS)}, got {fill_value!r}")
        self.out_channels, self.heads = int(out_channels), int(heads)
        self.concat, self.negative_slope, self.dropout = bool(concat), float(negative_slope), float(dropout)
        self.add_self_loops, self.fill_value = bool(add_self_loops), fill_value
        self.edge_dim = None if edge_dim is None else int(edge_dim)
        width = self.heads * self.out_channels
        # PyG: an int maps sources and destinations with one weight (its ``lin``); a pair
        # (source, destination) gives each side its own (``lin_src`` / ``lin_dst``)
        self.in_channels: "int | tuple[int, int]"
        self.weight: Tensor | None = None
        self.lin_src: Linear | None = None
        self.lin_dst: Linear | None = None
        if isinstance(in_channels, (tuple, list)):
            if len(in_channels) != 2:
                raise ValueError(f"GATConv: in_channels must be an int or a pair (source, destination), "
                                 f"got {in_channels!r}")
            self.in_channels = (int(in_channels[0]), int(in_channels[1]))
            self.lin_src = Linear(self.in_channels[0], width, bias=False, dtype=dtype, backend=backend)
            self.lin_dst = Linear(self.in_channels[1], width, bias=False, dtype=dtype, backend=backend)
        else:
            self.in_channels = int(in_channels)
            self.weight = _init.glorot_uniform((self.in_channels, width), dtype, backend)
        self.att_src = _init.glorot_uniform((self.heads, self.out_channels), dtype, backend)
        self.att_dst = _init.glorot_uniform((self.heads, self.out_channels), dtype, backend)
        self.lin_edge: Linear | None = None
        self.att_edge: Tensor | None = None
        if self.edge_dim is not None:
            self.lin_edge = Linear(self.edge_dim, self.heads * self.out_channels, bias=False, dtype=dtype,
                                   backend=backend)
            self.att_edge = _init.glorot_uniform((self.heads, self.out_channels), dtype, backend)
        width = self.heads * self.out_channels if self.concat else self.out_channels
        self.bias = _init.zeros((width,), dtype, backend) if bias else None

    @property
    def source_weight(self) -> Tensor:
        """The weight mapping source features (``weight``, or ``lin_src.weight`` for a pair)."""
        return self.weight if self.lin_src is None else self.lin_src.weight  # type: ignore[return-value]

    def forward(self, x: "Tensor | tuple[Tensor, Tensor | None]", graph: Any, edge_attr: Any = None,
                return_attention_weights: bool = False, size: Any = None) -> Any:
        """``x``: node features, or ``(x_src, x_dst)`` for a bipartite graph (PyG's convention:
        the output has a row per destination; self loops are added for the first
        ``min(N_src, N_dst)`` nodes; ``x_dst=None`` drops the destination's score).  A layer built
        with ``in_channels=(F_src, F_dst)`` maps each side with its own weight, also when one
        ``x`` is given for both."""
        name = f"GATConv({self.in_channels} -> {self.heads}x{self.out_channels})"
        pair: tuple[Any, Any] = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, x)
        x_src, x_dst = pair
        src_in, dst_in = self.in_channels if isinstance(self.in_channels, tuple) else (self.in_channels,) * 2
        _check_x(name, x_src, src_in)
        if x_dst is not None and (x_dst is not x_src or dst_in != src_in):
            _check_x(name, x_dst, dst_in)
        h, c = self.heads, self.out_channels
        ns = x_src.shape[0]
        nd = x_dst.shape[0] if x_dst is not None else ns    # PyG: size_i defaults to size_j
        rows = (ns, nd) if self.flow == "source_to_target" else (nd, ns)
        if size is not None:
            rows = tuple(self._sizes(size))  # type: ignore[assignment]
        g = self.edge_graph(graph, rows)
        w_src = self.source_weight
        w_dst = w_src if self.lin_dst is None else self.lin_dst.weight
        feats = x_src @ w_src                                      # [N_src, H*C]
        a_src = (feats.reshape(ns, h, c) * self.att_src).sum(-1).reshape(ns * h)   # node j*H+k
        copies, src_at, edge_at, from_copies = g.derived(("gat", h), lambda gr: _attention_index(gr, h))
        scores = a_src[src_at]                                     # one per (edge copy, head)
        if x_dst is not None:
            feats_dst = feats if x_dst is x_src and w_dst is w_src else x_dst @ w_dst
            a_dst = (feats_dst.reshape(g.num_dst, h, c) * self.att_dst).sum(-1).reshape(g.num_dst * h)
            scores = scores + a_dst[copies.rows]
        edge_term = self._edge_term(edge_attr, g)
        if edge_term is not None:
            scores = scores + edge_term.reshape(-1)[edge_at]
        alpha = segment_softmax(leaky_relu(scores, self.negative_slope), copies)
        alpha = dropout(alpha, self.dropout, self.training)
        big, _, _ = expand_pattern(g.pattern, h)
        # copies of one edge are adjacent in the same order as the pattern's entries: their
        # attention adds up into the entry (same message h_j), one segment sum
        entry_alpha = segment_sum(alpha, g.derived(("gat_entries", h), lambda gr: _entry_runs(gr, h))) \
            if g.duplicates else alpha
        n = g.num_dst
        out = spmm(entry_alpha, feats.reshape(ns * h, c), big)     # [N_dst*H, C]
        out = out.reshape(n, h * c) if self.concat else out.reshape(n, h, c).mean(1)
        if self.bias is not None:
            out = out + self.bias
        if return_attention_weights:
            return out, (g.edge_index(), alpha[from_copies].reshape(g.num_edges, h))
        return out

    def _edge_term(self, edge_attr: Any, g: EdgeGraph) -> Tensor | None:
        """``a_edge · (W_e e)`` per edge (self loops included) and head: ``[E, H]``, or None."""
        if edge_attr is None:
            return None
        if self.lin_edge is None or self.att_edge is None:
            raise ShapeError("GATConv: edge_attr was given to a layer built without edge_dim "
                             "(PyG would ignore it): pass edge_dim=F to use edge features")
        e = edge_attr if isinstance(edge_attr, Tensor) else tensor(edge_attr)
        if e.ndim == 1:
            e = e.reshape(e.shape[0], 1)
        if e.ndim != 2 or e.shape != (g.given_edges, self.edge_dim):
            raise ShapeError(f"GATConv: edge_attr of shape {e.shape} must be [{g.given_edges}, {self.edge_dim}] "
                             "(one row per edge of edge_index, edge_dim features)")
        if g.kept is not None:  # PyG: remove_self_loops, then add_self_loops with fill_value
            e = e[g.kept]
            loops = g.num_edges - e.shape[0]
            loop_attr = self._loop_attr(e, g.dst[:e.shape[0]], g.num_dst)
            e = concat([e, loop_attr if loops == g.num_dst else loop_attr[:loops]], axis=0)
        h, c = self.heads, self.out_channels
        return (self.lin_edge(e).reshape(g.num_edges, h, c) * self.att_edge).sum(-1)

    def _loop_attr(self, e: Tensor, dst: np.ndarray, n: int) -> Tensor:
        if isinstance(self.fill_value, str):
            return scatter(e, dst, n, _LOOP_FILLS[self.fill_value])
        return zeros_like_rows(e, n) + float(self.fill_value)

    def extra_repr(self) -> str:
        return (f"{self.in_channels} -> {self.out_channels}, heads={self.heads}, concat={self.concat}, "
                f"dropout={self.dropout}" + (f", edge_dim={self.edge_dim}" if self.edge_dim else ""))


_LOOP_FILLS = {"mean": "mean", "add": "sum", "sum": "sum", "max": "max"}


def zeros_like_rows(e: Tensor, n: int) -> Tensor:
    """Zeros ``[n, *e.shape[1:]]`` with ``e``'s dtype and backend."""
    return tensor(np.zeros((n,) + tuple(e.shape[1:]), dtype=e.dtype), backend=e.backend)


def _attention_index(g: EdgeGraph, h: int) -> tuple[Pattern, np.ndarray, np.ndarray, np.ndarray]:
    """(head-expanded copies pattern, source slot of each of its entries in ``[N*H]``, edge slot in
    ``[E*H]``, and the map from ``(edge, head)`` flat index to its entry): GAT's index arrays."""
    copies, _, from_expanded = expand_pattern(g.copies_pattern(), h)
    position, head = np.divmod(copies.cols, h)       # entry k is (sorted copy position, head)
    edge = g.order[position]
    src_at = g.src[edge] * h + head
    edge_at = edge * h + head
    # (edge in edge order, head) -> entry: from (sorted position, head) -> entry, re-indexed
    inv = np.empty_like(g.order)
    inv[g.order] = np.arange(g.num_edges, dtype=np.int64)
    from_edges = from_expanded.reshape(g.num_edges, h)[inv].reshape(-1) if g.num_edges else from_expanded
    for a in (src_at, edge_at, from_edges):
        a.flags.writeable = False
    return copies, src_at, edge_at, from_edges


def _entry_runs(g: EdgeGraph, h: int) -> Pattern:
    """Segments summing the head-expanded copies of each pattern entry into that entry."""
    _, _, from_expanded = expand_pattern(g.pattern, h)
    per_entry = np.empty(g.pattern.nnz * h, dtype=np.int64)
    per_entry[from_expanded] = np.repeat(g.multiplicity.astype(np.int64), h)
    indptr = np.zeros(per_entry.shape[0] + 1, dtype=np.int64)
    np.cumsum(per_entry, out=indptr[1:])
    return Pattern((per_entry.shape[0], g.num_edges * h), indptr, np.arange(g.num_edges * h, dtype=np.int64))


class SAGEConv(MessagePassing):
    """GraphSAGE (Hamilton et al. 2017), PyG's ``SAGEConv``: ``out = W_l · aggr_j x_j + W_r · x_i + b``.

    ``aggr``: "mean" (default), "sum" or "max".  ``root_weight=False`` drops the ``W_r · x_i`` term;
    ``normalize=True`` L2-normalises each output row.  For the linear aggregations the cheaper
    order is used: when ``in_channels > out_channels`` the features are mapped first and then
    aggregated (``A (x W) = (A x) W``), so a sparse ``x`` never meets the adjacency.
    """

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "mean", root_weight: bool = True,
                 bias: bool = True, normalize: bool = False, dtype: Any = None, backend: Any = None):
        super().__init__(aggr=aggr)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.root_weight, self.normalize = bool(root_weight), bool(normalize)
        self.lin_l = Linear(self.in_channels, self.out_channels, bias=bias, dtype=dtype, backend=backend)
        self.lin_r = (Linear(self.in_channels, self.out_channels, bias=False, dtype=dtype, backend=backend)
                      if self.root_weight else None)

    def forward(self, x: "Tensor | tuple[Tensor, Tensor | None]", graph: Any, size: Any = None) -> Tensor:
        """``x``: node features, or a pair ``(x_src, x_dst)`` for a bipartite graph (PyG's
        convention: the output has a row per destination, the root term reads ``x_dst``)."""
        name = f"SAGEConv({self.in_channels} -> {self.out_channels})"
        x_src, x_dst = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, x)
        _check_x(name, x_src, self.in_channels)
        if x_dst is not None:
            _check_x(name, x_dst, self.in_channels)
        if self.aggr != "max" and (self.in_channels > self.out_channels or is_sparse(x_src)):
            out = self.propagate(graph, x=(x_src @ self.lin_l.weight, x_dst), size=size)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(self.propagate(graph, x=(x_src.to_dense() if is_sparse(x_src) else x_src, x_dst),
                                            size=size))
        if self.lin_r is not None:
            if x_dst is None:
                raise ShapeError(f"{name}: root_weight=True needs the destination features (x_dst is None)")
            out = out + self.lin_r(x_dst)
        if self.normalize:
            norm = ((out * out).sum(-1, keepdims=True) + 1e-24) ** 0.5
            out = out / norm
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, aggr={self.aggr!r}, root_weight={self.root_weight}"


class GINConv(MessagePassing):
    """Graph isomorphism network layer (Xu et al. 2019), PyG's ``GINConv``:
    ``out = nn((1 + eps) · x_i + sum_j x_j)``.

    ``nn`` is the user's module (an MLP); ``train_eps=True`` makes ``eps`` a learnable parameter
    (initialised to ``eps``).  The neighbour sum is one SpMM.
    """

    def __init__(self, nn: "Module | Callable[[Tensor], Tensor]", eps: float = 0.0, train_eps: bool = False,
                 dtype: Any = None, backend: Any = None):
        if not callable(nn):
            raise TypeError(f"GINConv: nn must be a module or callable mapping [N, F] node features to "
                            f"[N, F'] (PyG's GINConv(nn)), got {type(nn).__name__}")
        super().__init__(aggr="sum")
        self.nn = nn
        self.initial_eps = float(eps)
        self.train_eps = bool(train_eps)
        e = _init.zeros((1,), dtype, backend)
        e.data = e.data + self.initial_eps
        if not self.train_eps:
            e = e.detach()  # a buffer: saved, never optimised
        self.eps = e

    def forward(self, x: "Tensor | tuple[Tensor, Tensor | None]", graph: Any, size: Any = None) -> Tensor:
        """``x``: node features, or ``(x_src, x_dst)`` for a bipartite graph (PyG's convention:
        the ``(1 + eps)`` root term reads ``x_dst``, and is left out when it is None)."""
        pair: tuple[Any, Any] = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, x)
        x_src, x_dst = (t.to_dense() if is_sparse(t) else t for t in pair)
        for t in (x_src, x_dst):
            if t is not None and (not isinstance(t, Tensor) or t.ndim != 2):
                raise ShapeError(f"GINConv: node features must be [N, F], got {getattr(t, 'shape', type(t).__name__)}")
        out = self.propagate(graph, x=(x_src, x_dst), size=size)
        if x_dst is not None:  # out + x_dst * (1 + eps), as one op where it can be (the same bits)
            out = addcmul(out, x_dst, self.eps + 1.0)
        return self.nn(out)

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}, train_eps={self.train_eps}"
