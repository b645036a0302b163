"""Neighbour-sampled mini-batches drawn by the workers that hold the rows: :class:`DaskNeighborSampler`.

The graph's incoming edges are split into row blocks of destinations; each block's CSR
(``polygrad.data.sampler.incoming_csr``) is built on, and stays on, one worker
(``cluster.placed``).  A batch is sampled hop by hop: the client sends each worker the frontier
nodes in its rows, the worker samples their neighbours (``sample_rows``) and returns only the
sampled edges; the feature and label rows of the batch's nodes are then read, block by block,
on the workers that hold them.  The client holds the seed pool and one batch -- never the graph,
never an ``O(N)`` array -- so a graph too large for it trains in mini-batches.

Which neighbours a node keeps is a hash of the batch's key, the hop and the edge
(``polygrad.data.sampler.edge_keys``), and rows are kept in source order, so the batches are
exactly :class:`polygrad.data.NeighborSampler`'s for the same seed, however many blocks or
workers hold the rows.  Batches are numpy arrays: train the model on them with any backend
(a batch is small; the numpy backend in the client process is the usual choice).

A lost worker's blocks are rebuilt from their lineage (the edges embedded in the building task,
or the shard file) on the worker that replaces it; the batch being drawn waits for them.
"""
from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from polygrad.data.csr import CSRMatrix
from polygrad.data.sampler import NeighborSampler, SampledGraph, _Numbering, check_edge_index, incoming_csr
from polygrad.data.sampler import _take as take_rows, sample_rows
from polygrad.errors import DataError

from . import chunks, cluster, memcap

__all__ = ["DaskNeighborSampler"]


class SamplerBlock:
    """One worker's rows of the sampler: destinations ``lo .. hi-1`` and their incoming sources."""

    def __init__(self, lo: int, hi: int, indptr: np.ndarray, sources: np.ndarray) -> None:
        self.lo, self.hi, self.indptr, self.sources = lo, hi, indptr, sources

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.sources.nbytes)


def _build(src: np.ndarray, dst: np.ndarray, lo: int, hi: int, what: str) -> SamplerBlock:
    """On a worker: the block of destinations ``[lo, hi)`` from its edges."""
    memcap.check(what, 8 * (hi - lo + 1) + 24 * src.shape[0])    # indptr, sources, the sort's keys
    indptr, sources = incoming_csr(src, dst, lo, hi)
    return SamplerBlock(lo, hi, indptr, sources)


def _read(path: str, i: int, lo: int, hi: int, n: int) -> SamplerBlock:
    """On a worker: shard ``i``'s block, a row's neighbours being its columns (what ``A @ X``
    aggregates from)."""
    from .shards import _read_arrays

    rows, cols, _ = _read_arrays(path, i, n, np.int8)
    if rows.size and (rows.min() < lo or rows.max() >= hi):
        raise DataError(f"edge shard {i} of {path} has rows outside its block [{lo}, {hi})")
    return _build(cols, rows, lo, hi, f"the sampler's block of edge shard {i} ({rows.shape[0]} edges)")


def _sample(block: SamplerBlock, ids: np.ndarray, fanout: int, key: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """On a worker: the sampled incoming edges of ``ids`` (global ids in this block's rows)."""
    return sample_rows(block.indptr, block.sources, ids - block.lo, ids, fanout, key, hop)


def _take(chunk: Any, rows: np.ndarray) -> np.ndarray:
    return np.asarray(chunk[rows])


def _unwrap(values: Any) -> Any:
    """A pg.Tensor's backend array (a dask array stays on the workers); anything else as given."""
    import polygrad as pg

    return values.array if isinstance(values, pg.Tensor) else values


class DaskNeighborSampler(NeighborSampler):
    """:class:`polygrad.data.NeighborSampler` whose graph lives on the workers, in row blocks.

    ``edge_index`` (PyG ``[2, E]``, messages row 0 -> row 1), ``num_nodes``, ``fanouts``,
    ``batch_size``, ``input_nodes``, ``shuffle``, ``seed``: as ``NeighborSampler``, with the same
    batches for the same seed.  ``x`` / ``y``: numpy arrays (read on the client) or dask arrays /
    dask-backend tensors (their rows read on the workers holding them).  ``partitions``: row
    blocks of destinations (default: the backend's, ``polygrad_dask.chunks``).  :meth:`from_shards`
    reads the graph from edge shards on the workers instead (the client never holds it).
    ``prefetch``: batches drawn ahead, in a background thread, while the caller trains on the
    current one (the draw is mostly waiting for workers: worth it where the client has a core
    of its own); 0, the default, draws each batch when asked.  Whole epochs give the same
    batches either way (one thread draws them, in order); an epoch left early has drawn
    ``prefetch`` batches more from the generator.
    """

    prefetch: int = 0

    def __init__(self, edge_index: Any, num_nodes: int, fanouts: Sequence[int], batch_size: int = 512,
                 input_nodes: Any = None, shuffle: bool = True, seed: Any = 0, *, x: Any = None, y: Any = None,
                 partitions: int | None = None, prefetch: int = 0):
        ei = check_edge_index(edge_index, num_nodes, "DaskNeighborSampler")
        self._configure_rows(num_nodes, fanouts, batch_size, input_nodes, shuffle, seed, x, y, prefetch)
        bounds = _bounds(self.num_nodes, partitions)
        client = cluster.client()
        # the edges of each block travel inside the task that builds it: its lineage, so a lost
        # worker's block is rebuilt without the client
        block = np.searchsorted(np.asarray(bounds[1:-1], dtype=np.int64), ei[1], side="right")
        order = np.argsort(block, kind="stable")
        starts = np.searchsorted(block[order], np.arange(len(bounds)))
        blocks = []
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            sel = order[starts[i]:starts[i + 1]]
            what = f"the sampler's row block {i} ({hi - lo} rows, {sel.shape[0]} edges)"
            blocks.append(_quiet(lambda s=sel, lo=lo, hi=hi, what=what, i=i: client.submit(
                _build, ei[0, s], ei[1, s], lo, hi, what, pure=False, **cluster.placed(client, i))))
        self._hold(bounds, blocks)

    @classmethod
    def from_shards(cls, path: "str | os.PathLike", fanouts: Sequence[int], batch_size: int = 512,
                    input_nodes: Any = None, shuffle: bool = True, seed: Any = 0, *, x: Any = None,
                    y: Any = None, prefetch: int = 0) -> "DaskNeighborSampler":
        """A sampler over the edge shards under ``path`` (``write_edge_shards``), one block per
        shard, read by the workers.  A node's neighbours are the columns of its row -- the nodes
        ``A @ X`` aggregates from -- so the batches are ``NeighborSampler(edge_index[[1, 0]], ...)``'s
        for the ``edge_index`` the shards were written from (the same on a symmetric graph)."""
        from .shards import read_meta

        meta = read_meta(path)
        self = cls.__new__(cls)
        self._configure_rows(int(meta["num_nodes"]), fanouts, batch_size, input_nodes, shuffle, seed, x, y, prefetch)
        bounds = tuple(int(b) for b in meta["bounds"])
        client = cluster.client()
        where = os.fspath(Path(path).resolve())
        blocks = [client.submit(_read, where, i, lo, hi, self.num_nodes, pure=False, **cluster.placed(client, i))
                  for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))]
        self._hold(bounds, blocks)
        return self

    def _configure_rows(self, num_nodes: int, fanouts: Sequence[int], batch_size: int, input_nodes: Any,
                        shuffle: bool, seed: Any, x: Any, y: Any, prefetch: int) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise DataError(f"DaskNeighborSampler: prefetch must be an integer >= 0, got {prefetch!r}")
        self.prefetch = int(prefetch)
        x, y = _unwrap(x), _unwrap(y)
        # the base class checks all but x / y: those may be dask arrays, which it would pull here
        self._configure(num_nodes, fanouts, batch_size, input_nodes, shuffle, seed, None, None)
        for name, values in (("x", x), ("y", y)):
            if values is not None and (not hasattr(values, "shape") or values.shape[0] != self.num_nodes):
                raise DataError(f"DaskNeighborSampler: {name} has {getattr(values, 'shape', ('no',))[0]} rows "
                                f"for {self.num_nodes} nodes")
        self.x = x if x is None or _is_dask(x) or isinstance(x, CSRMatrix) else np.asarray(x)
        self.y = y if y is None or _is_dask(y) else np.asarray(y)

    def _hold(self, bounds: Sequence[int], blocks: list) -> None:
        from distributed import wait

        self.bounds = tuple(int(b) for b in bounds)
        self._cuts = np.asarray(self.bounds[1:-1], dtype=np.int64)
        self.blocks = blocks
        wait(blocks)
        for f in blocks:
            if f.status == "error":
                f.result()    # the worker's own error (a DataError naming the shard, a memory cap)

    def __iter__(self) -> Iterator[SampledGraph]:
        if self.prefetch == 0:
            yield from super().__iter__()
            return
        from concurrent.futures import ThreadPoolExecutor

        seeds = self.rng.permutation(self.input_nodes) if self.shuffle else self.input_nodes
        starts = iter(range(0, seeds.shape[0], self.batch_size))
        # one thread draws every batch, in order: the generator's draws (one key per batch) come
        # in the same sequence as without prefetching
        with ThreadPoolExecutor(1, thread_name_prefix="polygrad-dask-sampler") as pool:
            ahead: deque = deque()
            try:
                for start in starts:
                    ahead.append(pool.submit(self.sample, seeds[start:start + self.batch_size]))
                    if len(ahead) > self.prefetch:
                        yield ahead.popleft().result()
                while ahead:
                    yield ahead.popleft().result()
            finally:
                for pending in ahead:      # the caller stopped early: drop what was drawn ahead
                    pending.cancel()

    @property
    def nbytes_per_block(self) -> list[int]:
        """Bytes of each block's CSR on its worker."""
        client = cluster.client()
        return [int(v) for v in client.gather([client.submit(_nbytes, b, pure=False) for b in self.blocks])]

    def _numbering(self, seeds: np.ndarray) -> _Numbering:
        return _Numbering(seeds)      # sorted lookups: no O(N) scratch on the client

    def _neighbours(self, nodes: np.ndarray, fanout: int, key: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
        """Each block's frontier nodes sampled on its worker; the edges put back in frontier order
        (each block returns its rows' edges by row, then source: a stable sort by frontier
        position gives ``NeighborSampler``'s order)."""
        client = cluster.client()
        which = np.searchsorted(self._cuts, nodes, side="right")
        futures, positions = [], []
        for b in np.unique(which):
            idx = np.flatnonzero(which == b)
            futures.append(client.submit(_sample, self.blocks[b], nodes[idx], fanout, key, hop, pure=False,
                                         **cluster.placed(client, int(b))))
            positions.append(idx)
        results = client.gather(futures)
        if not results:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        src = np.concatenate([s for s, _ in results])
        owner = np.concatenate([idx[o] for idx, (_, o) in zip(positions, results)])
        order = np.argsort(owner, kind="stable")
        return src[order], owner[order]

    def _node_values(self, nodes: np.ndarray) -> tuple[Any, Any]:
        """Numpy x / y rows read here; dask ones on their workers, both in one round trip."""
        values = [self.x, self.y]
        on_workers = [i for i, v in enumerate(values) if v is not None and _is_dask(v)]
        out: list[Any] = [None if v is None else take_rows(v, nodes) for v in values]
        if on_workers:
            got = _gather_rows([values[i] for i in on_workers], nodes)
            for i, rows in zip(on_workers, got):
                out[i] = rows
        return out[0], out[1]


def _nbytes(block: SamplerBlock) -> int:
    return block.nbytes


def _is_dask(values: Any) -> bool:
    import dask.array as da

    return isinstance(values, da.Array)


def _gather_rows(arrays: list, nodes: np.ndarray) -> list[np.ndarray]:
    """Rows ``nodes`` of each row-blocked dask array of ``arrays``: each block's rows taken on the
    worker holding it (only they travel to the client), all arrays in one round trip.  A
    persisted block is read straight from its future (no graph to build per batch)."""
    import dask
    from distributed import futures_of

    client = cluster.client()
    pending, plans = [], []
    for array in arrays:
        held = {f.key: f for f in futures_of(array)}
        starts = np.concatenate([[0], np.cumsum(array.chunks[0])])
        which = np.searchsorted(starts[1:-1], nodes, side="right")
        plan = []
        for b in np.unique(which):
            idx = np.flatnonzero(which == b)
            index = (int(b),) + (0,) * (array.ndim - 1)
            rows = nodes[idx] - starts[b]
            future = held.get((array.name,) + index)
            if future is not None:
                pending.append(client.submit(_take, future, rows, pure=False, **cluster.placed(client, int(b))))
            else:
                with cluster.pinned(int(b)):
                    pending.append(client.compute(dask.delayed(_take)(array.blocks[index], rows),
                                                  optimize_graph=False))
            plan.append(idx)
        plans.append(plan)
    got = iter(client.gather(pending))
    out = []
    for array, plan in zip(arrays, plans):
        rows = np.empty((nodes.shape[0],) + tuple(array.shape[1:]), dtype=array.dtype)
        for idx in plan:
            rows[idx] = next(got)
        out.append(rows)
    return out


def _bounds(n: int, partitions: int | None) -> list[int]:
    """Row blocks of destinations: the backend's, or ``partitions`` near-equal ones."""
    if partitions is None:
        return chunks.bounds(n)
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise DataError(f"DaskNeighborSampler: partitions must be a positive integer, got {partitions!r}")
    base, extra = divmod(n, max(1, min(int(partitions), n)))
    sizes = [base + (1 if i < extra else 0) for i in range(max(1, min(int(partitions), n)))]
    return [0] + np.cumsum(sizes).tolist()


def _quiet(fn: Any) -> Any:
    from .backend import _quiet as quiet

    return quiet(fn)
