"""Sparse patterns partitioned into row blocks aligned with the dense arrays' row chunks.

A :class:`Partition` of an ``n x m`` pattern holds, per *row block* ``i`` (the rows of
``chunks.bounds(n)``), one :class:`RowBlock` pinned on worker ``cluster.placed(i)``: the block's
nonzeros as ONE CSR matrix over an extended column space -- its own column block (the rows of the
dense operand on the same worker), then per other column block ``j`` the *halo*: the distinct
columns of ``j`` it touches.  The halo ids are computed once per pattern and copied once to ``j``'s
worker, so a product moves only halo rows (``sparse_kernels``): traffic is bounded by the edge cut,
not by ``n``.  Blocks never move: every task on block ``i`` asks for its worker.

Two ways in: :func:`partition_of` partitions a host :class:`polygrad.sparse.pattern.Pattern` (an
in-memory graph) on first use and caches it; :class:`DistributedPattern` is a pattern whose
blocks were built by the workers themselves (from edge shards: ``polygrad_dask.shards``), so the
client never holds its index arrays.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad.errors import BackendError
from polygrad.sparse.pattern import Pattern

from . import chunks, cluster, memcap

#: a row block takes another column block whole (no halo ids, no gather task) when its halo is at
#: least this share of the block's rows.  A gather costs a task per product on the serving worker
#: (dask's per-task overhead: several ms of CPU over worker, scheduler and client) and a copy of
#: ``count`` rows; taking the block whole costs the ``size - count`` rows it does not need
#: travelling too.  Measured on 500k-row float32 blocks between two local worker processes: the
#: copy 21 ns per row at 16 columns (15 at 8), a moved row 75 ns of the two workers' CPU (31 at 8),
#: so whole costs less CPU above 0.78 (0.67) of the rows even before the task's overhead; 0.9
#: keeps a margin for slower links and bounds the traffic at 1/0.9 of the halo's.  1.0: a block
#: is taken whole only when the halo is all of it (the behaviour before).
WHOLE_HALO_FRACTION = 0.9


def takes_whole(count: int, size: int, fraction: float | None = None) -> bool:
    """Whether a halo of ``count`` of a column block's ``size`` rows is taken as the whole block,
    at ``fraction`` (default: :data:`WHOLE_HALO_FRACTION`, read at call time, so it may be patched;
    the client reads it and passes it to the workers that build blocks)."""
    fraction = WHOLE_HALO_FRACTION if fraction is None else float(fraction)
    return count > 0 and (count >= size or count >= fraction * size)


@dataclass(frozen=True)
class Tile:
    """The nonzeros of a row block in one column block, as a CSR matrix over that block's
    *operand piece*: all of its rows (``need is None``) or only its halo rows, in ``need`` order."""
    indptr: np.ndarray    # int32/int64[rows + 1]
    cols: np.ndarray      # [k]: column ids in the operand piece


@dataclass(frozen=True)
class RowBlock:
    """One row block of a pattern, built and kept on its worker.

    Per column block ``j``: a :class:`Tile` and the operand piece it multiplies -- all of block
    ``j``'s rows (``need[j] is None``: the block's own rows, or a block it touches everywhere) or
    only the distinct rows its nonzeros touch (``need[j]``: sorted local ids, the *halo* gathered
    from block ``j``'s worker).  The tiles' nonzeros are the block's values taken in ``order``
    (segment by segment, each in CSR order; None when one tile holds them all), ``starts[j]`` where
    tile ``j``'s begin.  Products go tile by tile into one output: no operand is concatenated."""
    index: int            # the row block's number i
    indptr: np.ndarray    # int32/int64[rows + 1]: the block's canonical CSR row pointers, from 0
    tiles: tuple          # one Tile per column block
    order: np.ndarray | None   # [nnz]: canonical value positions, tile by tile
    starts: tuple         # tile j's values are order[starts[j]:starts[j + 1]]
    segments: tuple       # per column block j: (offset, count): count = rows of its operand piece
    need: tuple           # per column block j: None (whole block) or the sorted local ids gathered

    @property
    def rows(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def tile_values(self, values: np.ndarray, j: int) -> np.ndarray:
        """Tile ``j``'s values, taken from the block's canonical ``values``."""
        lo, hi = self.starts[j], self.starts[j + 1]
        # np.take: the same gather as fancy indexing, ~40% faster (5M float32 nonzeros in 2 tiles:
        # 4.0 against 6.5 ms per tile), and every SpMM, transposed or not, gathers each tile's values
        return values[lo:hi] if self.order is None else np.take(values, self.order[lo:hi], axis=0)


def build_block(indptr: np.ndarray, cols: np.ndarray, col_bounds: tuple, index: int = 0,
                own: int | None = None, whole_fraction: float | None = None) -> RowBlock:
    """A RowBlock from its local row pointers and its (global, canonical) column ids.

    ``own`` is the column block this row block's worker holds whole (its own rows of a square
    pattern): it is never gathered.  Another column block is gathered at the columns used, unless
    they are nearly all of them (:func:`takes_whole`: then the block is taken whole, its segment
    counts all its rows, its tile's column ids are block-local: no gather, no index) at
    ``whole_fraction`` (default :data:`WHOLE_HALO_FRACTION`; 1.0: only when they are all of them)."""
    # int32 indices when they fit: scipy then uses them as they are (no conversion per product),
    # and they take half the memory
    small = max(int(col_bounds[-1]), len(indptr), int(indptr[-1]) if len(indptr) else 0) < 2**31 - 1
    index_dtype = np.int32 if small else np.int64
    rows, nnz = len(indptr) - 1, len(cols)
    item = np.dtype(index_dtype).itemsize
    blocks = len(col_bounds) - 1
    # what this block will hold (row pointers per tile, column ids, the order) and build with (a
    # mask and a position map per column block): checked before allocating, on a worker with a
    # memory_limit
    widest = max((int(b) - int(a) for a, b in zip(col_bounds[:-1], col_bounds[1:])), default=0)
    memcap.check(f"row block {index} ({rows} rows, {nnz} nonzeros)",
                 ((blocks + 1) * (rows + 1) + 3 * nnz) * item + widest * (1 + item))
    indptr = np.asarray(indptr, dtype=index_dtype)
    cols = np.asarray(cols)
    bounds = np.asarray(col_bounds, dtype=np.int64)
    which = np.searchsorted(bounds[1:-1], cols, side="right") if blocks > 1 else np.zeros(nnz, dtype=np.int8)
    order = np.argsort(which, kind="stable").astype(index_dtype) if blocks > 1 else None
    counts = np.bincount(which, minlength=blocks)
    starts = tuple(int(v) for v in np.concatenate([[0], np.cumsum(counts)]))
    local_rows = np.repeat(np.arange(rows, dtype=index_dtype), np.diff(indptr))
    tiles, segments, need = [], [], []
    offset = 0
    for j in range(blocks):
        size = int(bounds[j + 1] - bounds[j])
        pos = slice(starts[j], starts[j + 1]) if order is None else order[starts[j]:starts[j + 1]]
        local = cols[pos] - bounds[j]
        if j == own:
            ids, count, piece_cols = None, size, local
        else:
            used = np.zeros(size, dtype=bool)
            used[local] = True
            count = int(used.sum())
            if takes_whole(count, size, whole_fraction):
                # the tile indexes the whole block by its local ids: the same terms in the same
                # order as through a halo, only from a bigger operand
                ids, count, piece_cols = None, size, local
            else:
                ids = np.nonzero(used)[0].astype(index_dtype)
                remap = np.cumsum(used, dtype=index_dtype)   # remap[c] - 1: c's position in ids
                piece_cols = remap[local] - 1
                del remap
        t_indptr = np.zeros(rows + 1, dtype=index_dtype)
        np.cumsum(np.bincount(local_rows[pos], minlength=rows), out=t_indptr[1:])
        tiles.append(Tile(t_indptr, np.asarray(piece_cols, dtype=index_dtype)))
        segments.append((offset, count))
        need.append(ids)
        offset += count
    return RowBlock(int(index), indptr, tuple(tiles), order, starts, tuple(segments), tuple(need))


@dataclass(frozen=True)
class Partition:
    """Row blocks of a pattern on the cluster, and the host-side sizes graphs are built from.

    ``segments[i][j]`` is ``(offset, count)`` of column block ``j`` in row block ``i``'s extended
    column space; ``needs[(i, j)]`` is a Future of the halo ids ``i`` gathers from block ``j``,
    kept on ``j``'s worker (the ids travel there once per pattern, not once per product).  A pair
    absent from ``needs`` takes block ``j`` whole (count > 0) or not at all (count == 0)."""
    shape: tuple
    row_bounds: tuple     # chunks.bounds(n)
    col_bounds: tuple     # chunks.bounds(m)
    nnz_chunks: tuple     # nonzeros per row block (the values' chunks)
    blocks: tuple         # one Future (of a RowBlock) per row block
    segments: tuple = ()  # per row block: per column block (offset, count)
    needs: Any = None     # {(i, j): Future of the halo ids on j's worker}

    @property
    def row_chunks(self) -> tuple:
        return tuple(b - a for a, b in zip(self.row_bounds[:-1], self.row_bounds[1:]))

    @property
    def col_chunks(self) -> tuple:
        return tuple(b - a for a, b in zip(self.col_bounds[:-1], self.col_bounds[1:]))

    def halo_rows(self) -> dict:
        """``{(i, j): rows}``: how many rows of column block ``j`` row block ``i`` fetches per
        product (the whole block where no halo ids are kept); the traffic of one SpMM with F
        columns is ``sum(rows) * F * itemsize`` bytes."""
        out = {}
        for i, segs in enumerate(self.segments):
            for j, (_, count) in enumerate(segs):
                if count and j != own_block(self, i):
                    out[(i, j)] = count
        return out

    @property
    def futures(self) -> list:
        return list(self.blocks) + list((self.needs or {}).values())


def own_block(part: "Partition | tuple", i: int) -> int | None:
    """The column block row block ``i``'s worker holds whole (a square pattern's diagonal block:
    the operand's rows i are on the same worker as the pattern's rows i), or None."""
    row_bounds, col_bounds = (part.row_bounds, part.col_bounds) if isinstance(part, Partition) else part
    return i if tuple(row_bounds) == tuple(col_bounds) else None


def _layout(block: RowBlock) -> tuple:
    return block.segments


def _halo_ids(block: RowBlock, j: int) -> np.ndarray:
    return block.need[j]


def _keep(ids: np.ndarray) -> np.ndarray:
    """Identity, pinned on the worker that serves the halo: the ids then live there."""
    return ids


def finish(client: Any, shape: tuple, row_bounds: tuple, col_bounds: tuple, nnz: tuple,
           blocks: tuple) -> "Partition":
    """The Partition of row-block futures: their layouts (a few numbers per block) come to the
    client, and each halo's ids are copied once to the worker of the block they index."""
    layouts = client.gather([client.submit(_layout, b, pure=False) for b in blocks])
    needs = {}
    for i, (block, segs) in enumerate(zip(blocks, layouts)):
        for j, (_, count) in enumerate(segs):
            whole = count == int(col_bounds[j + 1]) - int(col_bounds[j])
            if not count or whole or j == own_block((row_bounds, col_bounds), i):
                # nothing to fetch, or the whole block: build_block keeps no ids then, and counts
                # a block it takes whole at a nearly complete halo (takes_whole) as all its rows
                continue
            ids = client.submit(_halo_ids, block, j, pure=False, **cluster.placed(client, i))
            needs[(i, j)] = client.submit(_keep, ids, pure=False, **cluster.placed(client, j))
    return Partition(tuple(shape), tuple(row_bounds), tuple(col_bounds), tuple(nnz), tuple(blocks),
                     tuple(tuple(s) for s in layouts), needs)


class DistributedPattern(Pattern):
    """A pattern whose index arrays live only on the workers (see :func:`polygrad_dask.load_edge_shards`).

    It has a shape, an nnz and a :class:`Partition`; the host arrays ``indptr``/``rows``/``cols``
    are deliberately absent (the graph may not fit on the client), so ops that need them
    (``to_dense``, ``transpose``, pattern unions) raise a clear error instead of gathering it."""

    def __init__(self, partition: Partition, layout: str = "csr") -> None:
        self.shape = tuple(partition.shape)
        self.layout = layout
        self._transpose = None
        self._device = {}
        self.partition = partition

    @property
    def nnz(self) -> int:
        return int(sum(self.partition.nnz_chunks))

    def _absent(self, what: str) -> Any:
        raise BackendError(f"backend 'dask': this {self.shape} pattern with nnz={self.nnz} lives on the "
                           f"workers; {what} would gather the whole graph onto the client (use SpMM, "
                           "SDDMM and segment reductions, which run block by block)")

    indptr = property(lambda self: self._absent("its host indptr"))
    rows = property(lambda self: self._absent("its host row ids"))
    cols = property(lambda self: self._absent("its host column ids"))

    def transpose(self) -> tuple:
        return self._absent("a host transpose")

    def with_layout(self, layout: str) -> "DistributedPattern":
        return self if layout == self.layout else DistributedPattern(self.partition, layout)

    def same_as(self, other: Any) -> bool:
        return self is other or (isinstance(other, DistributedPattern) and other.partition is self.partition)

    def __repr__(self) -> str:
        return (f"DistributedPattern(shape={self.shape}, nnz={self.nnz}, "
                f"blocks={len(self.partition.blocks)})")


_CACHE: "weakref.WeakKeyDictionary[Pattern, dict]" = weakref.WeakKeyDictionary()


def partition_of(pattern: Pattern) -> Partition:
    """The Partition of ``pattern`` for the current row blocks and client (built once, cached).

    Row block ``i`` is built on worker ``cluster.home(i)`` (loosely: a lost worker's block is
    rebuilt elsewhere from the arguments inside its task) and stays there: every kernel task on
    block ``i`` asks for that worker, so the pattern never moves between steps."""
    part = getattr(pattern, "partition", None)
    if isinstance(part, Partition):
        if part.row_bounds != tuple(chunks.bounds(pattern.shape[0])) or \
                part.col_bounds != tuple(chunks.bounds(pattern.shape[1])):
            raise BackendError(f"backend 'dask': the pattern was partitioned into {len(part.blocks)} row "
                               f"blocks but the backend now uses {chunks.partitions}; reload it")
        return part
    client = cluster.client()
    n, m = pattern.shape
    key = (tuple(chunks.bounds(n)), tuple(chunks.bounds(m)), id(client))
    per_pattern = _CACHE.setdefault(pattern, {})
    hit = per_pattern.get(key)
    if hit is not None and all(f.status not in ("cancelled", "lost", "error") for f in hit.futures):
        return hit
    row_bounds, col_bounds = key[0], key[1]
    indptr = pattern.indptr
    blocks, nnz = [], []
    for i, (a, b) in enumerate(zip(row_bounds[:-1], row_bounds[1:])):
        lo, hi = int(indptr[a]), int(indptr[b])
        # the arguments travel inside the task: a lost worker's block is rebuilt from them
        blocks.append(client.submit(build_block, indptr[a:b + 1] - lo, pattern.cols[lo:hi], col_bounds, i,
                                    own_block((row_bounds, col_bounds), i), WHOLE_HALO_FRACTION, pure=False,
                                    **cluster.placed(client, i)))
        nnz.append(hi - lo)
    part = finish(client, (n, m), row_bounds, col_bounds, tuple(nnz), tuple(blocks))
    per_pattern[key] = part
    return part
