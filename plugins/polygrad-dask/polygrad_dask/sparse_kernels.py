"""SpMM, transposed SpMM, SDDMM and segment reductions, block by block on the workers that hold
the pattern's row blocks.

Row block ``i`` of a pattern lives on one worker (``partition``), as one CSR matrix over an
extended column space: its own rows' columns, then per other column block ``j`` the *halo* -- the
distinct columns of ``j`` its nonzeros touch (ids kept on ``j``'s worker, computed once per
pattern).  Every kernel task on block ``i`` asks for that worker (``cluster.pinned``), so:

* ``spmm``    ``Y_i = A_i @ [X_i | X_j[halo_ij] ...]``: ``j``'s worker gathers the halo rows, only
  they travel; one scipy product per block
* ``spmm_t``  ``Z_j = (A_j.T G_j)[own] + sum_i (A_i.T G_i)[halo_ij]`` added at ``halo_ij`` on ``j``'s
  worker: only the halo rows of the partial travel
* ``sddmm``   ``out_i[k] = P_i[row_k] . [Q_i | Q_j[halo_ij] ...][col_k]``: the same gathers
* ``segment_sum`` / ``segment_max``  one ``reduceat`` per row block on its own values

so the traffic of a product with F columns is ``sum(halo rows) * F * itemsize``, bounded by the
edge cut (and by the rows of the other blocks), never N.  Partials are added in a fixed order
(blocks 0, 1, ...), so results are reproducible run to run; they differ from the single-process
numpy backend only by summation order.
"""
from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from polygrad.ir.ops import Op

from . import cluster, memcap
from .partition import Partition, RowBlock, partition_of

#: gathered elements per SDDMM chunk (bounds temporaries at O(chunk), as the numpy backend does)
SDDMM_CHUNK_ELEMENTS = 1 << 16


# -- what runs on a worker (numpy / scipy on one block) ----------------------------------------

def _what(block: RowBlock, label: str) -> str:
    return f"{label} of row block {block.index} ({block.rows} rows, {block.nnz} nonzeros)"


def _take(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The halo rows of ``x`` (on the worker holding ``x``)."""
    memcap.check(f"a halo of {ids.shape[0]} rows", ids.shape[0] * x.itemsize * max(x[:1].size, 1))
    return x[ids]


def _tile_matrix(block: RowBlock, j: int, values: np.ndarray, dtype: Any) -> sp.csr_matrix:
    t = block.tiles[j]
    return sp.csr_matrix((block.tile_values(values, j).astype(dtype, copy=False), t.cols, t.indptr),
                         shape=(block.rows, block.segments[j][1]))


def _live(block: RowBlock) -> list:
    """The column blocks this row block has nonzeros in."""
    return [j for j in range(len(block.tiles)) if block.starts[j + 1] > block.starts[j]]


def _spmm_block(block: RowBlock, values: np.ndarray, *parts: np.ndarray) -> np.ndarray:
    """``sum_j A_ij @ piece_j`` tile by tile, in block order, into one output (no operand is
    concatenated: a worker holds its pieces and one output, not a copy of them all)."""
    f = parts[0].shape[1]
    dtype = np.result_type(values.dtype, *(p.dtype for p in parts))
    memcap.check(_what(block, "an SpMM result"), 2 * block.rows * f * dtype.itemsize)
    out = np.zeros((block.rows, f), dtype=dtype)
    for j in _live(block):
        out += _tile_matrix(block, j, values, dtype) @ parts[j].astype(dtype, copy=False)
    return out


def _spmm_t_block(block: RowBlock, values: np.ndarray, g: np.ndarray) -> tuple:
    """``A_ij.T @ G_i`` for every column block ``j`` (rows: its operand piece, own or halo)."""
    dtype = np.result_type(values.dtype, g.dtype)
    width = sum(count for _, count in block.segments)
    memcap.check(_what(block, "a transposed SpMM partial"), width * g.shape[1] * dtype.itemsize)
    g = g.astype(dtype, copy=False)
    return tuple(np.asarray(_tile_matrix(block, j, values, dtype).T @ g) if block.starts[j + 1] > block.starts[j]
                 else np.zeros((count, g.shape[1]), dtype=dtype) for j, (_, count) in enumerate(block.segments))


def _rows_of(partials: tuple, j: int) -> np.ndarray:
    """The transposed partial that belongs to column block ``j``."""
    return partials[j]


def _assemble(shape: tuple, dtype: Any, ids: tuple, *parts: np.ndarray) -> np.ndarray:
    """Column block ``j`` of ``A.T @ G``: the partials of every row block, added in block order
    (whole blocks directly, halos at their ids: ids are distinct, so fancy ``+=`` is exact)."""
    memcap.check(f"a transposed SpMM block of shape {shape}", int(np.prod(shape)) * np.dtype(dtype).itemsize)
    out = np.zeros(shape, dtype=dtype)
    for where, part in zip(ids, parts):
        if where is None:
            out += part
        else:
            out[where] += part
    return out


def _sddmm_block(block: RowBlock, p: np.ndarray, *parts: np.ndarray) -> np.ndarray:
    dtype = np.result_type(p.dtype, *(q.dtype for q in parts))
    memcap.check(_what(block, "an SDDMM result"), block.nnz * dtype.itemsize)
    out = np.empty(block.nnz, dtype=dtype)
    step = max(1, SDDMM_CHUNK_ELEMENTS // max(p.shape[1], 1))
    for j in _live(block):
        t, q = block.tiles[j], parts[j]
        rows = np.repeat(np.arange(block.rows, dtype=t.indptr.dtype), np.diff(t.indptr))
        vals = np.empty(rows.shape[0], dtype=dtype)
        for lo in range(0, rows.shape[0], step):
            hi = min(rows.shape[0], lo + step)
            vals[lo:hi] = np.einsum("ij,ij->i", p[rows[lo:hi]], q[t.cols[lo:hi]])
        where = slice(block.starts[j], block.starts[j + 1])
        if block.order is None:
            out[where] = vals
        else:
            out[block.order[where]] = vals
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


def _operand_parts(part: Partition, i: int, xb: list, x: da.Array) -> list:
    """Row block ``i``'s operand pieces in extended order: each column block whole, gathered at
    its halo ids on its own worker, or an empty stand-in when no nonzero touches it."""
    empty = np.zeros((0,) + tuple(x.shape[1:]), dtype=x.dtype)
    out = []
    for j, (_, count) in enumerate(part.segments[i]):
        ids = part.needs.get((i, j))
        if ids is not None:
            with cluster.pinned(j):
                out.append(_d(_take)(xb[j], ids))
        elif count:
            out.append(xb[j])
        else:
            out.append(empty)
    return out


def spmm_partition(part: Partition, values: da.Array, x: da.Array) -> da.Array:
    """``A @ X`` (X 2-D), rows of the result chunked as A's row blocks."""
    dtype = np.result_type(values.dtype, x.dtype)
    f = x.shape[1]
    vb = _blocks(values, part.nnz_chunks)
    xb = _blocks(x, part.col_chunks)
    out = []
    for i, block in enumerate(part.blocks):
        parts = _operand_parts(part, i, xb, x)
        with cluster.pinned(i):
            out.append(_d(_spmm_block)(block, vb[i], *parts))
    return _stack(out, [(r, f) for r in part.row_chunks], dtype)


def spmm_t_partition(part: Partition, values: da.Array, g: da.Array) -> da.Array:
    """``A.T @ G`` (G 2-D) from A's own blocks, rows chunked as A's column blocks."""
    dtype = np.result_type(values.dtype, g.dtype)
    f = g.shape[1]
    vb = _blocks(values, part.nnz_chunks)
    gb = _blocks(g, part.row_chunks)
    partials = []
    for i, block in enumerate(part.blocks):
        with cluster.pinned(i):
            partials.append(_d(_spmm_t_block)(block, vb[i], gb[i]))
    out = []
    for j, cols in enumerate(part.col_chunks):
        ids, pieces = [], []
        for i in range(len(part.blocks)):
            _, count = part.segments[i][j]
            if not count:
                continue
            with cluster.pinned(i):
                pieces.append(_d(_rows_of)(partials[i], j))
            ids.append(part.needs.get((i, j)))
        with cluster.pinned(j):
            out.append(_d(_assemble)((cols, f), dtype, tuple(ids), *pieces))
    return _stack(out, [(c, f) for c in part.col_chunks], dtype)


def sddmm_partition(part: Partition, p: da.Array, q: da.Array) -> da.Array:
    dtype = np.result_type(p.dtype, q.dtype)
    pb = _blocks(p, part.row_chunks)
    qb = _blocks(q, part.col_chunks)
    out = []
    for i, block in enumerate(part.blocks):
        parts = _operand_parts(part, i, qb, q)
        with cluster.pinned(i):
            out.append(_d(_sddmm_block)(block, pb[i], *parts))
    return _stack(out, [(k,) for k in part.nnz_chunks], dtype)


def segment_partition(part: Partition, values: da.Array, reduce_sum: bool) -> da.Array:
    vb = _blocks(values, part.nnz_chunks)
    out = []
    for i, block in enumerate(part.blocks):
        with cluster.pinned(i):
            out.append(_d(_segment)(block, vb[i], reduce_sum))
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
    """Fused backward of SpMM on A's blocks: ``dA = (G X.T)`` at A's nonzeros (SDDMM) and
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
