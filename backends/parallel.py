"""Multi-threaded forms of the numpy backend's kernels, bit-identical at any thread count.

Each kernel here cuts its output into blocks that are written by exactly one thread and computes
every output element the way the serial kernel does (a row of an SpMM is summed over its nonzeros
in CSR order by the same compiled loop; an elementwise op is elementwise); where a result depends
on the cut (the column sums of :func:`column_sums`), the cut depends only on the data.  So one
thread, two or seven give the same bits, and :func:`polygrad.runtime.threads.run_blocks` with one thread
is the serial kernel.  The kernels they call release the GIL on large arrays: scipy's
``sparsetools`` (measured: ``PyEval_SaveThread`` around every routine), numpy's ufuncs, ``take``
and reductions.

Below the sizes in the constants, work stays in the calling thread: handing a block to another
thread costs ~30-80 us (measured on this project's 2-core machine with a ThreadPoolExecutor, idle
and under load), which a block must outweigh several times.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from scipy.sparse import _sparsetools

from polygrad.runtime.threads import block_positions, even_blocks, get_num_threads, row_blocks, run_blocks

__all__ = ["even_blocks", "row_blocks", "run_blocks", "threads_for", "by_rows", "csr_spmm", "transposed_spmm",
           "elementwise", "reduce_trailing", "column_sums", "bincount", "matmul"]

#: multiply-adds (nnz x F) below which a sparse kernel runs serially: 2**20 takes ~1 ms on one core
#: (SpMM, 100k nonzeros x F=16 measured 0.9 ms), against ~0.1 ms to hand out two blocks
SPARSE_PARALLEL_MIN = 1 << 20
#: output elements below which an elementwise op or a row reduction runs serially: 2**20 float32
#: products take ~0.5-1 ms; equal to the array pool's threshold, so the pooled kernels' small
#: variants (``polygrad_small``, the plain ufunc) are exactly the serial path
DENSE_PARALLEL_MIN = 1 << 20
#: blocks handed out per thread: more than one, so a thread slowed by other processes (a shared
#: machine) leaves its remaining blocks to the others
BLOCKS_PER_THREAD = 4
#: rows per partial sum in :func:`column_sums`: fixed (never the thread count), so the bits are too
COLUMN_SUM_ROWS = 1 << 14
#: output rows per block of a tall product ``a @ b`` (a layer's ``x @ W``), cut only from two blocks
#: on: fixed, never the thread count, because OpenBLAS's bits for a row depend on the rows it is
#: computed with (cutting a product's rows elsewhere changed bits in ~10-25% of random shapes,
#: measured); 16k x 64 x 64 float32 is ~2 ms of BLAS, against ~50 us to hand out a block
GEMM_ROWS = 1 << 14
#: entries of the summed axis per partial product of a long reduction ``aᵀ @ g`` (a weight
#: gradient over every node), the partials then added in order, as :func:`column_sums` does
GEMM_SUM_ROWS = 1 << 15


def threads_for(work: int, minimum: int) -> int:
    """Threads to use for ``work`` units (1 below ``minimum``)."""
    return 1 if work < minimum else get_num_threads()


def blocks_for(threads: int) -> int:
    return threads * BLOCKS_PER_THREAD if threads > 1 else 1


# -- SpMM ---------------------------------------------------------------------------------------------

def csr_spmm(n: int, m: int, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, x: np.ndarray,
             out: np.ndarray) -> None:
    """``out = A @ x`` (``out`` uninitialised, ``(n,)`` or ``(n, f)``; ``x`` contiguous) with A in CSR
    (int32 or int64 ``indptr``/``cols`` alike): scipy's ``csr_matvec(s)`` over row blocks balanced by
    nonzeros, each block zeroing and writing only its own rows."""
    f = 1 if x.ndim == 1 else x.shape[1]
    threads = threads_for(int(cols.shape[0]) * f, SPARSE_PARALLEL_MIN)
    xs = x.reshape(-1)

    def block(r0: int, r1: int) -> None:
        o = out[r0:r1]
        o.fill(0)
        if f and int(indptr[r1]) > int(indptr[r0]):
            if x.ndim == 1:
                _sparsetools.csr_matvec(r1 - r0, m, indptr[r0:r1 + 1], cols, vals, xs, o)
            else:
                _sparsetools.csr_matvecs(r1 - r0, m, f, indptr[r0:r1 + 1], cols, vals, xs, o.reshape(-1))

    run_blocks(block, row_blocks(indptr, n, blocks_for(threads)), threads)


def transposed_csr(pattern, indptr: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, cols, perm) of Aᵀ in CSR, in the index dtype of ``indptr``/``cols``, cached on the
    pattern: scipy's counting sort (``csr_tocsc``), which keeps each column's rows ascending, so row
    i of Aᵀ lists A's rows in increasing order -- the order the serial CSC kernel adds them in."""
    def make(p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, m = p.shape
        itype = indptr.dtype
        t_indptr = np.empty(m + 1, dtype=itype)
        t_cols = np.empty(p.nnz, dtype=itype)
        perm = np.empty(p.nnz, dtype=itype)
        _sparsetools.csr_tocsc(n, m, indptr, cols, np.arange(p.nnz, dtype=itype), t_indptr, t_cols, perm)
        for a in (t_indptr, t_cols, perm):
            a.flags.writeable = False
        return t_indptr, t_cols, perm

    return pattern.derived(("numpy.transposed_csr", indptr.dtype.str), make)


def transposed_spmm(pattern, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, g: np.ndarray,
                    out: np.ndarray) -> None:
    """``out = Aᵀ @ g`` (``out`` uninitialised), bit for bit what scipy's ``csc_matvecs`` on A's own
    CSR arrays gives (the serial kernel: it adds into row i of the output in increasing order of
    A's rows j, starting from zero; Aᵀ's CSR rows list those j in the same order, and ``csr_matvecs``
    runs the same multiply-add per entry).  One thread: that serial kernel, no transpose built.
    More: Aᵀ's CSR (cached, 3 index arrays) in row blocks, each gathering its values through the
    permutation into a temporary of its own nonzeros."""
    n, m = pattern.shape
    f = 1 if g.ndim == 1 else g.shape[1]
    nnz = int(cols.shape[0])
    threads = threads_for(nnz * f, SPARSE_PARALLEL_MIN)
    gs = g.reshape(-1)
    if threads == 1:
        out.fill(0)
        if nnz and f:
            if g.ndim == 1:
                _sparsetools.csc_matvec(m, n, indptr, cols, vals, gs, out)
            else:
                _sparsetools.csc_matvecs(m, n, f, indptr, cols, vals, gs, out.reshape(-1))
        return
    t_indptr, t_cols, perm = transposed_csr(pattern, indptr, cols)
    t_vals = _kept_transposed_values(pattern, vals) if f else None
    fresh = None if t_vals is not None or not f else np.empty_like(vals)

    def block(r0: int, r1: int) -> None:
        o = out[r0:r1]
        o.fill(0)
        lo, hi = int(t_indptr[r0]), int(t_indptr[r1])
        if f and hi > lo:
            ptr = t_indptr[r0:r1 + 1] - t_indptr.dtype.type(lo)
            if t_vals is not None:
                v = t_vals[lo:hi]
            else:
                assert fresh is not None
                v = np.take(vals, perm[lo:hi], out=fresh[lo:hi])
            if g.ndim == 1:
                _sparsetools.csr_matvec(r1 - r0, n, ptr, t_cols[lo:hi], v, gs, o)
            else:
                _sparsetools.csr_matvecs(r1 - r0, n, f, ptr, t_cols[lo:hi], v, gs, o.reshape(-1))

    run_blocks(block, row_blocks(t_indptr, m, blocks_for(threads)), threads)
    if fresh is not None:  # every block filled its part: keep it, with the values it came from
        pattern.derived(_TRANSPOSED_VALUES_KEY, lambda p: {})["entry"] = (vals.copy(), fresh)


#: where :func:`_kept_transposed_values` keeps, per pattern, one values array in Aᵀ's order
_TRANSPOSED_VALUES_KEY = "numpy.transposed_values"


def _kept_transposed_values(pattern, vals: np.ndarray) -> np.ndarray | None:
    """``vals`` in Aᵀ's CSR order, as gathered by the last call on ``pattern`` -- when ``vals``
    holds, bit for bit, what that call's values held; else None (gather again).

    Checked by content, never by identity: an array may be written in place between calls (an
    optimizer's in-place update of sparse values, ``Tensor.update_`` with an array the user edits
    later; an identity-keyed version of this cache served stale values then).  The check is a
    sequential read of two arrays, against the random-access gather it saves (the gather is ~11% of
    the kernel's work at 1M nodes / 11M nonzeros, F=64; a GCN's adjacency is the same every epoch);
    it costs one copy of the values and one gathered array per pattern (8 bytes per nonzero in
    float32)."""
    entry = pattern.derived(_TRANSPOSED_VALUES_KEY, lambda p: {}).get("entry")
    if entry is None:
        return None
    source, gathered = entry
    if source.dtype != vals.dtype or source.shape != vals.shape:
        return None
    as_bits = np.dtype(f"u{vals.dtype.itemsize}") if vals.dtype.itemsize in (1, 2, 4, 8) else None
    if as_bits is None or not np.array_equal(source.view(as_bits), np.ascontiguousarray(vals).view(as_bits)):
        return None
    return gathered


# -- row-blocked numpy kernels ---------------------------------------------------------------------

def by_rows(kernel: Callable[[int, int], None], indptr: np.ndarray, n: int, work: int) -> None:
    """``kernel(r0, r1)`` over row blocks of a CSR pattern balanced by nonzeros, in parallel when
    ``work`` (multiply-adds) is worth it.  The kernel must write only rows r0..r1's outputs."""
    threads = threads_for(work, SPARSE_PARALLEL_MIN)
    run_blocks(kernel, row_blocks(indptr, n, blocks_for(threads)), threads)


def elementwise(ufunc: Any, arrays: tuple, out: np.ndarray) -> np.ndarray:
    """``ufunc(*arrays, out=out)``, split along the output's first axis when it is large.  Each
    operand is sliced when it spans that axis and passed whole when broadcast along it."""
    threads = threads_for(out.size, DENSE_PARALLEL_MIN)
    if threads == 1 or out.ndim == 0 or out.shape[0] < 2:
        return ufunc(*arrays, out=out)
    lead, nd = out.shape[0], out.ndim

    def block(r0: int, r1: int) -> None:
        parts = [a[r0:r1] if a.ndim == nd and a.shape[0] == lead else a for a in arrays]
        ufunc(*parts, out=out[r0:r1])

    run_blocks(block, even_blocks(lead, blocks_for(threads)), threads)
    return out


def reduce_trailing(reduce: Callable[..., Any], x: np.ndarray, axes: tuple[int, ...], keepdims: bool,
                    out: np.ndarray) -> np.ndarray:
    """``reduce(x, axis=axes, keepdims=keepdims)`` (a reduction over axes other than the first, e.g.
    a softmax's row sums) in blocks of rows, each reducing whole rows as the serial call does."""
    threads = threads_for(x.size, DENSE_PARALLEL_MIN)
    if threads == 1 or x.shape[0] < 2:
        reduce(x, axis=axes, keepdims=keepdims, out=out)
        return out

    def block(r0: int, r1: int) -> None:
        reduce(x[r0:r1], axis=axes, keepdims=keepdims, out=out[r0:r1])

    run_blocks(block, even_blocks(x.shape[0], blocks_for(threads)), threads)
    return out


def column_sums(x: np.ndarray) -> np.ndarray:
    """Sums over the first axis of a 2-D array: numpy's row-by-row sum over fixed blocks of
    ``COLUMN_SUM_ROWS`` rows (in parallel), then the block sums added in block order.  The blocks
    depend on the shape only, so the bits do not depend on the thread count (a multi-threaded BLAS
    ``ones @ x`` splits its sum by thread and gives other bits at 1 and 2 threads: measured)."""
    rows = x.shape[0]
    bounds = list(range(0, rows, COLUMN_SUM_ROWS)) + [rows]
    blocks = [(i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    partial = np.empty((len(blocks),) + x.shape[1:], dtype=x.dtype)

    def block(i: int, r0: int, r1: int) -> None:
        np.add.reduce(x[r0:r1], axis=0, out=partial[i])

    run_blocks(block, blocks, threads_for(x.size, DENSE_PARALLEL_MIN))
    total = partial[0].copy()
    for i in range(1, len(blocks)):
        total += partial[i]
    return total


def bincount(keys: np.ndarray, weights: np.ndarray, minlength: int) -> np.ndarray:
    """``np.bincount(keys, weights=weights, minlength=minlength)`` (float64 weights, every key in
    ``[0, minlength)``; the caller checked): on several threads, one range of bins per thread,
    each picking its entries out of the input in input order and summing them into its bins --
    per bin, the additions the serial call makes, in its order, so the same bits at any count."""
    threads = threads_for(int(keys.shape[0]), SPARSE_PARALLEL_MIN)
    if threads == 1 or minlength < 2:
        return np.bincount(keys, weights=weights, minlength=minlength)
    out = np.empty(minlength, dtype=np.float64)

    def block(lo: int, hi: int) -> None:
        picked = block_positions(keys, lo, hi)
        local = keys[picked]
        local -= lo
        out[lo:hi] = np.bincount(local, weights=weights[picked], minlength=hi - lo)

    # one block per thread: every block reads all the keys once to pick its entries
    run_blocks(block, even_blocks(minlength, threads), threads)
    return out


def _fixed_cuts(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``a @ b`` (2-D, floating) into ``out``, bit-identical at any thread count.

    BLAS runs on one thread (:mod:`polygrad.runtime.threads`): OpenBLAS's own threads give other
    bits at other counts (measured: ``xᵀ @ g`` for a 2708 x 1433 ``x`` and a 2708 x 16 ``g``, at 1
    and 2 threads), and its static split leaves a thread idle whenever another process holds a
    core.  Instead, a tall product is cut into blocks of ``GEMM_ROWS`` output rows and a long
    reduction into partial products over ``GEMM_SUM_ROWS`` entries of the summed axis, added in
    order; the cuts depend on the shape only, and the blocks go to polygrad's threads."""
    m, k = a.shape
    threads = threads_for(m * k * b.shape[1], SPARSE_PARALLEL_MIN)
    if m >= 2 * GEMM_ROWS:
        def rows(r0: int, r1: int) -> None:
            np.matmul(a[r0:r1], b, out=out[r0:r1])

        run_blocks(rows, _fixed_cuts(m, GEMM_ROWS), threads)
        return out
    if k >= 2 * GEMM_SUM_ROWS:
        cuts = _fixed_cuts(k, GEMM_SUM_ROWS)
        partial = np.empty((len(cuts),) + out.shape, dtype=out.dtype)

        def chunk(i: int, k0: int, k1: int) -> None:
            np.matmul(a[:, k0:k1], b[k0:k1], out=partial[i])

        run_blocks(chunk, [(i, k0, k1) for i, (k0, k1) in enumerate(cuts)], threads)
        out[...] = partial[0]
        for i in range(1, len(cuts)):
            out += partial[i]
        return out
    return np.matmul(a, b, out=out)
