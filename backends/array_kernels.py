"""Every array kernel, written once against an array namespace ``xp`` (numpy or cupy).

``make_kernels(xp)`` returns the ``{(op, layout): kernel}`` table a backend registers.  The NumPy
backend binds ``xp = numpy``; the CuPy backend binds ``xp = cupy`` and overrides only what cuSPARSE
does better.  Because both share this module, the CuPy code path is exercised on CPU by the numpy
tests.

Sparse kernels take the :class:`polygrad.sparse.pattern.Pattern` from attrs and fetch its index arrays
converted once for this namespace (``pattern.on``).  Work on nnz-sized temporaries is done in
bounded chunks so SpMM/SDDMM memory stays O(chunk·F) beyond the output, never O(n·m).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from polygrad.ir.ops import Op
from polygrad.runtime.backend import elementwise_kernels

from . import parallel
from .addcmul_kernels import addcmul_kernel
from .addmm_kernels import addmm_kernel
from .cross_entropy_kernels import cross_entropy_kernel, soft_cross_entropy_kernel

#: elements per temporary chunk in sparse kernels (nnz_chunk * F <= this)
CHUNK_ELEMENTS = 1 << 22
#: gathered elements per chunk in SpMM / SDDMM: small enough to stay in L2 cache, which measured
#: 2-3x faster than 4M-element chunks on a 100k-node, 1M-edge, F=64 graph (64K-256K all similar)
SPARSE_CHUNK_ELEMENTS = 1 << 16


#: device copies of read-only host index arrays (a pattern's transpose permutation, its row ids),
#: so the SpMM/segment backward on a GPU does not upload nnz indices on every pass
_DEVICE_INDEX: dict[tuple[str, int], Any] = {}


def _device_index(xp, array: np.ndarray) -> Any:
    if array.flags.writeable:  # the caller may still change it: convert afresh
        return xp.asarray(array)
    key = (xp.__name__, id(array))
    hit = _DEVICE_INDEX.get(key)
    if hit is None:
        hit = _DEVICE_INDEX[key] = xp.asarray(array)
        weakref.finalize(array, _DEVICE_INDEX.pop, key, None)
    return hit


def _index_for(xp, index: tuple) -> tuple:
    if xp.__name__ == "numpy":
        return index
    return tuple(_device_index(xp, i) if isinstance(i, np.ndarray) else
                 xp.asarray(i) if hasattr(i, "dtype") else i for i in index)


def make_kernels(xp: Any) -> dict[tuple[Op, str], Callable]:
    by_rows: Callable[[Callable[[int, int], None], Any, int, int], None]
    bincount: Callable[[Any, Any, int], Any]
    if xp is np:  # numpy: row blocks balanced by nonzeros on polygrad's threads (same bits at any count)
        by_rows = parallel.by_rows
        bincount = parallel.bincount  # ranges of bins, each summed in input order: the same bits
    else:
        def by_rows(kernel, indptr, n, work):  # one device stream: the whole range at once
            kernel(0, n)

        def bincount(keys, weights, minlength):
            return xp.bincount(keys, weights=weights, minlength=minlength)

    def pattern_arrays(pattern):
        return pattern.on(xp.__name__, xp.asarray)

    def csr_arrays(pattern):
        """(indptr, cols) in this namespace; on numpy the pattern's own arrays, so the per-nonzero
        row ids (``pattern.rows``, nnz int64s) are never expanded and cached for nothing."""
        if xp is np:
            return pattern.indptr, pattern.cols
        indptr, _, cols = pattern_arrays(pattern)
        return indptr, cols

    def relu(x):
        return xp.maximum(x, xp.zeros((), dtype=x.dtype))

    def cast(x, *, dtype):
        return x.astype(dtype)

    def reduce_sum(x, *, axes, keepdims):
        # the method skips np.sum's dispatch; with no axes only bool/int need it (for the dtype)
        return x.sum(axis=axes, keepdims=keepdims) if axes or x.dtype.kind in "biu" else x

    def reduce_max(x, *, axes, keepdims):
        return x.max(axis=axes, keepdims=keepdims) if axes else x

    def reshape(x, *, shape):
        return xp.reshape(x, shape)

    def permute(x, *, perm):
        return xp.transpose(x, perm)

    def expand(x, *, shape):
        return xp.broadcast_to(x, shape)

    def getitem(x, *, index):
        return x[_index_for(xp, index)]

    def index_add(src, *, index, shape):
        out = xp.zeros(shape, dtype=src.dtype)
        idx = _index_for(xp, index)
        # a single integer array on axis 0 (the gather-rows backward): sort-free bincount is
        # deterministic and far faster than ufunc.at
        if (len(idx) == 1 and getattr(idx[0], "ndim", 0) == 1 and src.ndim == len(shape)
                and src.shape == (idx[0].shape[0],) + tuple(shape[1:])):
            rows = idx[0]
            if shape[0] and rows.shape[0] and int(rows.min()) < 0:
                rows = rows % shape[0]  # negative indices count from the end (checked by inference)
            if rows.shape[0] < 2 or bool((rows[1:] > rows[:-1]).all()):
                # distinct rows (sorted, as a mask's are): each is written once. ``+ 0`` gives what
                # a sum from zero does (-0.0 becomes +0.0), bit for bit; 3 us against 15 us at 140 x 7
                out[rows] = src + xp.zeros((), dtype=src.dtype)
                return out
            width = 1
            for n in shape[1:]:
                width *= n
            flat = src.reshape(src.shape[0], width)
            if src.dtype.kind == "f" and width == 1:  # a vector: no linearised index needed
                summed = bincount(rows, flat.reshape(-1).astype(xp.float64), shape[0])
                return summed.astype(src.dtype).reshape(shape)
            if src.dtype.kind == "f" and width:
                cols = xp.arange(width)
                lin = (rows[:, None] * width + cols[None, :]).ravel()
                summed = bincount(lin, flat.ravel().astype(xp.float64), shape[0] * width)
                return summed.astype(src.dtype).reshape(shape)
        xp.add.at(out, idx, src) if xp.__name__ == "numpy" else _scatter_add(xp, out, idx, src)
        return out

    def concat(*arrays, axis):
        return xp.concatenate(arrays, axis=axis)

    # -- sparse kernels -------------------------------------------------------------------------
    # Vectorised over nonzeros; the only Python loops run over chunks of whole rows, each chunk
    # holding at most SPARSE_CHUNK_ELEMENTS gathered elements, so temporaries stay small (and in
    # cache) whatever nnz is.  Row segments are reduced with ufunc.reduceat in CSR order: no
    # atomics, results are bitwise reproducible run to run.

    def segment_reduce(values, pattern, ufunc, fill):
        indptr, _ = csr_arrays(pattern)
        n = pattern.shape[0]
        out = xp.full((n,) + values.shape[1:], fill, dtype=values.dtype)
        if values.shape[0] == 0:
            return out

        def rows(r0: int, r1: int) -> None:  # each segment reduced whole, in order: same bits per block
            lo, hi = int(indptr[r0]), int(indptr[r1])
            if hi == lo:
                return
            starts = indptr[r0:r1]
            nonempty = starts < indptr[r0 + 1:r1 + 1]
            out[r0:r1][nonempty] = ufunc.reduceat(values[lo:hi], starts[nonempty] - lo, axis=0)

        width = 1
        for d in values.shape[1:]:
            width *= d
        by_rows(rows, indptr, n, values.shape[0] * width)
        return out

    def segment_sum(values, *, pattern):
        return segment_reduce(values, pattern, xp.add, 0)

    def segment_max(values, *, pattern):
        return segment_reduce(values, pattern, xp.maximum, 0)

    if xp.__name__ == "numpy":
        def take(x, idx, out):
            # indices were range-checked at construction; mode="raise" would buffer ``out``
            return xp.take(x, idx, axis=0, out=out, mode="clip")
    else:
        def take(x, idx, out):
            return xp.take(x, idx, axis=0, out=out)

    def row_chunks(indptr, n: int, step: int, r0: int = 0):
        """(r0, r1, lo, hi): consecutive whole-row blocks of about ``step`` nonzeros each, from row r0."""
        while r0 < n:
            lo = int(indptr[r0])
            r1 = int(xp.searchsorted(indptr, lo + step, side="right")) - 1
            r1 = min(max(r1, r0 + 1), n)  # a row longer than step is one chunk on its own
            yield r0, r1, lo, int(indptr[r1])
            r0 = r1

    def spmm(values, x, *, pattern):
        indptr, cols = csr_arrays(pattern)
        squeeze = x.ndim == 1
        n = pattern.shape[0]
        dtype = xp.result_type(values.dtype, x.dtype)
        # one contiguous copy in the result dtype when needed: the gather below reads whole rows
        x2 = xp.ascontiguousarray(x.reshape(-1, 1) if squeeze else x, dtype=dtype)
        f = x2.shape[1]
        out = xp.zeros((n, f), dtype=dtype)
        if values.shape[0] and f:
            vals = values.astype(dtype, copy=False)
            step = max(1, SPARSE_CHUNK_ELEMENTS // f)
            buf = xp.empty((step, f), dtype=dtype)
            few_rows = max(1, f // 4)
            for r0, r1, lo, hi in row_chunks(indptr, n, step):
                if hi == lo:
                    continue
                k = hi - lo
                block = buf[:k] if k <= step else xp.empty((k, f), dtype=dtype)
                take(x2, cols[lo:hi], block)                        # X rows of this chunk's nonzeros
                block *= vals[lo:hi, None]                          # scaled by A's values
                if r1 - r0 <= few_rows:
                    # wide F: the chunk spans a few long rows; a contiguous row-vector sum per row
                    # beats reduceat, whose axis-0 loop is one strided pass per column
                    ptr = [int(p) - lo for p in indptr[r0:r1 + 1]]
                    for i in range(r1 - r0):
                        if ptr[i + 1] > ptr[i]:
                            block[ptr[i]:ptr[i + 1]].sum(axis=0, out=out[r0 + i])
                    continue
                row_ptr = indptr[r0:r1 + 1]
                nonempty = row_ptr[:-1] < row_ptr[1:]
                sums = xp.add.reduceat(block, row_ptr[:-1][nonempty] - lo, axis=0)
                if bool(nonempty.all()):
                    out[r0:r1] = sums
                else:
                    out[r0:r1][nonempty] = sums
        return out.reshape(n) if squeeze else out

    def sddmm(p, q, *, pattern):
        # Row blocks in CSR order, each at most SPARSE_CHUNK_ELEMENTS gathered elements (one
        # cache-resident block, never nnz x F): Q's rows at the block's columns are gathered into
        # a reused buffer, P's rows repeated per nonzero (a contiguous copy, no random gather).
        indptr, cols = csr_arrays(pattern)
        n, nnz, f = pattern.shape[0], pattern.nnz, p.shape[1]
        dtype = xp.result_type(p.dtype, q.dtype)
        out = xp.zeros((nnz,), dtype=dtype)
        if f == 0 or nnz == 0:
            return out
        p2 = xp.ascontiguousarray(p, dtype=dtype)
        q2 = xp.ascontiguousarray(q, dtype=dtype)
        step = max(1, SPARSE_CHUNK_ELEMENTS // f)

        def rows(first: int, last: int) -> None:  # each nonzero's dot product whole: same bits per block
            buf = xp.empty((step, f), dtype=dtype)
            for r0, r1, lo, hi in row_chunks(indptr, last, step, first):
                k = hi - lo
                if k == 0:
                    continue
                block = buf[:k] if k <= step else xp.empty((k, f), dtype=dtype)
                take(q2, cols[lo:hi], block)
                counts = indptr[r0 + 1:r1 + 1] - indptr[r0:r1]
                block *= xp.repeat(p2[r0:r1], counts, axis=0)
                block.sum(axis=1, out=out[lo:hi])

        by_rows(rows, indptr, n, nnz * f)
        return out

    k: dict[Op, Callable] = {
        **elementwise_kernels(xp), Op.RELU: relu, Op.CAST: cast,
        Op.SUM: reduce_sum, Op.MAX: reduce_max,
        Op.RESHAPE: reshape, Op.PERMUTE: permute, Op.EXPAND: expand, Op.GETITEM: getitem,
        Op.INDEX_ADD: index_add, Op.CONCAT: concat, Op.MATMUL: xp.matmul,
    }
    table = {(op, "dense"): fn for op, fn in k.items()}
    # keyed once: "csr" and "coo" label one canonical storage (polygrad.ir.ops.kernel_key)
    table[(Op.SPMM, "csr")] = spmm
    table[(Op.SDDMM, "csr")] = sddmm
    table[(Op.SEGMENT_SUM, "csr")] = segment_sum
    table[(Op.SEGMENT_MAX, "csr")] = segment_max
    # the composite's own steps over this table (read at call time: a backend's later overrides count)
    table[(Op.ADDMM, "dense")] = addmm_kernel(table)
    table[(Op.ADDCMUL, "dense")] = addcmul_kernel(table)
    table[(Op.CROSS_ENTROPY, "dense")] = cross_entropy_kernel(table, xp)
    table[(Op.SOFT_CROSS_ENTROPY, "dense")] = soft_cross_entropy_kernel(table, xp)
    return table


def _scatter_add(xp, out, idx, src):
    """Deterministic scatter-add for namespaces without ufunc.at (sorted segment sums)."""
    import cupyx  # only reached with xp = cupy

    cupyx.scatter_add(out, idx, src)
