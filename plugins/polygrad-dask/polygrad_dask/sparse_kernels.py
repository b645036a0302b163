"""SpMM, transposed SpMM, SDDMM and segment reductions, block by block on the workers that hold
the pattern's row blocks.

Row block ``i`` of a pattern lives on one worker (``partition``), as one CSR matrix over an
extended column space: its own rows' columns, then per other column block ``j`` the *halo* -- the
distinct columns of ``j`` its nonzeros touch (ids kept on ``j``'s worker, computed once per
pattern).  Every kernel task on block ``i`` asks for that worker (``cluster.pinned``), so:

* ``spmm``    ``Y_i = A_i @ [X_i | X_j[halo_ij] ...]``: ``j``'s worker gathers the halo rows, only
  they travel; the own tile's product runs while they do, the halo tiles then add onto it in
  place (sparsetools' ``csr_matvecs`` straight into the output; the own tile's task has a key of
  its own, so nothing else reads it)
* ``spmm_t``  ``Z_j = (A_j.T G_j)[own] + sum_i (A_i.T G_i)[halo_ij]`` added at ``halo_ij`` on ``j``'s
  worker: only the halo rows of the partial travel; the own term is computed (``csc_matvecs``, no
  transpose built) while they do
* ``sddmm``   ``out_i[k] = P_i[row_k] . [Q_i | Q_j[halo_ij] ...][col_k]``: the same gathers
* ``segment_sum`` / ``segment_max``  one ``reduceat`` per row block on its own values

so the traffic of a product with F columns is ``sum(halo rows) * F * itemsize``, bounded by the
edge cut (and by the rows of the other blocks), never N.  A halo that is nearly all of its block
(``partition.WHOLE_HALO_FRACTION``) is the whole block: no gather task, the block's own chunk
travels, and its transposed partial is added whole (the same terms in the same order: the tile's
column ids index the whole block instead of the gathered rows).  Terms are added in a fixed order (the
own block's first, then the others in block order), never in the order of arrival; results differ
from the single-process numpy backend only by summation order.  (Two training runs on a cluster of
worker processes were seen to differ by one ulp in a parameter element: not these kernels, but
dask's matmul of a transposed block, whose bits depend on the block's memory order, which is not
the same run to run when the block may cross workers; see the plugin README.)
"""
from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.utils import funcname
from scipy.sparse import _sparsetools

from polygrad.ir.errors import ShapeError
from polygrad.ir.ops import Op

from . import cluster, memcap
from .partition import Partition, RowBlock, own_block, partition_of

#: gathered elements per SDDMM chunk (bounds temporaries at O(chunk), as the numpy backend does)
SDDMM_CHUNK_ELEMENTS = 1 << 16


# -- what runs on a worker (numpy / scipy on one block) ----------------------------------------

def _what(block: RowBlock, label: str) -> str:
    return f"{label} of row block {block.index} ({block.rows} rows, {block.nnz} nonzeros)"


def _take(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The halo rows of ``x`` (on the worker holding ``x``)."""
    memcap.check(f"a halo of {ids.shape[0]} rows", ids.shape[0] * x.itemsize * max(x[:1].size, 1))
    return np.take(x, ids, axis=0)  # numpy's take copies whole rows: faster than fancy indexing


#: dtypes scipy's sparsetools kernels take as they are: products in them run as direct calls that
#: accumulate into one output; others (float16, ...) go through scipy's matrix products
_DIRECT = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128, np.int32, np.int64))


#: dtypes whose product with one is exact for every value (a complex one times ``inf`` gives a
#: NaN part): :func:`_add_at` adds through a unit-valued sparse product only for these
_EXACT_UNIT = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))


def _tile_matrix(block: RowBlock, j: int, values: np.ndarray, dtype: Any) -> sp.csr_matrix:
    t = block.tiles[j]
    return sp.csr_matrix((block.tile_values(values, j).astype(dtype, copy=False), t.cols, t.indptr),
                         shape=(block.rows, block.segments[j][1]))


def _live(block: RowBlock) -> list:
    """The column blocks this row block has nonzeros in."""
    return [j for j in range(len(block.tiles)) if block.starts[j + 1] > block.starts[j]]


def _check_tile(block: RowBlock, j: int, tv: np.ndarray, piece: tuple, piece_rows: int, label: str,
                out: np.ndarray) -> None:
    """Raise a ShapeError unless tile ``j``'s values and the operand ``piece`` (its shape) fit the
    tile and ``out``: sparsetools checks no bounds, so a chunk whose real shape differs from the one
    dask was told (``from_delayed``, a faulty upstream op) would read past an array's end, where
    scipy's matrix product used to raise."""
    t = block.tiles[j]
    want = (piece_rows, out.shape[1])
    if tv.shape[0] != t.cols.shape[0] or tuple(piece) != want:
        raise ShapeError(f"backend 'dask': {label} of {_what(block, 'tile ' + str(j))}: {tv.shape[0]} values for "
                         f"{t.cols.shape[0]} nonzeros, operand {tuple(piece)} where {want} fits")


def _tile_into(block: RowBlock, j: int, values: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out += A_ij @ x`` (``x``: tile ``j``'s operand piece, ``out`` C-contiguous, both of
    ``out``'s dtype).  For sparsetools' dtypes one ``csr_matvecs`` adds each row's products to
    ``out`` in column order.  Tiles added in block order from zero (:func:`_spmm_block`) sum a row
    over its columns in increasing order, as the numpy backend's CSR product does; the cluster's
    SpMM runs the own tile first (:func:`_spmm_tiles`), so only row block 0 keeps those bits and
    the other blocks differ from numpy by summation order."""
    t = block.tiles[j]
    tv = block.tile_values(values, j).astype(out.dtype, copy=False)
    if out.dtype in _DIRECT and out.shape[1]:
        _check_tile(block, j, tv, x.shape, block.segments[j][1], "an SpMM", out)
        x = np.ascontiguousarray(x, dtype=out.dtype)
        _sparsetools.csr_matvecs(block.rows, x.shape[0], out.shape[1], t.indptr, t.cols, tv, x.reshape(-1),
                                 out.reshape(-1))
    else:
        out += sp.csr_matrix((tv, t.cols, t.indptr), shape=(block.rows, x.shape[0])) @ x.astype(out.dtype, copy=False)


def _tile_t_into(block: RowBlock, j: int, values: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """``out += A_ij.T @ g`` (``out``: the rows of tile ``j``'s operand piece, C-contiguous, of
    ``g``'s dtype): ``csc_matvecs`` on the tile's own CSR arrays adds into ``out`` row block ``i``'s
    rows in increasing order (no transpose built)."""
    t = block.tiles[j]
    tv = block.tile_values(values, j).astype(out.dtype, copy=False)
    if out.dtype in _DIRECT and out.shape[1]:
        _check_tile(block, j, tv, g.shape, block.rows, "a transposed SpMM", out)
        if out.shape[0] != block.segments[j][1]:
            raise ShapeError(f"backend 'dask': a transposed SpMM of {_what(block, 'tile ' + str(j))}: an output of "
                             f"{out.shape[0]} rows for a column block of {block.segments[j][1]}")
        _sparsetools.csc_matvecs(out.shape[0], block.rows, out.shape[1], t.indptr, t.cols, tv,
                                 np.ascontiguousarray(g).reshape(-1), out.reshape(-1))
    else:
        out += np.asarray(sp.csr_matrix((tv, t.cols, t.indptr), shape=(block.rows, out.shape[0])).T @ g)


def _spmm_block(block: RowBlock, values: np.ndarray, *parts: np.ndarray) -> np.ndarray:
    """``sum_j A_ij @ piece_j`` tile by tile, in block order, into one output (no operand is
    concatenated: a worker holds its pieces and one output, not a copy of them all)."""
    f = parts[0].shape[1]
    dtype = np.result_type(values.dtype, *(p.dtype for p in parts))
    memcap.check(_what(block, "an SpMM result"), 2 * block.rows * f * dtype.itemsize)
    out = np.zeros((block.rows, f), dtype=dtype)
    for j in _live(block):
        _tile_into(block, j, values, parts[j], out)
    return out


def _sum_into(start: np.ndarray, dtype: Any) -> np.ndarray:
    """The array the rest of a product is added into, given its own tile's term ``start``:
    ``start`` itself where this worker made it -- it owns its memory, is writable, C-ordered and
    of the result's dtype -- else a copy (it came from another worker, back from disk, or in
    another dtype).  Adding in place is safe because ``start`` is the result of an own-term task
    (:func:`_own_term`) whose key is its own: the adding task is its one dependent, so no other
    task reads it, and a recomputation recomputes it too.  It saves a copy of the block's result
    and that array's memory at the step's peak."""
    if start.dtype == dtype and start.flags.c_contiguous and start.flags.writeable and start.flags.owndata:
        return start
    return np.array(start, dtype=dtype, order="C")


def _spmm_tiles(block: RowBlock, values: np.ndarray, tiles: tuple, start: np.ndarray | None,
                *parts: np.ndarray) -> np.ndarray:
    """``start + sum_j A_ij @ part_j`` over the column blocks ``tiles`` (in that order), into
    ``start`` (:func:`_sum_into`; a zero output when None).  The own tile runs first, from zero,
    while the halo rows are still on their way; the halo tiles then add onto it."""
    f = parts[0].shape[1]
    dtype = np.result_type(values.dtype, *(p.dtype for p in parts))
    memcap.check(_what(block, "an SpMM result"), 2 * block.rows * f * dtype.itemsize)
    out = np.zeros((block.rows, f), dtype=dtype) if start is None else _sum_into(start, dtype)
    for j, part in zip(tiles, parts):
        if block.starts[j + 1] > block.starts[j]:
            _tile_into(block, j, values, part, out)
    return out


def _spmm_t_part(block: RowBlock, values: np.ndarray, g: np.ndarray, j: int) -> np.ndarray:
    """``A_ij.T @ G_i`` from zero (rows: column block ``j``'s operand piece, whole or halo), on row
    block ``i``'s worker: one task per other column block, so each partial is a task's own result
    that travels as it is (no tuple of them to split with a task per piece)."""
    dtype = np.result_type(values.dtype, g.dtype)
    count = block.segments[j][1]
    memcap.check(_what(block, "a transposed SpMM partial"), count * g.shape[1] * dtype.itemsize)
    part = np.zeros((count, g.shape[1]), dtype=dtype)
    if block.starts[j + 1] > block.starts[j]:
        _tile_t_into(block, j, values, np.ascontiguousarray(g, dtype=dtype), part)
    return part


#: an :func:`_assemble` piece computed in place: the own tile of the row block on the same worker
OWN = "own"


def _add_at(out: np.ndarray, ids: np.ndarray, part: np.ndarray) -> None:
    """``out[ids] += part`` for distinct ``ids`` (each row gets one exact addition; where both
    operands are NaN, sparsetools keeps ``part``'s NaN and numpy ``out``'s: the sign and payload of
    a NaN may differ, never whether it is one): for
    sparsetools' dtypes a ``csc_matvecs`` with one unit entry per row, which adds row by row
    without numpy's fancy-index gather and scatter passes."""
    if out.dtype in _EXACT_UNIT and out.shape[1] and part.dtype == out.dtype:
        if part.shape != (ids.shape[0], out.shape[1]):  # (the ids are the partition's own, checked when built)
            raise ShapeError(f"backend 'dask': adding a halo partial of shape {part.shape} at {ids.shape[0]} rows "
                             f"of a block of shape {out.shape}")
        ptr = np.arange(ids.shape[0] + 1, dtype=ids.dtype)
        _sparsetools.csc_matvecs(out.shape[0], ids.shape[0], out.shape[1], ptr, ids,
                                 np.ones(ids.shape[0], dtype=out.dtype), np.ascontiguousarray(part).reshape(-1),
                                 out.reshape(-1))
    else:
        out[ids] += part


def _assemble(shape: tuple, dtype: Any, ids: tuple, *parts: Any) -> np.ndarray:
    """Column block ``j`` of ``A.T @ G``: the contributions of every row block, added in block
    order into one output -- a partial from another worker whole or at its halo ids (distinct
    ids: one exact addition per row), or (``ids[k] is OWN``) the own row block's tile, whose
    three arguments ``(block, values, g)`` are on this worker and whose products go straight
    into the output (no partial of its own: one pass, one array fewer)."""
    memcap.check(f"a transposed SpMM block of shape {shape}", int(np.prod(shape)) * np.dtype(dtype).itemsize)
    out = np.zeros(shape, dtype=dtype)
    args = iter(parts)
    for where in ids:
        if isinstance(where, tuple) and where[0] == OWN:
            block, values, g = next(args), next(args), next(args)
            if block.starts[where[1] + 1] > block.starts[where[1]]:
                _tile_t_into(block, where[1], values, np.ascontiguousarray(g, dtype=out.dtype), out)
            continue
        part = next(args)
        if where is None:
            out += part
        else:
            _add_at(out, where, part.astype(out.dtype, copy=False))
    return out


def _add_partials(start: np.ndarray, ids: tuple, *parts: np.ndarray) -> np.ndarray:
    """``start`` (the own tile's transposed product, already on this worker; :func:`_sum_into`)
    with the other row blocks' partials added in block order, whole or at their halo ids."""
    memcap.check(f"a transposed SpMM block of shape {start.shape}", start.nbytes)
    out = _sum_into(start, start.dtype)
    for where, part in zip(ids, parts):
        if where is None:
            out += part
        else:
            _add_at(out, where, part.astype(out.dtype, copy=False))
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


def _own_term(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` as a delayed task with a key of its own (not a token of its arguments): the
    own tile's term, which one task then adds the rest into, in place (:func:`_sum_into`).  A
    token would make equal products in one graph share the term; their adding tasks would be one
    task too, but "one reader" would then rest on every reader being built alike.  A key of its
    own makes it true by construction, for the price of computing a repeated product twice."""
    return dask.delayed(fn, pure=False)(*args)


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


def _stack(calls: list, shapes: list, dtype: Any) -> da.Array:
    """The dask array whose row block ``i`` is the result of ``calls[i]`` -- ``(fn, args)``, run
    on row block ``i``'s worker -- stacked along rows.  Each call's task is keyed as the array's
    chunk ``(name, i, 0...)`` itself: no ``from_delayed`` alias per block, no ``concatenate``
    alias per chunk (two scheduler round trips per block that computed nothing).  The name is a
    token of every call (functions and arguments: keys of delayed inputs and futures), as the
    pure delayed calls' keys were, so equal products share keys."""
    name = f"{funcname(calls[0][0])}-{tokenize([(fn, args) for fn, args in calls])}"
    tail = (0,) * (len(shapes[0]) - 1)
    done = []
    for i, (fn, args) in enumerate(calls):
        with cluster.pinned(i):
            done.append(_d(fn)(*args, dask_key_name=(name, i) + tail))
    graph = HighLevelGraph.from_collections(name, {}, dependencies=done)
    chunks = (tuple(shape[0] for shape in shapes),) + tuple((n,) for n in shapes[0][1:])
    return da.Array(graph, name, chunks, dtype=dtype)


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
            with cluster.pinned(j, travels=True):
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
    out: list[tuple] = []  # per output block: (function, arguments)
    for i, block in enumerate(part.blocks):
        parts = _operand_parts(part, i, xb, x)
        own = own_block(part, i)
        fetched = [j for j, (_, count) in enumerate(part.segments[i]) if count and j != own]
        if own is None or not part.segments[i][own][1] or not fetched:
            out.append((_spmm_block, (block, vb[i], *parts)))
            continue
        with cluster.pinned(i):
            # the own tile first (its operand is here), overlapping the halo's transfer; then the rest
            first = _own_term(_spmm_tiles, block, vb[i], (own,), None, parts[own])
        out.append((_spmm_tiles, (block, vb[i], tuple(fetched), first, *(parts[j] for j in fetched))))
    return _stack(out, [(r, f) for r in part.row_chunks], dtype)


def spmm_t_partition(part: Partition, values: da.Array, g: da.Array) -> da.Array:
    """``A.T @ G`` (G 2-D) from A's own blocks, rows chunked as A's column blocks: each row block's
    partials for the other column blocks on its worker; per column block ``j``, on ``j``'s worker,
    the own row block's term (which needs nothing from elsewhere), then the other partials added
    into it in row-block order."""
    dtype = np.result_type(values.dtype, g.dtype)
    f = g.shape[1]
    vb = _blocks(values, part.nnz_chunks)
    gb = _blocks(g, part.row_chunks)
    out: list[tuple] = []  # per output block: (function, arguments)
    for j, cols in enumerate(part.col_chunks):
        ids: list = []
        pieces: list = []
        mine = None
        for i, block in enumerate(part.blocks):
            _, count = part.segments[i][j]
            if not count:
                continue
            if own_block(part, i) == j:
                mine = i
                continue
            with cluster.pinned(i, travels=True):
                pieces.append(_d(_spmm_t_part)(block, vb[i], gb[i], j))
            ids.append(part.needs.get((i, j)))
        if mine is None:
            out.append((_assemble, ((cols, f), dtype, tuple(ids), *pieces)))
            continue
        own_term = ((cols, f), dtype, ((OWN, j),), part.blocks[mine], vb[mine], gb[mine])
        if not pieces:
            out.append((_assemble, own_term))
            continue
        with cluster.pinned(j):
            # the own tile first (everything it reads is here), overlapping the partials' transfer
            first = _own_term(_assemble, *own_term)
        out.append((_add_partials, (first, tuple(ids), *pieces)))
    return _stack(out, [(c, f) for c in part.col_chunks], dtype)


def sddmm_partition(part: Partition, p: da.Array, q: da.Array) -> da.Array:
    dtype = np.result_type(p.dtype, q.dtype)
    pb = _blocks(p, part.row_chunks)
    qb = _blocks(q, part.col_chunks)
    out: list[tuple] = []  # per output block: (function, arguments)
    for i, block in enumerate(part.blocks):
        parts = _operand_parts(part, i, qb, q)
        out.append((_sddmm_block, (block, pb[i], *parts)))
    return _stack(out, [(k,) for k in part.nnz_chunks], dtype)


def segment_partition(part: Partition, values: da.Array, reduce_sum: bool) -> da.Array:
    vb = _blocks(values, part.nnz_chunks)
    out: list[tuple] = []  # per output block: (function, arguments)
    for i, block in enumerate(part.blocks):
        out.append((_segment, (block, vb[i], reduce_sum)))
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
