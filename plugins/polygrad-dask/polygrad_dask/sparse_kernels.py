"""SpMM, transposed SpMM, SDDMM and segment reductions, block by block on the workers.

Every kernel is a small task graph over the pattern's :class:`~polygrad_dask.partition.Partition`:

* ``spmm``    ``Y_i = sum_j A_ij @ X_j``      one task per tile (i, j), one sum per row block i
* ``spmm_t``  ``Z_j = sum_i A_ij.T @ G_i``    the same tiles read transposed (no host transpose)
* ``sddmm``   ``out_i[A_ij] = (P_i Q_j.T)[A_ij]``  one task per tile, one scatter per row block
* ``segment_sum`` / ``segment_max``  one ``reduceat`` per row block on its own values

so a task holds at most one row block of ``A``, one row block of each dense operand and one
partial result; nothing gathers the whole graph or a whole ``N x F`` matrix.  Partials are summed
in a fixed order (j = 0, 1, ...), so results are reproducible run to run; they differ from the
single-process numpy backend only by summation order.  Tile products run on scipy.sparse.
"""
from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from polygrad.ir.ops import Op

from .partition import Partition, RowBlock, partition_of

#: gathered elements per SDDMM chunk (bounds temporaries at O(chunk), as the numpy backend does)
SDDMM_CHUNK_ELEMENTS = 1 << 16


# -- what runs on a worker (numpy / scipy on one tile or block) -----------------------------------

def _tile_matrix(block: RowBlock, j: int, values: np.ndarray, ncols: int, dtype: Any) -> sp.csr_matrix:
    t = block.tiles[j]
    return sp.csr_matrix((values[t.pos].astype(dtype, copy=False), t.cols, t.indptr),
                         shape=(block.rows, ncols))


def _spmm_tile(block: RowBlock, j: int, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    dtype = np.result_type(values.dtype, x.dtype)
    return np.asarray(_tile_matrix(block, j, values, x.shape[0], dtype) @ x.astype(dtype, copy=False))


def _spmm_t_tile(block: RowBlock, j: int, ncols: int, values: np.ndarray, g: np.ndarray) -> np.ndarray:
    dtype = np.result_type(values.dtype, g.dtype)
    return np.asarray(_tile_matrix(block, j, values, ncols, dtype).T @ g.astype(dtype, copy=False))


def _sum(shape: tuple, dtype: Any, *parts: np.ndarray) -> np.ndarray:
    out = np.zeros(shape, dtype=dtype)
    for p in parts:  # fixed order: reproducible
        out += p
    return out


def _sddmm_tile(block: RowBlock, j: int, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    t = block.tiles[j]
    dtype = np.result_type(p.dtype, q.dtype)
    rows = np.repeat(np.arange(block.rows, dtype=np.int64), np.diff(t.indptr))
    out = np.empty(rows.shape[0], dtype=dtype)
    step = max(1, SDDMM_CHUNK_ELEMENTS // max(p.shape[1], 1))
    for lo in range(0, rows.shape[0], step):
        hi = min(rows.shape[0], lo + step)
        out[lo:hi] = np.einsum("ij,ij->i", p[rows[lo:hi]], q[t.cols[lo:hi]])
    return out


def _scatter(block: RowBlock, dtype: Any, *parts: np.ndarray) -> np.ndarray:
    out = np.zeros(block.nnz, dtype=dtype)
    for t, vals in zip(block.tiles, parts):
        out[t.pos] = vals
    return out


def _segment(block: RowBlock, values: np.ndarray, reduce_sum: bool) -> np.ndarray:
    out = np.zeros(block.rows, dtype=values.dtype)
    starts = block.indptr[:-1]
    nonempty = starts < block.indptr[1:]
    if values.shape[0]:
        ufunc = np.add if reduce_sum else np.maximum
        out[nonempty] = ufunc.reduceat(values, starts[nonempty])
    return out


# -- graph builders (on the client: only shapes and task keys) ----------------------------------

_d = dask.delayed(pure=True)


def _blocks(x: da.Array, chunk_rows: tuple) -> list:
    """Delayed row blocks of ``x`` re-chunked to ``chunk_rows`` (a no-op when already aligned);
    empty blocks are plain empty arrays (dask drops zero-length chunks)."""
    rest = tuple(x.shape[1:])
    sizes = tuple(r for r in chunk_rows if r)
    d = []
    if sizes:
        x = x.rechunk((sizes,) + tuple((s,) for s in rest))
        delayed = x.to_delayed(optimize_graph=False)
        d = [delayed[(i,) + (0,) * len(rest)] for i in range(len(sizes))]
    it = iter(d)
    return [next(it) if r else np.zeros((0,) + rest, dtype=x.dtype) for r in chunk_rows]


def _stack(blocks: list, shapes: list, dtype: Any) -> da.Array:
    arrays = [da.from_delayed(b, s, dtype=dtype) for b, s in zip(blocks, shapes)]
    return arrays[0] if len(arrays) == 1 else da.concatenate(arrays, axis=0)


def _as_2d(x: da.Array) -> da.Array:
    return x.reshape(x.shape[0], 1) if x.ndim == 1 else x


def spmm_partition(part: Partition, values: da.Array, x: da.Array) -> da.Array:
    """``A @ X`` (X 2-D), rows of the result chunked as A's row blocks."""
    dtype = np.result_type(values.dtype, x.dtype)
    f = x.shape[1]
    vb = _blocks(values, part.nnz_chunks)
    xb = _blocks(x, part.col_chunks)
    out = []
    for i, block in enumerate(part.blocks):
        tiles = [_d(_spmm_tile)(block, j, vb[i], xb[j]) for j in range(len(xb))]
        out.append(_d(_sum)((part.row_chunks[i], f), dtype, *tiles))
    return _stack(out, [(r, f) for r in part.row_chunks], dtype)


def spmm_t_partition(part: Partition, values: da.Array, g: da.Array) -> da.Array:
    """``A.T @ G`` (G 2-D) from A's own tiles, rows chunked as A's column blocks."""
    dtype = np.result_type(values.dtype, g.dtype)
    f = g.shape[1]
    vb = _blocks(values, part.nnz_chunks)
    gb = _blocks(g, part.row_chunks)
    out = []
    for j, cols in enumerate(part.col_chunks):
        tiles = [_d(_spmm_t_tile)(block, j, cols, vb[i], gb[i]) for i, block in enumerate(part.blocks)]
        out.append(_d(_sum)((cols, f), dtype, *tiles))
    return _stack(out, [(c, f) for c in part.col_chunks], dtype)


def sddmm_partition(part: Partition, p: da.Array, q: da.Array) -> da.Array:
    dtype = np.result_type(p.dtype, q.dtype)
    pb = _blocks(p, part.row_chunks)
    qb = _blocks(q, part.col_chunks)
    out = []
    for i, block in enumerate(part.blocks):
        tiles = [_d(_sddmm_tile)(block, j, pb[i], qb[j]) for j in range(len(qb))]
        out.append(_d(_scatter)(block, dtype, *tiles))
    return _stack(out, [(k,) for k in part.nnz_chunks], dtype)


def segment_partition(part: Partition, values: da.Array, reduce_sum: bool) -> da.Array:
    vb = _blocks(values, part.nnz_chunks)
    out = [_d(_segment)(block, vb[i], reduce_sum) for i, block in enumerate(part.blocks)]
    return _stack(out, [(r,) for r in part.row_chunks], values.dtype)


# -- kernels (polygrad's calling convention) ----------------------------------------------------

def spmm(values: da.Array, x: da.Array, *, pattern: Any) -> da.Array:
    out = spmm_partition(partition_of(pattern), values, _as_2d(x))
    return out.reshape(out.shape[0]) if x.ndim == 1 else out


def sddmm(p: da.Array, q: da.Array, *, pattern: Any) -> da.Array:
    return sddmm_partition(partition_of(pattern), p, q)


def segment_sum(values: da.Array, *, pattern: Any) -> da.Array:
    return segment_partition(partition_of(pattern), values, True)


def segment_max(values: da.Array, *, pattern: Any) -> da.Array:
    """Row maxima over the nonzeros; empty rows give 0 (polygrad's convention)."""
    return segment_partition(partition_of(pattern), values, False)


def spmm_vjp(g: da.Array, values: da.Array, x: da.Array, *, needs: tuple, pattern: Any) -> tuple:
    """Fused backward of SpMM on A's tiles: ``dA = (G X.T)`` at A's nonzeros (SDDMM) and
    ``dX = A.T @ G`` (transposed SpMM: no host transpose of the pattern, no values permutation)."""
    part = partition_of(pattern)
    g2, x2 = _as_2d(g), _as_2d(x)
    dvalues = sddmm_partition(part, g2, x2).astype(values.dtype) if needs[0] else None
    dx = None
    if needs[1]:
        dx = spmm_t_partition(part, values, g2).astype(x.dtype)
        dx = dx.reshape(dx.shape[0]) if x.ndim == 1 else dx
    return dvalues, dx


def sddmm_vjp(g: da.Array, p: da.Array, q: da.Array, *, needs: tuple, pattern: Any) -> tuple:
    """Fused backward of SDDMM: ``dP = A_g @ Q`` and ``dQ = A_g.T @ P`` with A_g = (pattern, g)."""
    part = partition_of(pattern)
    dp = spmm_partition(part, g, q).astype(p.dtype) if needs[0] else None
    dq = spmm_t_partition(part, g, p).astype(q.dtype) if needs[1] else None
    return dp, dq


KERNELS: dict[Op, Any] = {
    Op.SPMM: spmm, Op.SDDMM: sddmm, Op.SEGMENT_SUM: segment_sum, Op.SEGMENT_MAX: segment_max,
}
