"""Graph layers with edge weights or edge features, PyG's signatures: ``GraphConv``, ``GINEConv``,
``NNConv``.

Each takes node features ``x`` ``[N, F]`` or a bipartite pair ``(x_src, x_dst)`` (as
:class:`HeteroConv` passes them), a PyG ``edge_index`` ``[2, E]`` (source row 0, destination row
1), and per-edge data in ``edge_index`` order.  On one node set the layers run through
:meth:`MessagePassing.propagate`; a bipartite pair is propagated here, edge by edge (a gather of
the sources, the layer's ``message``, a scatter into the destinations), because
``MessagePassing`` does not take ``(x_src, x_dst)`` yet.  That edge-by-edge path sums repeated
edges, as PyG does.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from polygrad.ir.errors import ShapeError
from polygrad.sparse import is_sparse
from polygrad.tensor import Tensor

from . import init as _init
from .layers import Linear, Sequential, as_input
from .message_passing import MessagePassing
from .module import Module

__all__ = ["EdgeConv", "GraphConv", "GINEConv", "NNConv", "split_pair", "propagate_pair"]


def split_pair(x: Any) -> tuple[Tensor, Tensor | None]:
    """``(x_src, x_dst)``: a pair as given, a single tensor as ``(x, x)`` (PyG's convention)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2 or not isinstance(x[0], Tensor):
            raise ShapeError(f"node features must be a tensor or a pair (x_src, x_dst), got {len(x)} items"
                             if len(x) != 2 else "the source features x_src of a pair must be a tensor")
        return x[0], x[1]
    if not isinstance(x, Tensor):
        raise ShapeError(f"node features must be a tensor or a pair (x_src, x_dst), got {type(x).__name__}")
    return x, x


def _dense_pair(x: Any) -> tuple[Tensor, Tensor | None]:
    """:func:`split_pair` with sparse features made dense (messages are per-edge rows)."""
    x_src, x_dst = split_pair(x)
    if is_sparse(x_src):
        x_src = x_src.to_dense()
    if x_dst is not None and is_sparse(x_dst):
        x_dst = x_dst.to_dense()
    return x_src, x_dst


class EdgeConv(MessagePassing):
    """A :class:`MessagePassing` layer whose ``message(x_j, <edge_arg>)`` takes one per-edge tensor."""

    #: the name of the per-edge argument of ``message`` (and of ``propagate``)
    edge_arg: str = "edge_weight"


def _edge_index(layer: str, edge_index: Any) -> np.ndarray:
    ei = edge_index.numpy() if isinstance(edge_index, Tensor) else np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise ShapeError(f"{layer}: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    return ei.astype(np.int64, copy=False)


def propagate_pair(layer: EdgeConv, edge_index: Any, x_src: Tensor, x_dst: Tensor | None,
                   size: Sequence[int] | None, edge: Tensor | None) -> Tensor:
    """``layer``'s message -> aggregate from ``x_src`` into the destination nodes.

    One node set (``x_dst is x_src``, no ``size``): :meth:`MessagePassing.propagate`, passing
    ``edge`` as the layer's ``edge_arg``.  Otherwise edge by edge: ``layer.message(x_src[src],
    edge)`` scattered into ``size[1]`` (default ``x_dst``'s rows) destinations.
    """
    name = type(layer).__name__
    per_edge: dict[str, Any] = {layer.edge_arg: edge}
    if x_dst is x_src and size is None:
        return layer.propagate(edge_index, x=x_src, **per_edge)
    ei = _edge_index(name, edge_index)
    n_src = x_src.shape[0]
    if size is not None:
        n_src, n_dst = int(size[0]), int(size[1])
    elif x_dst is not None:
        n_dst = x_dst.shape[0]
    else:
        raise ShapeError(f"{name}: a pair (x_src, None) needs size=(num_src, num_dst)")
    if x_src.shape[0] != n_src or (x_dst is not None and x_dst.shape[0] != n_dst):
        raise ShapeError(f"{name}: features with {x_src.shape[0]} source and "
                         f"{None if x_dst is None else x_dst.shape[0]} destination rows for size ({n_src}, {n_dst})")
    if ei.size and (ei[0].min() < 0 or ei[0].max() >= n_src or ei[1].min() < 0 or ei[1].max() >= n_dst):
        raise ShapeError(f"{name}: edge_index refers to nodes outside [0, {n_src}) (sources) or [0, {n_dst}) "
                         "(destinations)")
    if edge is not None and (edge.ndim < 1 or edge.shape[0] != ei.shape[1]):
        raise ShapeError(f"{name}: {layer.edge_arg} of shape {edge.shape} needs one row per edge ({ei.shape[1]})")
    messages = layer.message(x_j=x_src[ei[0]], **per_edge)  # keywords: as propagate fills them
    return layer.aggregate(messages, index=ei[1], dim_size=n_dst)


def _channels(in_channels: "int | tuple[int, int]") -> tuple[int, int]:
    if isinstance(in_channels, (tuple, list)):
        return int(in_channels[0]), int(in_channels[1])
    return int(in_channels), int(in_channels)


def _as_tensor(value: Any, like: Tensor) -> Tensor | None:
    """Per-edge data as a tensor on ``like``'s backend and dtype (None stays None)."""
    return None if value is None else as_input(value, like)


class GraphConv(EdgeConv):
    """Weisfeiler-Leman graph convolution (Morris et al. 2019), PyG's ``GraphConv``:
    ``x'_i = W_1 x_i + W_2 · aggr_{j -> i} e_ji x_j`` (``lin_root``, ``lin_rel`` with the bias).

    ``aggr``: "add" (default), "mean" or "max"; ``edge_weight`` ``[E]`` scales each message.
    ``in_channels`` may be a pair ``(source, destination)`` for bipartite inputs.  Same parameter
    names as PyG (``lin_rel.weight``, ``lin_rel.bias``, ``lin_root.weight``); weights are
    ``[in, out]`` (see :mod:`polygrad.nn.torch_state`).  Differs on purpose: Glorot initialisation
    (PyG: kaiming-uniform), and repeated edges count once on one node set until
    ``MessagePassing`` sums them (PyG sums them).
    """

    edge_arg = "edge_weight"

    def __init__(self, in_channels: "int | tuple[int, int]", out_channels: int, aggr: str = "add",
                 bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr=aggr)
        self.in_channels, self.out_channels = in_channels, int(out_channels)
        fin_src, fin_dst = _channels(in_channels)
        self.lin_rel = Linear(fin_src, self.out_channels, bias=bias, dtype=dtype, backend=backend)
        self.lin_root = Linear(fin_dst, self.out_channels, bias=False, dtype=dtype, backend=backend)

    def forward(self, x: Any, edge_index: Any, edge_weight: Any = None,
                size: Sequence[int] | None = None) -> Tensor:
        x_src, x_dst = _dense_pair(x)
        out = propagate_pair(self, edge_index, x_src, x_dst, size, _as_tensor(edge_weight, self.lin_rel.weight))
        out = self.lin_rel(out)
        if x_dst is not None:
            out = out + self.lin_root(x_dst)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, aggr={self.aggr!r}"


def _eps(eps: float, train_eps: bool, dtype: Any, backend: Any) -> Tensor:
    e = _init.zeros((1,), dtype, backend)
    e.data = e.data + float(eps)
    return e if train_eps else e.detach()  # a buffer when fixed: saved, never optimised


def _in_features(nn: Any) -> int:
    """The input width of ``nn`` (its first layer's, for a Sequential), as PyG infers it."""
    first = nn[0] if isinstance(nn, Sequential) else nn
    for attr in ("in_features", "in_channels"):
        value = getattr(first, attr, None)
        if isinstance(value, (int, np.integer)):
            return int(value)
    raise ShapeError(f"GINEConv: could not infer the input channels of nn ({type(first).__name__}); "
                     "give it in_features / in_channels")


class GINEConv(EdgeConv):
    """GIN with edge features (Hu et al. 2020), PyG's ``GINEConv``:
    ``x'_i = nn((1 + eps) · x_i + sum_{j -> i} ReLU(x_j + lin(e_ji)))``.

    ``edge_dim`` given: edge features ``[E, edge_dim]`` pass through ``lin`` (a Linear to ``nn``'s
    input width); ``edge_dim=None``: they must already have the node features' width.
    ``train_eps=True`` learns ``eps``.  PyG's parameter names (``nn.*``, ``lin.*``, ``eps``).
    """

    edge_arg = "edge_attr"

    def __init__(self, nn: "Module | Callable[[Tensor], Tensor]", eps: float = 0.0, train_eps: bool = False,
                 edge_dim: int | None = None, dtype: Any = None, backend: Any = None):
        super().__init__(aggr="sum")
        self.nn = nn
        self.initial_eps, self.train_eps = float(eps), bool(train_eps)
        self.eps = _eps(eps, train_eps, dtype, backend)
        self.lin = (Linear(int(edge_dim), _in_features(nn), dtype=dtype, backend=backend)
                    if edge_dim is not None else None)

    def message(self, x_j: Tensor, edge_attr: Tensor) -> Tensor:  # type: ignore[override]  # by name, as PyG
        if self.lin is None and (edge_attr.ndim != 2 or x_j.shape[-1] != edge_attr.shape[-1]):
            raise ShapeError(f"GINEConv: edge features of shape {edge_attr.shape} do not match the node "
                             f"features' width {x_j.shape[-1]}; set edge_dim to map them")
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        return (x_j + edge_attr).relu()

    def forward(self, x: Any, edge_index: Any, edge_attr: Any = None,
                size: Sequence[int] | None = None) -> Tensor:
        if edge_attr is None:
            raise ShapeError("GINEConv needs edge_attr (use GINConv for a graph without edge features)")
        x_src, x_dst = _dense_pair(x)
        out = propagate_pair(self, edge_index, x_src, x_dst, size, _as_tensor(edge_attr, x_src))
        if x_dst is not None:
            out = out + x_dst * (self.eps + 1.0)
        return self.nn(out)

    def extra_repr(self) -> str:
        edge_dim = None if self.lin is None else self.lin.in_features
        return f"eps={self.initial_eps}, train_eps={self.train_eps}, edge_dim={edge_dim}"


class NNConv(EdgeConv):
    """Edge-conditioned convolution (Gilmer et al. 2017), PyG's ``NNConv`` (``ECConv``):
    ``x'_i = W x_i + aggr_{j -> i} x_j · h(e_ji) + b``.

    ``nn`` (``h``) maps edge features ``[E, D]`` to ``[E, in_channels * out_channels]``, read as
    one ``[in, out]`` matrix per edge (row-major, as PyG's ``view(-1, in, out)``).  ``aggr``: "add"
    (default), "mean" or "max"; ``root_weight`` adds ``lin`` (``W``); PyG's parameter names
    (``nn.*``, ``lin.weight``, ``bias``).  Differs on purpose: ``lin`` starts Glorot, not PyG's
    kaiming-uniform.
    """

    edge_arg = "edge_attr"

    def __init__(self, in_channels: "int | tuple[int, int]", out_channels: int,
                 nn: "Module | Callable[[Tensor], Tensor]", aggr: str = "add", root_weight: bool = True,
                 bias: bool = True, dtype: Any = None, backend: Any = None):
        super().__init__(aggr=aggr)
        self.in_channels, self.out_channels = in_channels, int(out_channels)
        self.in_channels_l, fin_dst = _channels(in_channels)
        self.nn = nn
        self.root_weight = bool(root_weight)
        self.lin = (Linear(fin_dst, self.out_channels, bias=False, dtype=dtype, backend=backend)
                    if self.root_weight else None)
        self.bias = _init.zeros((self.out_channels,), dtype, backend) if bias else None

    def message(self, x_j: Tensor, edge_attr: Tensor) -> Tensor:  # type: ignore[override]  # by name, as PyG
        weight = self.nn(edge_attr)
        fin, fout = self.in_channels_l, self.out_channels
        if weight.ndim != 2 or weight.shape[-1] != fin * fout:
            raise ShapeError(f"NNConv: nn(edge_attr) has shape {weight.shape}; it must be [E, {fin} * {fout}]")
        weight = weight.reshape(weight.shape[0], fin, fout)
        return (x_j.reshape(x_j.shape[0], fin, 1) * weight).sum(1)   # x_j @ W_e, per edge

    def forward(self, x: Any, edge_index: Any, edge_attr: Any = None,
                size: Sequence[int] | None = None) -> Tensor:
        if edge_attr is None:
            raise ShapeError("NNConv needs edge_attr (the input of nn)")
        x_src, x_dst = _dense_pair(x)
        if x_src.ndim != 2 or x_src.shape[1] != self.in_channels_l:
            raise ShapeError(f"NNConv: source features of shape {x_src.shape} must be [N, {self.in_channels_l}]")
        out = propagate_pair(self, edge_index, x_src, x_dst, size, _as_tensor(edge_attr, x_src))
        if x_dst is not None and self.lin is not None:
            out = out + self.lin(x_dst)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels}, aggr={self.aggr!r}, root_weight={self.root_weight}"
