"""Sparse patterns partitioned into row blocks aligned with the dense arrays' row chunks.

A :class:`Partition` of an ``n x m`` pattern holds, per *row block* ``i`` (the rows of
``chunks.bounds(n)``), one :class:`RowBlock` living on a worker: the block's CSR row pointers and
one :class:`Tile` per *column block* ``j`` (``chunks.bounds(m)``, the row blocks of the dense
operand) -- the nonzeros of block ``i`` whose columns fall in block ``j``, with local row/column
ids and their positions in the block's values.  SpMM, its transpose, SDDMM and the segment
reductions are then one small task per tile plus one per block, and only tiles' operands and
results move between workers.

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

from . import chunks, cluster


@dataclass(frozen=True)
class Tile:
    """The nonzeros of one row block in one column block (built and kept on a worker)."""
    indptr: np.ndarray   # int32/int64[rows_in_block + 1]: CSR row pointers over the block's rows
    cols: np.ndarray     # [k]: column ids, local to the column block
    pos: np.ndarray      # [k]: positions in the row block's values (CSR order)


@dataclass(frozen=True)
class RowBlock:
    indptr: np.ndarray   # int32/int64[rows_in_block + 1]: the block's CSR row pointers, from 0
    tiles: tuple         # one Tile per column block

    @property
    def rows(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


def build_block(indptr: np.ndarray, cols: np.ndarray, col_bounds: tuple) -> RowBlock:
    """A RowBlock from its local row pointers and its (global, canonical) column ids."""
    # int32 indices when they fit: scipy then uses them as they are (no conversion per product),
    # and they take half the memory
    small = max(int(col_bounds[-1]), len(indptr), int(indptr[-1]) if len(indptr) else 0) < 2**31 - 1
    index = np.int32 if small else np.int64
    indptr = np.asarray(indptr, dtype=index)
    cols = np.asarray(cols, dtype=np.int64)
    rows = indptr.shape[0] - 1
    local_rows = np.repeat(np.arange(rows, dtype=np.int64), np.diff(indptr))
    which = np.searchsorted(np.asarray(col_bounds[1:-1], dtype=np.int64), cols, side="right")
    tiles = []
    for j in range(len(col_bounds) - 1):
        pos = np.nonzero(which == j)[0]
        t_indptr = np.zeros(rows + 1, dtype=index)
        np.cumsum(np.bincount(local_rows[pos], minlength=rows), out=t_indptr[1:])
        tiles.append(Tile(t_indptr, (cols[pos] - col_bounds[j]).astype(index), pos.astype(index)))
    return RowBlock(indptr, tuple(tiles))


@dataclass(frozen=True)
class Partition:
    """Row blocks of a pattern on the cluster, and the host-side sizes graphs are built from."""
    shape: tuple
    row_bounds: tuple     # chunks.bounds(n)
    col_bounds: tuple     # chunks.bounds(m)
    nnz_chunks: tuple     # nonzeros per row block (the values' chunks)
    blocks: tuple         # one Future (of a RowBlock) per row block

    @property
    def row_chunks(self) -> tuple:
        return tuple(b - a for a, b in zip(self.row_bounds[:-1], self.row_bounds[1:]))

    @property
    def col_chunks(self) -> tuple:
        return tuple(b - a for a, b in zip(self.col_bounds[:-1], self.col_bounds[1:]))


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
    def nnz(self) -> int:  # type: ignore[override]
        return int(sum(self.partition.nnz_chunks))

    def _absent(self, what: str) -> Any:
        raise BackendError(f"backend 'dask': this {self.shape} pattern with nnz={self.nnz} lives on the "
                           f"workers; {what} would gather the whole graph onto the client (use SpMM, "
                           "SDDMM and segment reductions, which run block by block)")

    indptr = property(lambda self: self._absent("its host indptr"))  # type: ignore[assignment]
    rows = property(lambda self: self._absent("its host row ids"))  # type: ignore[assignment]
    cols = property(lambda self: self._absent("its host column ids"))  # type: ignore[assignment]

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
    """The Partition of ``pattern`` for the current row blocks and client (built once, cached)."""
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
    if hit is not None and all(f.status not in ("cancelled", "lost", "error") for f in hit.blocks):
        return hit
    row_bounds, col_bounds = key[0], key[1]
    indptr = pattern.indptr
    blocks, nnz = [], []
    for a, b in zip(row_bounds[:-1], row_bounds[1:]):
        lo, hi = int(indptr[a]), int(indptr[b])
        # the arguments travel inside the task: a lost worker's block is rebuilt from them
        blocks.append(client.submit(build_block, indptr[a:b + 1] - lo, pattern.cols[lo:hi], col_bounds,
                                    pure=False))
        nnz.append(hi - lo)
    part = Partition((n, m), row_bounds, col_bounds, tuple(nnz), tuple(blocks))
    per_pattern[key] = part
    return part
