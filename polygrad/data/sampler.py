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

from ..errors import DataError
from .preprocess import as_generator

__all__ = ["NeighborSampler", "SampledGraph"]


@dataclass
class SampledGraph:
    """One mini-batch: ``n_id`` (global ids, seeds first), ``edge_index`` (local ids, source row 0,
    destination row 1), ``batch_size`` (the first ``batch_size`` local nodes are the seeds)."""

    n_id: np.ndarray
    edge_index: np.ndarray
    batch_size: int

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.shape[0])


class NeighborSampler:
    """Iterate mini-batches of ``batch_size`` seed nodes with per-hop neighbour fan-outs.

    ``edge_index``: PyG ``[2, E]`` (messages flow row 0 -> row 1; a destination samples among its
    sources).  ``fanouts``: one count per layer, first hop first; ``-1`` takes every neighbour.
    ``input_nodes``: the seed pool (bool mask or ids; default all nodes).  ``shuffle`` reorders
    the seeds each epoch from the seeded generator.
    """

    def __init__(self, edge_index: Any, num_nodes: int, fanouts: Sequence[int], batch_size: int = 512,
                 input_nodes: Any = None, shuffle: bool = True, seed: Any = 0):
        ei = np.asarray(edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
            raise DataError(f"NeighborSampler: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
        self.num_nodes = int(num_nodes)
        if ei.size and (ei.min() < 0 or ei.max() >= self.num_nodes):
            raise DataError(f"NeighborSampler: edge_index refers to nodes outside [0, {self.num_nodes})")
        self.fanouts = [int(f) for f in fanouts]
        if not self.fanouts or any(f == 0 or f < -1 for f in self.fanouts):
            raise DataError(f"NeighborSampler: fanouts must be positive counts (or -1 for all), got {list(fanouts)}")
        if batch_size < 1:
            raise DataError(f"NeighborSampler: batch_size must be >= 1, got {batch_size}")
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
            nodes = np.asarray(input_nodes)
            self.input_nodes = np.flatnonzero(nodes) if nodes.dtype == bool else nodes.astype(np.int64)
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
            raise DataError(f"NeighborSampler.sample: seeds must be 1-D integer node ids, got {seeds.dtype} {seeds.shape}")
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
        return SampledGraph(n_id=nodes, edge_index=edge_index, batch_size=int(seeds.shape[0]))
