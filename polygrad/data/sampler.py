"""Mini-batch training on big graphs: :class:`NeighborSampler` (GraphSAGE fan-outs, PyG's
``NeighborLoader``).

For each batch of seed nodes it samples, hop by hop, up to ``fanouts[l]`` incoming neighbours
(without replacement) of the nodes discovered at the previous hop, and yields the induced
sub-graph of the sampled edges as a :class:`SampledGraph`: local node ids with the seeds first
(``n_id[:batch_size]``), an ``edge_index`` over local ids, and the global ids to gather features
and labels with.  A model run on it (as many layers as hops) gives exact-neighbourhood outputs
for the seeds under the sample.

Sampling is vectorised numpy over the CSR of incoming edges (no Python loop over nodes); the
generator is seeded, so the same seed yields the same batches.  Which neighbours a node keeps
depends only on the batch's key (one draw from the generator per batch), the hop, the node and
the candidate edge (a counter-based hash, :func:`edge_keys`), never on which other nodes share
the hop or on how the graph is stored: a sampler whose rows are split across machines
(``polygrad_dask.DaskNeighborSampler``) draws exactly the batches of this one.  Memory per batch is bounded by
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

__all__ = ["NeighborSampler", "SampledGraph", "check_edge_index", "edge_keys", "incoming_csr", "sample_rows"]


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
        ei = check_edge_index(edge_index, num_nodes, "NeighborSampler")
        self._configure(num_nodes, fanouts, batch_size, input_nodes, shuffle, seed, x, y)
        # CSR of incoming edges: the sources of destination v are src[indptr[v]:indptr[v+1]]
        self.indptr, self.src = incoming_csr(ei[0], ei[1], 0, self.num_nodes)
        self._seen = np.full(self.num_nodes, -1, dtype=np.int64)  # global -> local id scratch, reset per batch

    def _configure(self, num_nodes: int, fanouts: Sequence[int], batch_size: int, input_nodes: Any, shuffle: bool,
                   seed: Any, x: Any, y: Any) -> None:
        """Check and keep everything but the graph (shared with samplers that store it elsewhere)."""
        self.num_nodes = int(num_nodes)
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
        if input_nodes is None:
            self.input_nodes = np.arange(self.num_nodes, dtype=np.int64)
        else:
            self.input_nodes = _input_nodes(input_nodes, self.num_nodes)
        self.x = _node_rows(x, self.num_nodes, "x")
        self.y = _node_rows(y, self.num_nodes, "y")

    def __len__(self) -> int:
        return -(-self.input_nodes.shape[0] // self.batch_size)

    def __iter__(self) -> Iterator[SampledGraph]:
        seeds = self.rng.permutation(self.input_nodes) if self.shuffle else self.input_nodes
        for start in range(0, seeds.shape[0], self.batch_size):
            yield self.sample(seeds[start:start + self.batch_size])

    def _neighbours(self, nodes: np.ndarray, fanout: int, key: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
        """(sources, index into ``nodes`` of the destination) of the sampled incoming edges of
        ``nodes``, ordered by destination then source (:func:`sample_rows`)."""
        return sample_rows(self.indptr, self.src, nodes, nodes, fanout, key, hop)

    def _numbering(self, seeds: np.ndarray) -> "_Numbering":
        return _Numbering(seeds, self._seen)

    def sample(self, seeds: Any) -> SampledGraph:
        """The sampled sub-graph around ``seeds`` (global ids, distinct)."""
        seeds = self._check_seeds(seeds)
        key = int(self.rng.integers(0, 2**63 - 1))   # this batch's draws (edge_keys): one per batch
        ids = self._numbering(seeds)
        start, frontier = 0, seeds
        srcs, dsts = [], []
        try:
            for hop, fanout in enumerate(self.fanouts):
                src, owner = self._neighbours(frontier, fanout, key, hop)
                srcs.append(ids.add(src))
                dsts.append(owner + start)       # the frontier's local ids are start, start + 1, ...
                start, frontier = start + frontier.shape[0], ids.newest
            nodes = ids.nodes()
            edge_index = np.stack([np.concatenate(srcs), np.concatenate(dsts)])
        finally:
            ids.release()
        x, y = self._node_values(nodes)
        return SampledGraph(n_id=nodes, edge_index=edge_index, batch_size=int(seeds.shape[0]), x=x, y=y)

    def _node_values(self, nodes: np.ndarray) -> tuple[Any, Any]:
        """The feature and label rows of ``nodes`` (None where the sampler has none)."""
        return (None if self.x is None else _take(self.x, nodes),
                None if self.y is None else self.y[nodes])

    def _check_seeds(self, seeds: Any) -> np.ndarray:
        seeds = np.asarray(seeds)
        if seeds.ndim != 1 or (seeds.size and seeds.dtype.kind not in "iu"):
            raise DataError(f"NeighborSampler.sample: seeds must be 1-D integer node ids, "
                            f"got {seeds.dtype} {seeds.shape}")
        seeds = seeds.astype(np.int64, copy=False)
        if seeds.size and (seeds.min() < 0 or seeds.max() >= self.num_nodes):
            raise DataError(f"NeighborSampler.sample: seeds outside [0, {self.num_nodes})")
        if np.unique(seeds).shape[0] != seeds.shape[0]:
            raise DataError("NeighborSampler.sample: seeds must be distinct")
        return seeds

    @classmethod
    def from_data(cls, data: Data, fanouts: Sequence[int], batch_size: int = 512, input_nodes: Any = None,
                  shuffle: bool = True, seed: Any = 0) -> "NeighborSampler":
        """PyG's ``NeighborLoader(data, num_neighbors=fanouts, batch_size=..., input_nodes=...)``."""
        if not isinstance(data, Data) or data.edge_index is None:
            raise DataError("NeighborSampler.from_data: needs a polygrad.data.Data with an edge_index")
        return cls(data.edge_index, data.num_nodes or 0, fanouts, batch_size=batch_size, input_nodes=input_nodes,
                   shuffle=shuffle, seed=seed, x=data.x, y=data.y)


def check_edge_index(edge_index: Any, num_nodes: int, what: str) -> np.ndarray:
    """``edge_index`` as an integer ``[2, E]`` array with ids in ``[0, num_nodes)``, or a DataError."""
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise DataError(f"{what}: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= int(num_nodes)):
        raise DataError(f"{what}: edge_index refers to nodes outside [0, {int(num_nodes)})")
    return ei


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


class _Numbering:
    """Global -> local ids of one batch: the seeds first, then each hop's new nodes in increasing
    global id.  With ``scratch`` (an all ``-1`` array of one slot per node, restored by
    :meth:`release`) a lookup is O(1); without, a search in the sorted ids seen so far (no O(N)
    array: what a client that does not hold the graph uses).  Both number alike."""

    def __init__(self, seeds: np.ndarray, scratch: np.ndarray | None = None) -> None:
        self.scratch = scratch
        self.parts = [seeds]
        self.count = seeds.shape[0]
        self.newest = seeds
        if scratch is not None:
            scratch[seeds] = np.arange(seeds.shape[0])
        else:
            order = np.argsort(seeds, kind="stable")
            self.known, self.local = seeds[order], order.astype(np.int64)

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        """Local id of each of ``ids``, -1 where not numbered yet."""
        if self.scratch is not None:
            return self.scratch[ids]
        if self.known.shape[0] == 0:
            return np.full(ids.shape[0], -1, dtype=np.int64)
        pos = np.searchsorted(self.known, ids)
        pos[pos == self.known.shape[0]] = 0
        return np.where(self.known[pos] == ids, self.local[pos], -1)

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Number the ids not seen yet (in increasing order) and return the local ids of all."""
        local = self._lookup(ids)
        fresh = np.unique(ids[local < 0])
        numbers = np.arange(self.count, self.count + fresh.shape[0], dtype=np.int64)
        self.count += fresh.shape[0]
        self.parts.append(fresh)
        self.newest = fresh
        if self.scratch is not None:
            self.scratch[fresh] = numbers
            return self.scratch[ids]
        merged = np.concatenate([self.known, fresh])
        order = np.argsort(merged, kind="stable")
        self.known, self.local = merged[order], np.concatenate([self.local, numbers])[order]
        return self._lookup(ids)

    def nodes(self) -> np.ndarray:
        return np.concatenate(self.parts)

    def release(self) -> None:
        if self.scratch is not None:
            self.scratch[np.concatenate(self.parts)] = -1        # O(batch) reset, not O(N)


def incoming_csr(src: Any, dst: Any, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, sources) of the incoming edges of the destinations ``lo .. hi-1``: the sources of
    destination ``lo + v`` are ``sources[indptr[v]:indptr[v + 1]]``, in increasing order (repeated
    edges kept).  ``src`` / ``dst``: the edges (all with ``lo <= dst < hi``).  The order inside a
    row is fixed by the ids alone, so every holder of a row samples it alike."""
    dst = np.asarray(dst).astype(np.int64, copy=False) - lo
    src = np.asarray(src).astype(np.int64, copy=False)
    order = np.lexsort((src, dst))
    indptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=hi - lo), out=indptr[1:])
    return indptr, src[order]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic): a counter-based generator,
    every output a function of its input alone."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def edge_keys(key: int, hop: int, dst: np.ndarray, src: np.ndarray, copy: np.ndarray | None = None) -> np.ndarray:
    """Random uint64 key of each candidate edge ``src -> dst`` at ``hop`` of the batch ``key``:
    a node keeps the ``fanout`` candidates with the smallest keys (a uniform sample without
    replacement).  A hash of its arguments, so independent of everything else sampled.  ``copy``
    numbers repeated edges (0 for the first ``src -> dst``, 1 for the next, ...): without it the
    copies of an edge would share one key and be kept or dropped together."""
    base = _splitmix(np.array([key % 2**64], dtype=np.uint64) ^ np.uint64(hop))
    keys = _splitmix(_splitmix(base ^ dst.astype(np.uint64)) ^ src.astype(np.uint64))
    if copy is not None:
        again = copy > 0
        if again.any():
            keys[again] = _splitmix(keys[again] ^ copy[again].astype(np.uint64))
    return keys


def _copy_numbers(owner: np.ndarray, src: np.ndarray) -> np.ndarray:
    """For candidates listed row by row with each row's sources in increasing order (the CSR of
    :func:`incoming_csr`), which copy of its ``(row, source)`` pair each one is: 0, 1, ..."""
    index = np.arange(owner.shape[0], dtype=np.int64)
    first = np.ones(owner.shape[0], dtype=bool)
    first[1:] = (owner[1:] != owner[:-1]) | (src[1:] != src[:-1])
    return index - np.maximum.accumulate(np.where(first, index, 0))


def sample_rows(indptr: np.ndarray, sources: np.ndarray, rows: np.ndarray, ids: np.ndarray, fanout: int,
                key: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample up to ``fanout`` (``-1``: all) incoming edges of each of ``rows`` (local rows of the
    CSR ``indptr`` / ``sources`` from :func:`incoming_csr`; ``ids`` their global ids, which the
    keys hash).  Returns (global source ids, index into ``rows`` of each edge's destination),
    ordered by destination then source.  Vectorised: each candidate gets its :func:`edge_keys`
    key and the ``fanout`` smallest per row win."""
    start, deg = indptr[rows], indptr[rows + 1] - indptr[rows]
    total = int(deg.sum())
    if total == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    owner = np.repeat(np.arange(rows.shape[0], dtype=np.int64), deg)   # which row
    first = np.cumsum(deg) - deg
    pos = np.arange(total, dtype=np.int64) - first[owner]               # rank within its row's list
    edge = start[owner] + pos
    if fanout >= 0 and (deg > fanout).any():
        src = sources[edge]
        keys = edge_keys(key, hop, ids[owner], src, _copy_numbers(owner, src))
        order = np.lexsort((keys, owner))                                # by row, then random key
        rank = np.empty(total, dtype=np.int64)
        rank[order] = pos                                                # pos is 0.. within each row, in order
        keep = rank < fanout                                             # a mask: the CSR order stays
        edge, owner = edge[keep], owner[keep]
    return sources[edge], owner
