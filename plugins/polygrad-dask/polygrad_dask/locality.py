"""Cheap node orderings that put neighbours in the same row block, and the edge cut they give.

Row blocks are contiguous ranges of node ids (``chunks.bounds``), so which nodes share a worker is
decided by their numbering.  Relabelling the graph by a locality ordering before writing its
shards (``relabel``) lowers the *edge cut* -- the edges whose endpoints lie in different row
blocks -- and with it the *halo*: the remote rows a block fetches per product, which is what a
step moves between workers (``halo_stats``).  The orderings are the cheap ones scipy offers:

* ``"rcm"``    reverse Cuthill-McKee (``scipy.sparse.csgraph``): a BFS that visits low-degree
               nodes first; bands the adjacency, so neighbours get near ids
* ``"degree"`` nodes by decreasing degree (hubs together)

A uniform random graph is an expander: no ordering lowers its cut much (measured by
``python -m benchmarks dask``); graphs with locality (meshes, road networks, many real graphs
with community structure) gain the most.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from polygrad.errors import DataError

from . import chunks, partition

METHODS = ("contiguous", "rcm", "degree")


def _edges(edge_index: Any, num_nodes: int, where: str) -> np.ndarray:
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise DataError(f"{where}: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise DataError(f"{where}: edge_index refers to nodes outside [0, {num_nodes})")
    return ei


def _symmetric(ei: np.ndarray, n: int) -> sp.csr_matrix:
    ones = np.ones(ei.shape[1], dtype=np.int8)
    a = sp.csr_matrix((ones, (ei[0], ei[1])), shape=(n, n))
    return (a + a.T).tocsr()


def locality_order(edge_index: Any, num_nodes: int, method: str = "rcm") -> np.ndarray:
    """``order``: the old id of each new id (node ``order[k]`` becomes node ``k``), by ``method``
    (one of :data:`METHODS`; ``"contiguous"`` is the identity)."""
    if method not in METHODS:
        raise ValueError(f"locality_order: method must be one of {METHODS}, got {method!r}")
    ei = _edges(edge_index, num_nodes, "locality_order")
    n = int(num_nodes)
    if method == "contiguous" or n == 0:
        return np.arange(n, dtype=np.int64)
    if method == "degree":
        deg = np.bincount(ei[0], minlength=n) + np.bincount(ei[1], minlength=n)
        return np.argsort(-deg, kind="stable").astype(np.int64)
    return csgraph.reverse_cuthill_mckee(_symmetric(ei, n), symmetric_mode=True).astype(np.int64)


def relabel(edge_index: Any, order: np.ndarray) -> np.ndarray:
    """``edge_index`` with node ``order[k]`` renamed ``k`` (features and labels: ``x[order]``)."""
    order = np.asarray(order, dtype=np.int64)
    ei = _edges(edge_index, order.shape[0], "relabel")
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.shape[0], dtype=np.int64)
    return new_id[ei]


def halo_stats(edge_index: Any, num_nodes: int, partitions: int | None = None) -> dict:
    """The edge cut and halo of ``edge_index`` split into ``partitions`` near-equal contiguous row
    blocks (default: the backend's count; rows are ``edge_index[0]``, as ``pg.from_edge_index``): ``cut_edges``
    (edges between blocks), ``cut_fraction``, and ``halo_rows`` -- the remote rows all blocks
    fetch per SpMM (a product with F columns of itemsize b moves ``halo_rows * F * b`` bytes, its
    transpose the same; a nearly complete halo counts as its whole block, which the partition then
    takes: ``partition.WHOLE_HALO_FRACTION``) -- and ``edge_imbalance``, the most edges in one block over the mean: an
    ordering that cuts few edges by piling them into one block has not helped."""
    ei = _edges(edge_index, num_nodes, "halo_stats")
    n, blocks = int(num_nodes), max(int(partitions or chunks.partitions), 1)
    base, extra = divmod(n, blocks)     # chunks.row_chunks' split, without its minimum block size
    bounds = np.concatenate([[0], np.cumsum([base + (i < extra) for i in range(blocks)])]).astype(np.int64)
    row_block = np.searchsorted(bounds[1:-1], ei[0], side="right")
    col_block = np.searchsorted(bounds[1:-1], ei[1], side="right")
    cross = row_block != col_block
    cut = int(cross.sum())
    # distinct (row block, remote column) pairs: each is one row fetched per product
    pairs = np.unique(row_block[cross].astype(np.int64) * max(n, 1) + ei[1][cross])
    # ... counted per (row block, column block), and as the whole column block where the partition
    # takes it whole (a nearly complete halo: partition.takes_whole)
    pair_col_block = np.searchsorted(bounds[1:-1], pairs % max(n, 1), side="right")
    counts = np.bincount((pairs // max(n, 1)) * blocks + pair_col_block, minlength=blocks * blocks)
    sizes = np.diff(bounds)
    halo = sum(int(sizes[k % blocks]) if partition.takes_whole(int(c), int(sizes[k % blocks])) else int(c)
               for k, c in enumerate(counts) if c)
    per_block = np.bincount(row_block, minlength=blocks)
    return {"partitions": blocks, "edges": int(ei.shape[1]), "cut_edges": cut,
            "cut_fraction": cut / max(int(ei.shape[1]), 1), "halo_rows": int(halo),
            "edge_imbalance": float(per_block.max() / max(per_block.mean(), 1e-30)) if ei.size else 1.0}
