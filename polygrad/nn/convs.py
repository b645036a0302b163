"""Graph layers on :class:`MessagePassing`: ``GATConv``, ``SAGEConv``, ``GINConv`` (PyG's signatures).

Graphs are PyG ``edge_index`` ``[2, E]`` arrays (source row 0, destination row 1) or sparse
adjacency tensors whose rows are destinations; node features may be dense or sparse (a sparse
bag-of-words input makes the first linear map an SpMM).
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.activations import leaky_relu
from polygrad.errors import ShapeError
from polygrad.graph_ops import expand_pattern, segment_softmax
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor, spmm

from . import init as _init
from .layers import Linear, dropout
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
    is ``LeakyReLU(a_dst,k · h_i,k + a_src,k · h_j,k)``, softmax-normalised over i's incoming
    edges, dropped out with ``dropout`` (attention dropout, training only), and the output is
    ``sum_j alpha_ij,k h_j,k``: heads concatenated (``concat=True``, ``[N, heads*out]``) or
    averaged; plus ``bias``.  Self loops are added (existing ones replaced, as PyG).

    How it runs: all heads at once on the head-expanded pattern (:func:`~polygrad.graph_ops.
    expand_pattern`, an (N*H)-node graph), so scores are two gathers, the softmax is one segment
    reduction and the aggregation is one SpMM; the attention gradient is an SDDMM.  Nothing is
    ``N x N``.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr="sum", add_self_loops=add_self_loops)
        if heads < 1:
            raise ValueError(f"GATConv: heads must be >= 1, got {heads}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"GATConv: dropout must be in [0, 1], got {dropout}")
        self.in_channels, self.out_channels, self.heads = int(in_channels), int(out_channels), int(heads)
        self.concat, self.negative_slope, self.dropout = bool(concat), float(negative_slope), float(dropout)
        self.weight = _init.glorot_uniform((self.in_channels, self.heads * self.out_channels), dtype, backend)
        self.att_src = _init.glorot_uniform((self.heads, self.out_channels), dtype, backend)
        self.att_dst = _init.glorot_uniform((self.heads, self.out_channels), dtype, backend)
        width = self.heads * self.out_channels if self.concat else self.out_channels
        self.bias = _init.zeros((width,), dtype, backend) if bias else None
        self._attention: Tensor | None = None

    def forward(self, x: Tensor, graph: Any, return_attention_weights: bool = False) -> Any:
        _check_x(f"GATConv({self.in_channels} -> {self.heads}x{self.out_channels})", x, self.in_channels)
        n, h, c = x.shape[0], self.heads, self.out_channels
        pattern, _ = self.pattern(graph, n)
        big, _, from_expanded = expand_pattern(pattern, h)
        feats = x @ self.weight                                    # [N, H*C]
        per_head = feats.reshape(n, h, c)
        a_src = (per_head * self.att_src).sum(-1).reshape(n * h)   # [N*H], node j*H+k
        a_dst = (per_head * self.att_dst).sum(-1).reshape(n * h)
        scores = leaky_relu(a_dst[big.rows] + a_src[big.cols], self.negative_slope)
        alpha = segment_softmax(scores, big)
        alpha = dropout(alpha, self.dropout, self.training)
        out = spmm(alpha, feats.reshape(n * h, c), big)            # [N*H, C]
        out = out.reshape(n, h * c) if self.concat else out.reshape(n, h, c).mean(1)
        if self.bias is not None:
            out = out + self.bias
        if return_attention_weights:
            return out, (pattern, alpha[from_expanded].reshape(pattern.nnz, h))
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels} -> {self.out_channels}, heads={self.heads}, concat={self.concat}, "
                f"dropout={self.dropout}")


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

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        _check_x(f"SAGEConv({self.in_channels} -> {self.out_channels})", x, self.in_channels)
        if self.aggr != "max" and (self.in_channels > self.out_channels or is_sparse(x)):
            out = self.propagate(graph, x=x @ self.lin_l.weight)
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(self.propagate(graph, x=x.to_dense() if is_sparse(x) else x))
        if self.lin_r is not None:
            out = out + self.lin_r(x)
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
        super().__init__(aggr="sum")
        self.nn = nn
        self.initial_eps = float(eps)
        self.train_eps = bool(train_eps)
        e = _init.zeros((1,), dtype, backend)
        e.data = e.data + self.initial_eps
        if not self.train_eps:
            e = e.detach()  # a buffer: saved, never optimised
        self.eps = e

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        if is_sparse(x):
            x = x.to_dense()
        if not isinstance(x, Tensor) or x.ndim != 2:
            raise ShapeError(f"GINConv: node features must be [N, F], got {getattr(x, 'shape', type(x).__name__)}")
        return self.nn(self.propagate(graph, x=x) + x * (self.eps + 1.0))

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}, train_eps={self.train_eps}"
