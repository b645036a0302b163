"""Mini-batch training on big graphs: :class:`NeighborSampler` (GraphSAGE fan-outs, PyG's
``NeighborLoader``).

For each batch of seed nodes it samples, hop by hop, up to ``fanouts[l]`` incoming neighbours
(without replacement) of the nodes discovered at the previous hop, and yields the induced
sub-graph of the sampled edges as a :class:`SampledGraph`: local node ids with the seeds first
(``n_id[:batch_size]``), an ``edge_index`` over local ids, and the global ids to gather features
and labels with.  A model run on it (as many layers as hops) gives exact-neighbourhood outputs
for the seeds under the sample.

Sampling is vectorised numpy over the CSR of incoming edges (no Python loop over nodes); the
generator is seeded, so the same seed yields the same batches.  Memory per batch is bounded by
``batch_size * prod(1 + fanouts)`` nodes, independent of the graph's size; the CSR itself is
built once (O(E)).  A sampler keeps one node-id scratch array: use one sampler per thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..ir.errors import DataError
from .data import Data
from .csr import CSRMatrix
from .seeds import as_generator

__all__ = ["NeighborSampler", "SampledGraph"]


@dataclass
class SampledGraph:
    """One mini-batch: ``n_id`` (global ids, seeds first), ``edge_index`` (local ids, source row 0,
    destination row 1), ``batch_size`` (the first ``batch_size`` local nodes are the seeds)."""

    n_id: np.ndarray
    edge_index: np.ndarray
    batch_size: int
    x: Any = None  # feature rows of n_id, when the sampler was given x (PyG's NeighborLoader batch.x)
    y: Any = None  # labels of n_id, when the sampler was given y

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.shape[0])

    def to_data(self) -> Data:
        """The batch as a :class:`~polygrad.data.Data` (``x``, ``y``, ``edge_index``, ``n_id``,
        ``batch_size``), as PyG's ``NeighborLoader`` yields."""
        return Data(x=self.x, edge_index=self.edge_index, y=self.y, n_id=self.n_id, batch_size=self.batch_size,
                    num_nodes=self.num_nodes)


class NeighborSampler:
    """Iterate mini-batches of ``batch_size`` seed nodes with per-hop neighbour fan-outs.

    ``edge_index``: PyG ``[2, E]`` (messages flow row 0 -> row 1; a destination samples among its
    sources).  ``fanouts``: one count per layer, first hop first; ``-1`` takes every neighbour.
    ``input_nodes``: the seed pool (bool mask or ids; default all nodes).  ``shuffle`` reorders
    the seeds each epoch from the seeded generator (a new order every epoch, the same sequence
    of orders for the same seed).  ``x`` / ``y``: node features (numpy or :class:`CSRMatrix`) and
    labels; when given, each batch carries the rows of its nodes (``batch.x``, ``batch.y``), as
    PyG's ``NeighborLoader``.  :meth:`from_data` builds one from a :class:`Data`.
    """

    def __init__(self, edge_index: Any, num_nodes: int, fanouts: Sequence[int], batch_size: int = 512,
                 input_nodes: Any = None, shuffle: bool = True, seed: Any = 0, *, x: Any = None, y: Any = None):
        ei = np.asarray(edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
            raise DataError(f"NeighborSampler: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
        self.num_nodes = int(num_nodes)
        if ei.size and (ei.min() < 0 or ei.max() >= self.num_nodes):
            raise DataError(f"NeighborSampler: edge_index refers to nodes outside [0, {self.num_nodes})")
        counts: list[Any] = list(fanouts) if isinstance(fanouts, (list, tuple, np.ndarray)) else [fanouts]
        if (not counts or any(isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, np.integer))
                              for f in counts) or any(f == 0 or f < -1 for f in counts)):
            raise DataError(f"NeighborSampler: fanouts must be positive integer counts (or -1 for all), "
                            f"got {counts}")
        self.fanouts = [int(f) for f in counts]
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise DataError(f"NeighborSampler: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.rng = as_generator(seed, "NeighborSampler: seed")
        # CSR of incoming edges: the sources of destination v are src[indptr[v]:indptr[v+1]]
        dst, src = ei[1].astype(np.int64), ei[0].astype(np.int64)
        order = np.argsort(dst, kind="stable")
        self.src = src[order]
        self.indptr = np.zeros(self.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=self.num_nodes), out=self.indptr[1:])
        if input_nodes is None:
            self.input_nodes = np.arange(self.num_nodes, dtype=np.int64)
        else:
            self.input_nodes = _input_nodes(input_nodes, self.num_nodes)
        self.x = _node_rows(x, self.num_nodes, "x")
        self.y = _node_rows(y, self.num_nodes, "y")
        self._seen = np.full(self.num_nodes, -1, dtype=np.int64)  # global -> local id scratch, reset per batch

    def __len__(self) -> int:
        return -(-self.input_nodes.shape[0] // self.batch_size)

    def __iter__(self) -> Iterator[SampledGraph]:
        seeds = self.rng.permutation(self.input_nodes) if self.shuffle else self.input_nodes
        for start in range(0, seeds.shape[0], self.batch_size):
            yield self.sample(seeds[start:start + self.batch_size])

    def _neighbours(self, nodes: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray]:
        """(sources, destinations) of up to ``fanout`` sampled incoming edges per node, vectorised:
        each candidate edge gets a random key and the ``fanout`` smallest keys per node win."""
        start, deg = self.indptr[nodes], self.indptr[nodes + 1] - self.indptr[nodes]
        total = int(deg.sum())
        if total == 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        owner = np.repeat(np.arange(nodes.shape[0]), deg)            # which frontier node
        first = np.cumsum(deg) - deg
        pos = np.arange(total, dtype=np.int64) - first[owner]        # rank within its node's list
        edge = start[owner] + pos
        if fanout >= 0 and (deg > fanout).any():
            keys = self.rng.random(total)
            order = np.lexsort((keys, owner))                        # by node, then random key
            rank = np.empty(total, dtype=np.int64)
            rank[order] = pos                                        # pos is 0.. within each node, in order
            keep = rank < fanout
            edge, owner = edge[keep], owner[keep]
        return self.src[edge], nodes[owner]

    def sample(self, seeds: Any) -> SampledGraph:
        """The sampled sub-graph around ``seeds`` (global ids, distinct)."""
        seeds = np.asarray(seeds)
        if seeds.ndim != 1 or (seeds.size and seeds.dtype.kind not in "iu"):
            raise DataError(f"NeighborSampler.sample: seeds must be 1-D integer node ids, "
                            f"got {seeds.dtype} {seeds.shape}")
        seeds = seeds.astype(np.int64, copy=False)
        if seeds.size and (seeds.min() < 0 or seeds.max() >= self.num_nodes):
            raise DataError(f"NeighborSampler.sample: seeds outside [0, {self.num_nodes})")
        if np.unique(seeds).shape[0] != seeds.shape[0]:
            raise DataError("NeighborSampler.sample: seeds must be distinct")
        seen = self._seen
        n_id = [seeds]
        seen[seeds] = np.arange(seeds.shape[0])
        count = seeds.shape[0]
        frontier = seeds
        srcs, dsts = [], []
        try:
            for fanout in self.fanouts:
                src, dst = self._neighbours(frontier, fanout)
                fresh = np.unique(src[seen[src] < 0])                # nodes new at this hop
                seen[fresh] = np.arange(count, count + fresh.shape[0])
                count += fresh.shape[0]
                n_id.append(fresh)
                srcs.append(seen[src])
                dsts.append(seen[dst])
                frontier = fresh
            nodes = np.concatenate(n_id)
            edge_index = np.stack([np.concatenate(srcs), np.concatenate(dsts)])
        finally:
            seen[np.concatenate(n_id)] = -1                          # O(batch) reset, not O(N)
        return SampledGraph(n_id=nodes, edge_index=edge_index, batch_size=int(seeds.shape[0]),
                            x=None if self.x is None else _take(self.x, nodes),
                            y=None if self.y is None else self.y[nodes])

    @classmethod
    def from_data(cls, data: Data, fanouts: Sequence[int], batch_size: int = 512, input_nodes: Any = None,
                  shuffle: bool = True, seed: Any = 0) -> "NeighborSampler":
        """PyG's ``NeighborLoader(data, num_neighbors=fanouts, batch_size=..., input_nodes=...)``."""
        if not isinstance(data, Data) or data.edge_index is None:
            raise DataError("NeighborSampler.from_data: needs a polygrad.data.Data with an edge_index")
        return cls(data.edge_index, data.num_nodes or 0, fanouts, batch_size=batch_size, input_nodes=input_nodes,
                   shuffle=shuffle, seed=seed, x=data.x, y=data.y)


def _input_nodes(nodes: Any, num_nodes: int) -> np.ndarray:
    """Seed ids from a bool mask or integer ids; float ids are refused, never truncated."""
    arr = np.asarray(nodes)
    if arr.ndim != 1:
        raise DataError(f"NeighborSampler: input_nodes must be a 1-D bool mask or integer ids, got shape {arr.shape}")
    if arr.dtype == bool:
        if arr.shape[0] != num_nodes:
            raise DataError(f"NeighborSampler: input_nodes mask has {arr.shape[0]} entries for {num_nodes} nodes")
        return np.flatnonzero(arr)
    if arr.size and arr.dtype.kind not in "iu":
        raise DataError(f"NeighborSampler: input_nodes must be a bool mask or integer node ids, got dtype "
                        f"{arr.dtype} (float ids would be truncated)")
    ids = arr.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise DataError(f"NeighborSampler: input_nodes outside [0, {num_nodes}): "
                        f"range [{int(ids.min())}, {int(ids.max())}]")
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise DataError("NeighborSampler: input_nodes holds repeated ids")
    return ids


def _node_rows(values: Any, num_nodes: int, name: str) -> Any:
    if values is None:
        return None
    arr = values if isinstance(values, CSRMatrix) else np.asarray(values)
    if arr.shape[0] != num_nodes:
        raise DataError(f"NeighborSampler: {name} has {arr.shape[0]} rows for {num_nodes} nodes")
    return arr


def _take(values: Any, rows: np.ndarray) -> Any:
    return values.take_rows(rows) if isinstance(values, CSRMatrix) else values[rows]
