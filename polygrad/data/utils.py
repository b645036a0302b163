"""``edge_index`` utilities with PyG's names, argument order and outputs (``torch_geometric.utils``).

Each function takes and returns numpy arrays (``edge_index`` int64 ``[2, E]``) and gives exactly
PyG's result: the same columns in the same order, the same merged edge features.  Where PyG
returns a tuple (``remove_self_loops``, ``add_self_loops``, ``subgraph``, ``k_hop_subgraph``)
so does polygrad.  ``to_undirected`` returns the tuple only when ``edge_attr`` is passed (even as
None), as PyG >= 2.3.

The older helpers of :mod:`polygrad.data.edge_index` (``remove_self_loops(edge_index)`` returning
an array, ``coalesce_edge_index``) keep their signatures; these are the PyG-shaped ones.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.errors import DataError
from .edge_index import _check_edge_index

__all__ = ["degree", "coalesce", "to_undirected", "is_undirected", "remove_self_loops", "add_self_loops",
           "contains_self_loops", "subgraph", "k_hop_subgraph", "scatter_rows"]

_MISSING: Any = object()  # "edge_attr not passed" (PyG's MISSING): returns the edge_index alone
_REDUCES = ("add", "sum", "mean", "min", "max", "mul")


def _attr(edge_attr: Any, num_edges: int, where: str) -> np.ndarray:
    a = np.asarray(edge_attr)
    if a.ndim == 0 or a.shape[0] != num_edges:
        raise DataError(f"{where}: edge_attr of shape {a.shape} needs one row per edge ({num_edges})")
    return a


def scatter_rows(values: np.ndarray, index: np.ndarray, size: int, reduce: str, where: str = "scatter") -> np.ndarray:
    """Rows of ``values`` reduced per ``index`` into ``size`` rows (empty groups give 0, as PyG's scatter)."""
    if reduce not in _REDUCES:
        raise DataError(f"{where}: reduce must be one of {', '.join(_REDUCES)}, got {reduce!r}")
    out_shape = (size,) + values.shape[1:]
    if reduce in ("add", "sum", "mean"):
        out = np.zeros(out_shape, dtype=np.result_type(values.dtype, np.float32) if reduce == "mean"
                       else values.dtype)
        np.add.at(out, index, values)
        if reduce == "mean":
            count = np.bincount(index, minlength=size).reshape((size,) + (1,) * (values.ndim - 1))
            out = (out / np.maximum(count, 1)).astype(out.dtype, copy=False)
        return out
    if reduce == "mul":
        out = np.ones(out_shape, dtype=values.dtype)
        np.multiply.at(out, index, values)
    else:
        fill = np.inf if values.dtype.kind == "f" else np.iinfo(values.dtype).max
        out = np.full(out_shape, fill if reduce == "min" else -fill, dtype=values.dtype)
        (np.minimum if reduce == "min" else np.maximum).at(out, index, values)
    empty = np.bincount(index, minlength=size) == 0
    out[empty] = 0
    return out


def degree(index: Any, num_nodes: int | None = None, dtype: Any = np.float32) -> np.ndarray:
    """How often each node id occurs in ``index`` (PyG's ``degree(edge_index[0])`` is the out-degree);
    ``num_nodes`` entries (default ``max + 1``), as ``dtype`` (PyG's default is float)."""
    idx = np.asarray(index)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise DataError(f"degree: index must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    n = (int(idx.max()) + 1 if idx.size else 0) if num_nodes is None else int(num_nodes)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise DataError(f"degree: ids outside [0, {n})")
    return np.bincount(idx, minlength=n).astype(dtype)


def coalesce(edge_index: Any, edge_attr: Any = _MISSING, num_nodes: int | None = None, reduce: str = "sum",
             sort_by_row: bool = True) -> Any:
    """Sort by (row, col) (or (col, row) when ``sort_by_row=False``) and merge repeated edges,
    reducing their features with ``reduce`` (PyG's ``coalesce``)."""
    if isinstance(edge_attr, (int, np.integer)) and not isinstance(edge_attr, bool):
        num_nodes, edge_attr = int(edge_attr), _MISSING  # PyG accepts coalesce(edge_index, num_nodes)
    ei, n = _check_edge_index(edge_index, num_nodes, "coalesce")
    first, second = (ei[0], ei[1]) if sort_by_row else (ei[1], ei[0])
    key = first * max(n, 1) + second
    perm = np.argsort(key, kind="stable")
    key = key[perm]
    keep = np.ones(key.shape[0], dtype=bool)
    keep[1:] = key[1:] > key[:-1]
    out = ei[:, perm][:, keep]
    if edge_attr is _MISSING:
        return out
    if edge_attr is None:
        return out, None
    attrs = edge_attr if isinstance(edge_attr, (list, tuple)) else [edge_attr]
    group = np.cumsum(keep) - 1
    merged = [scatter_rows(_attr(a, ei.shape[1], "coalesce")[perm], group, int(keep.sum()), reduce, "coalesce")
              for a in attrs]
    return out, (merged if isinstance(edge_attr, (list, tuple)) else merged[0])


def to_undirected(edge_index: Any, edge_attr: Any = _MISSING, num_nodes: int | None = None,
                  reduce: str = "add") -> Any:
    """Every edge ``(i, j)`` also as ``(j, i)``, coalesced (sorted by row, repeated edges merged
    with ``reduce``).  As PyG, an int second argument is ``num_nodes``, and the result is a tuple
    ``(edge_index, edge_attr)`` whenever ``edge_attr`` is passed."""
    if isinstance(edge_attr, (int, np.integer)) and not isinstance(edge_attr, bool):
        num_nodes, edge_attr = int(edge_attr), _MISSING
    ei, n = _check_edge_index(edge_index, num_nodes, "to_undirected")
    both = np.concatenate([ei, ei[::-1]], axis=1)
    if edge_attr is _MISSING or edge_attr is None:
        return coalesce(both, edge_attr, n, reduce)
    attrs = edge_attr if isinstance(edge_attr, (list, tuple)) else [edge_attr]
    doubled = [np.concatenate([a, a], axis=0) for a in (_attr(a, ei.shape[1], "to_undirected") for a in attrs)]
    return coalesce(both, doubled if isinstance(edge_attr, (list, tuple)) else doubled[0], n, reduce)


def is_undirected(edge_index: Any, num_nodes: int | None = None) -> bool:
    """Whether every edge ``(i, j)`` has its reverse ``(j, i)``, as often as it occurs itself
    (PyG compares the row-sorted edges with the column-sorted ones, repeats included)."""
    ei, n = _check_edge_index(edge_index, num_nodes, "is_undirected")
    by_row = ei[:, np.lexsort((ei[1], ei[0]))]
    by_col = ei[:, np.lexsort((ei[0], ei[1]))]
    return bool(np.array_equal(by_row, by_col[::-1]))


def contains_self_loops(edge_index: Any) -> bool:
    ei, _ = _check_edge_index(edge_index, None, "contains_self_loops")
    return bool((ei[0] == ei[1]).any())


def remove_self_loops(edge_index: Any, edge_attr: Any = None) -> tuple[np.ndarray, Any]:
    """``(edge_index, edge_attr)`` without the columns whose source equals its target (order kept)."""
    ei, _ = _check_edge_index(edge_index, None, "remove_self_loops")
    keep = ei[0] != ei[1]
    return ei[:, keep], (None if edge_attr is None else _attr(edge_attr, ei.shape[1], "remove_self_loops")[keep])


def add_self_loops(edge_index: Any, edge_attr: Any = None, fill_value: Any = None,
                   num_nodes: int | None = None) -> tuple[np.ndarray, Any]:
    """Append a loop ``(i, i)`` for every node ``i`` after the existing edges (even where one exists,
    as PyG).  The loops' features: 1 (``fill_value=None``), a constant or a row to repeat, or a
    reduction (``"add"``, ``"mean"``, ``"min"``, ``"max"``, ``"mul"``) of each node's incoming
    edge features."""
    ei, n = _check_edge_index(edge_index, num_nodes, "add_self_loops")
    loops = np.tile(np.arange(n, dtype=np.int64), (2, 1))
    full = np.concatenate([ei, loops], axis=1)
    if edge_attr is None:
        return full, None
    attr = _attr(edge_attr, ei.shape[1], "add_self_loops")
    shape = (n,) + attr.shape[1:]
    if fill_value is None:
        loop_attr = np.ones(shape, dtype=attr.dtype)
    elif isinstance(fill_value, str):
        loop_attr = scatter_rows(attr, ei[1], n, fill_value, "add_self_loops").astype(attr.dtype, copy=False)
    else:
        try:
            loop_attr = np.broadcast_to(np.asarray(fill_value, dtype=attr.dtype), shape).copy()
        except ValueError:
            raise DataError(f"add_self_loops: fill_value of shape {np.shape(fill_value)} does not fit edge "
                            f"features of shape {attr.shape[1:]}") from None
    return full, np.concatenate([attr, loop_attr], axis=0)


def _node_ids(nodes: Any, where: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(nodes))
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iub"):
        raise DataError(f"{where}: nodes must be a bool mask or 1-D integer ids, got {arr.dtype} {arr.shape}")
    return arr


def subgraph(subset: Any, edge_index: Any, edge_attr: Any = None, relabel_nodes: bool = False,
             num_nodes: int | None = None, *, return_edge_mask: bool = False) -> tuple:
    """The edges whose both ends are in ``subset`` (ids or a bool mask), in their original order;
    ``relabel_nodes`` renumbers node ``subset[k]`` as ``k``.  Returns ``(edge_index, edge_attr)``
    (``, edge_mask`` with ``return_edge_mask``)."""
    sub = _node_ids(subset, "subgraph")
    if sub.dtype == bool:
        ei, n = _check_edge_index(edge_index, sub.shape[0], "subgraph")
        node_mask, sub = sub, np.flatnonzero(sub)
    else:
        ei, n = _check_edge_index(edge_index, num_nodes, "subgraph")
        sub = sub.astype(np.int64, copy=False)
        if sub.size and (sub.min() < 0 or sub.max() >= n):
            raise DataError(f"subgraph: subset ids outside [0, {n})")
        node_mask = np.zeros(n, dtype=bool)
        node_mask[sub] = True
    edge_mask = node_mask[ei[0]] & node_mask[ei[1]]
    out = ei[:, edge_mask]
    attr = None if edge_attr is None else _attr(edge_attr, ei.shape[1], "subgraph")[edge_mask]
    if relabel_nodes:
        mapping = np.full(n, -1, dtype=np.int64)
        mapping[sub] = np.arange(sub.shape[0])
        out = mapping[out]
    return (out, attr, edge_mask) if return_edge_mask else (out, attr)


def k_hop_subgraph(node_idx: Any, num_hops: int, edge_index: Any, relabel_nodes: bool = False,
                   num_nodes: int | None = None, flow: str = "source_to_target",
                   directed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Nodes that reach ``node_idx`` within ``num_hops`` hops (``flow="source_to_target"``: along
    the edges into them) and the sub-graph they induce.  Returns ``(subset, edge_index, mapping,
    edge_mask)`` as PyG: ``subset`` sorted, ``mapping`` the positions of ``node_idx`` in it;
    ``directed=True`` keeps only the edges walked."""
    if flow not in ("source_to_target", "target_to_source"):
        raise DataError(f"k_hop_subgraph: flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    if int(num_hops) != num_hops or num_hops < 0:
        raise DataError(f"k_hop_subgraph: num_hops must be a non-negative integer, got {num_hops!r}")
    ei, n = _check_edge_index(edge_index, num_nodes, "k_hop_subgraph")
    row, col = (ei[0], ei[1]) if flow == "target_to_source" else (ei[1], ei[0])
    seeds = _node_ids(node_idx, "k_hop_subgraph")
    if seeds.dtype == bool or (seeds.size and (seeds.min() < 0 or seeds.max() >= n)):
        raise DataError(f"k_hop_subgraph: node_idx must be integer ids in [0, {n})")
    seeds = seeds.astype(np.int64, copy=False)
    subsets = [seeds]
    walked = np.zeros(ei.shape[1], dtype=bool)
    for _ in range(int(num_hops)):
        node_mask = np.zeros(n, dtype=bool)
        node_mask[subsets[-1]] = True
        edge_mask = node_mask[row]
        walked |= edge_mask
        subsets.append(col[edge_mask])
    subset, inv = np.unique(np.concatenate(subsets), return_inverse=True)
    inv = inv.reshape(-1)[:seeds.shape[0]]
    node_mask = np.zeros(n, dtype=bool)
    node_mask[subset] = True
    edge_mask = walked if directed else node_mask[row] & node_mask[col]
    out = ei[:, edge_mask]
    if relabel_nodes:
        mapping = np.full(n, -1, dtype=np.int64)
        mapping[subset] = np.arange(subset.shape[0])
        out = mapping[out]
    return subset, out, inv.astype(np.int64), edge_mask

