"""The NumPy backend: vectorised CPU kernels from the shared array-namespace module, with scipy's
compiled CSR kernels where they are faster.

scipy is a core dependency: its ``sparsetools`` (the C++ routines behind ``csr_matrix @ X``) run
SpMM in one compiled pass over the nonzeros, 3-4x faster than gather + ``add.reduceat`` in numpy:
forward ``A @ X`` with the CSR kernel, and, in the fused backward, ``dX = Aᵀ @ dY`` with the CSC
kernel on A's own CSR arrays (A's row pointers are Aᵀ's column pointers), so the backward builds
no transpose and gathers no values: measured at 1M nodes / 11M nonzeros / F=64, 0.63 s against
0.79-0.92 s through the cached transpose, which also costs three nnz-length index arrays.  The
routines are called directly, with no ``csr_matrix`` built (its per-call index checks cost ~13 us,
a third of a Cora-sized SpMM), on int32 copies of the pattern's indices made once per pattern
(:func:`sparsetools_indices`).  The pure-numpy kernel stays the reference
(``array_kernels.make_kernels``) and serves the dtypes sparsetools lacks (float16, ...).
"""
from __future__ import annotations

import numpy as np

import polygrad as pg
from polygrad.runtime.pool import HOST_POOL
from polygrad.runtime.backend import HOST_DLPACK_DEVICES, elementwise_kernels
from polygrad.ir.ops import Op
from polygrad.runtime.threads import BLAS_THREADS, run_blocks, set_blas_threads

from . import parallel
from .array_kernels import make_kernels
from .addcmul_kernels import addcmul_kernel, addcmul_vjp
from .addmm_kernels import addmm_kernel, addmm_vjp
from .cross_entropy_kernels import (cross_entropy_kernel, cross_entropy_vjp, soft_cross_entropy_kernel,
                                    soft_cross_entropy_vjp)
from .kernel_view import DispatchKernels
from .matmul_vjp import dense_matmul_vjp

#: large kernel outputs come from here and are reused once unreferenced (polygrad.runtime.pool)
POOL = HOST_POOL
#: inputs below this many elements cannot make a pooled output (8 bytes each at most): one
#: comparison keeps the wrappers below at ~0.1 us on small arrays
POOL_MIN_ELEMENTS = POOL.min_bytes // 8

#: dtypes the compiled SpMM covers; any other result dtype runs the shared numpy kernel
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
INT32_MAX = int(np.iinfo(np.int32).max)


def sparsetools_indices(pattern) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, cols) for scipy's sparsetools: int32 copies, made once per pattern and cached on
    it, whenever the pattern fits (nnz and both dimensions <= 2**31 - 1); the int64 originals
    otherwise.  Half the index bytes stream through memory: SpMM at 1M nodes / 11M nonzeros,
    F=64, 1.49 s against 1.88 s on int64, for 4 bytes per nonzero and per row, once per graph."""
    if pattern.nnz > INT32_MAX or max(pattern.shape) > INT32_MAX:
        return pattern.indptr, pattern.cols
    return pattern.derived("numpy.int32", lambda p: (p.indptr.astype(np.int32), p.cols.astype(np.int32)))


def compiled_spmm(fallback):
    """SpMM on scipy's compiled CSR kernel; ``fallback`` (the shared kernel) for other dtypes."""

    def spmm(values, x, *, pattern):
        dtype = np.result_type(values.dtype, x.dtype)
        if dtype not in COMPILED_DTYPES:
            return fallback(values, x, pattern=pattern)
        n, m = pattern.shape
        indptr, cols = sparsetools_indices(pattern)
        vals = np.ascontiguousarray(values, dtype=dtype)
        # row blocks balanced by nonzeros, each zeroed and written by one thread (backends/parallel.py)
        out = np.empty(n, dtype=dtype) if x.ndim == 1 else POOL.empty((n, x.shape[1]), dtype)
        parallel.csr_spmm(n, m, indptr, cols, vals, np.ascontiguousarray(x, dtype=dtype), out)
        return out

    # Break-even densities (at F=16, at F=1433) below which this SpMM beats a dense matmul: those the
    # polygrad-scipy plugin measured for the same compiled kernel (17-32% and 6-8%; the low ends kept)
    spmm.polygrad_break_even = (0.17, 0.06)  # type: ignore[attr-defined]
    return spmm


def compiled_spmm_vjp(sddmm):
    """Fused SpMM backward: ``dX = Aᵀ @ dY`` on the compiled CSC kernel (no transpose built) and
    ``dA = dY Xᵀ`` only at A's nonzeros (``sddmm``, the shared chunked kernel), each only when needed;
    other dtypes return None for dX, which makes autodiff use the VJP rule."""

    def spmm_vjp(g, values, x, *, needs, pattern):
        dvalues = dx = None
        if needs[0]:
            g2, x2 = (g.reshape(-1, 1), x.reshape(-1, 1)) if x.ndim == 1 else (g, x)
            dvalues = sddmm(g2, x2, pattern=pattern).astype(values.dtype, copy=False)
        if needs[1]:
            dtype = np.result_type(values.dtype, g.dtype)
            if dtype not in COMPILED_DTYPES:
                raise NotImplementedError(f"compiled SpMM backward: no {dtype} kernel")
            m = pattern.shape[1]
            vals = np.ascontiguousarray(values, dtype=dtype)
            g2 = np.ascontiguousarray(g, dtype=dtype)
            f = 1 if g.ndim == 1 else g.shape[1]
            out = np.empty(m, dtype=dtype) if g.ndim == 1 else POOL.empty((m, f), dtype)
            # one thread: Aᵀ (m x n) stored column-major is exactly A's CSR, scipy's CSC kernel on it;
            # more: Aᵀ's CSR in row blocks, the same bits (backends/parallel.py)
            indptr, cols = sparsetools_indices(pattern)
            parallel.transposed_spmm(pattern, indptr, cols, vals, g2, out)
            dx = out.astype(x.dtype, copy=False)
        return dvalues, dx

    return spmm_vjp


#: below this many elements numpy's own sum is faster than building ones and calling BLAS
#: (0.8-2 us against 4.5 us for 100 x 16 in float64)
BLAS_SUM_MIN = 8192


def leading_axes_sum(fallback):
    """Sums over leading axes (a bias gradient: ``(N, F) -> (F,)``), bit-identical at any thread count.

    numpy reduces over a leading axis row by row, with a loop per row: 39 us for Cora's 2708 x 16
    against 3 us for ``ones @ x`` in BLAS.  But a multi-threaded BLAS splits a matrix-vector
    product's sum between its threads (measured: other bits at 1 and 2 threads), so: a matrix
    product with two rows of ones (a GEMM, which OpenBLAS splits by output element, never along
    the summed axis: same bits at any thread count, tested) up to ``parallel.DENSE_PARALLEL_MIN``
    elements (10 us on Cora's), and above it :func:`parallel.column_sums` (fixed row blocks summed
    in parallel, then in block order).  Floating C-contiguous inputs only; else ``fallback``.
    """

    def reduce_sum(x, *, axes, keepdims):
        k = len(axes)
        if not (x.size >= BLAS_SUM_MIN and 0 < k < x.ndim and axes == tuple(range(k))
                and x.dtype in COMPILED_DTYPES and x.flags.c_contiguous):
            return fallback(x, axes=axes, keepdims=keepdims)
        lead = x.size // int(np.prod(x.shape[k:], dtype=np.int64))
        x2 = x.reshape(lead, -1)
        if x.size < parallel.DENSE_PARALLEL_MIN:
            out = (np.ones((2, lead), dtype=x.dtype) @ x2)[0]
        else:
            out = parallel.column_sums(x2)
        return out.reshape((1,) * k + x.shape[k:] if keepdims else x.shape[k:])

    return reduce_sum


def trailing_axes_reduce(fallback, reduce):
    """Sums / maxima over axes that leave the first one (a softmax's row sums), by blocks of rows
    in parallel when large; every output element reduced as the serial call does."""

    def kernel(x, *, axes, keepdims):
        if x.size < parallel.DENSE_PARALLEL_MIN or not axes or 0 in axes or x.dtype.kind not in "fc":
            return fallback(x, axes=axes, keepdims=keepdims)
        shape = tuple(1 if i in axes and keepdims else n for i, n in enumerate(x.shape)
                      if keepdims or i not in axes)
        out = POOL.empty(shape, x.dtype)
        return parallel.reduce_trailing(reduce, x, axes, keepdims, out)

    return kernel


#: below this many elements np.where's branches are cheap enough (and its call overhead lower),
#: for ``where(cond, 0, b)`` (ReLU's backward).  Measured on random conditions, [N, 32] float64,
#: one thread, a loaded 2-core machine: np.where 6.9 us vs 10.5 us here at 8k elements, 13.0 vs
#: 13.9 at 16k, 19.0 vs 16.4 at 22k (a GIN batch), 96-396 vs 66-76 at 64k
BRANCH_FREE_WHERE_MIN = 1 << 14
#: the same for a general ``a`` (three passes): 27.6 vs 35.2 us at 32k, even at 64k (112-123 vs
#: 106-130), 800-940 vs 255 at 96k, 1.7-2.4 ms vs 0.6-0.7 ms at 256k
BRANCH_FREE_WHERE_GENERAL_MIN = 1 << 16


def where_bits_into(out, cond, bits_a, bits_b, zero_a: bool) -> None:
    """The bits of ``np.where(cond, a, b)`` into ``out`` (``a``'s and ``b``'s bits as signed
    integers of their itemsize, ``out`` of that dtype and of the broadcast shape), with no branch
    per element: ``b & (cond - 1)`` when ``a`` is a 0-d zero (``zero_a``), else
    ``b ^ ((a ^ b) * cond)``; each pass writes ``out`` in place, no temporary.  The numpy
    backend's :func:`branch_free_where` runs it per row block on its threads; the dask plugin
    per dask block."""
    if zero_a:  # where(cond, 0, b) = b & (cond - 1)
        out[...] = cond
        out -= 1  # 0 where cond, all bits set elsewhere
        np.bitwise_and(out, bits_b, out=out)
        return
    np.bitwise_xor(bits_a, bits_b, out=out)
    np.multiply(out, cond, out=out)  # a ^ b where cond, 0 elsewhere
    np.bitwise_xor(out, bits_b, out=out)


def branch_free_where(cond, a, b):
    """``np.where(cond, a, b)``, bit for bit, without a branch per element.

    np.where picks each element with a branch, which mispredicts on a random condition -- ReLU's
    backward after dropout, ``where(out <= 0, 0, g)``, measured 4x slower than a multiply at
    300k x 64.  Working on the bits instead is branch-free and exact for any dtype of 4 or 8
    bytes (NaN, -0.0 and infinities pass through untouched): ``where(cond, 0, b)`` is
    ``b & (cond - 1)`` (a mask of all ones where ``cond`` is False), a general one
    ``b ^ ((a ^ b) * cond)``; each pass writes the (pooled) output in place, no temporary.
    Other cases, and small arrays, go to np.where.
    """
    dt = a.dtype
    if (cond.dtype != np.bool_ or b.dtype != dt or dt.itemsize not in (4, 8) or dt.kind not in "fiu"):
        return np.where(cond, a, b)
    size = max(cond.size, a.size, b.size)
    ints = np.dtype(f"i{dt.itemsize}")
    bits_a, bits_b = a.view(ints), b.view(ints)
    zero_a = a.ndim == 0 and not bits_a
    if size < (BRANCH_FREE_WHERE_MIN if zero_a else BRANCH_FREE_WHERE_GENERAL_MIN):
        return np.where(cond, a, b)
    shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    out = POOL.empty(shape, ints)
    lead, nd = (shape[0], len(shape)) if shape else (1, 0)

    def block(r0: int, r1: int) -> None:
        def part(v):
            return v[r0:r1] if nd and v.ndim == nd and v.shape[0] == lead else v
        where_bits_into(out[r0:r1] if nd else out, part(cond), part(bits_a), part(bits_b), zero_a)

    threads = parallel.threads_for(out.size, parallel.DENSE_PARALLEL_MIN)
    if threads == 1 or not nd:  # one block: splitting it (np.linspace, np.unique) costs ~9 us
        block(0, lead)
    else:
        run_blocks(block, parallel.even_blocks(lead, parallel.blocks_for(threads)), threads)
    return out.view(dt)


def pooled_ufunc(ufunc):
    """``ufunc`` (unary or binary) writing large outputs into pooled buffers, others as usual."""
    resolve = getattr(ufunc, "resolve_dtypes", None)  # numpy >= 1.24
    if resolve is None or ufunc.nout != 1 or ufunc.nin not in (1, 2):
        return ufunc

    def pooled(*arrays):
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        dtype = resolve(tuple(a.dtype for a in arrays) + (None,))[-1]
        return parallel.elementwise(ufunc, arrays, POOL.empty(shape, dtype))

    # one size test per call on the small-array path (Cora-sized steps call these ~40 times)
    if ufunc.nin == 1:
        def kernel(x):
            return ufunc(x) if x.size < POOL_MIN_ELEMENTS else pooled(x)
    else:
        def kernel(x, y):  # type: ignore[misc]
            if x.size < POOL_MIN_ELEMENTS and y.size < POOL_MIN_ELEMENTS:
                return ufunc(x, y)
            return pooled(x, y)

    kernel.__name__ = kernel.__qualname__ = f"pooled_{ufunc.__name__}"
    # a replayed call site with a small output calls the ufunc itself (pg.compile)
    kernel.polygrad_small = (kernel, ufunc, POOL_MIN_ELEMENTS)  # type: ignore[attr-defined]
    return kernel


def relu(x):
    return np.maximum(x, np.zeros((), dtype=x.dtype))


def pooled_relu(x):
    if x.size < POOL_MIN_ELEMENTS:
        return relu(x)
    return parallel.elementwise(np.maximum, (x, np.zeros((), dtype=x.dtype)), POOL.empty(x.shape, x.dtype))


pooled_relu.polygrad_small = (pooled_relu, relu, POOL_MIN_ELEMENTS)  # type: ignore[attr-defined]


def pooled_matmul(a, b):
    """``a @ b``; 2-D products of pooled size write into a pooled buffer, large ones cut into
    blocks that do not depend on the thread count (:func:`parallel.matmul`)."""
    if a.ndim != 2 or b.ndim != 2 or (a.size < POOL_MIN_ELEMENTS and b.size < POOL_MIN_ELEMENTS):
        return np.matmul(a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    if dtype.kind not in "fc" or a.shape[1] != b.shape[0]:
        return np.matmul(a, b)  # integer products and shape errors: numpy's own path and message
    return parallel.matmul(a, b, POOL.empty((a.shape[0], b.shape[1]), dtype))


def small_matmul(a, b):
    """:func:`pooled_matmul` for a small output (even of large operands: its buffer is below the
    pool's size): np.matmul's own, unless the operands are long enough to be cut into blocks."""
    if (a.ndim == 2 and b.ndim == 2
            and (a.shape[0] >= 2 * parallel.GEMM_ROWS or a.shape[1] >= 2 * parallel.GEMM_SUM_ROWS)):
        return pooled_matmul(a, b)
    return np.matmul(a, b)


pooled_matmul.polygrad_small = (pooled_matmul, small_matmul, POOL_MIN_ELEMENTS)  # type: ignore[attr-defined]


def expand(x, *, shape):
    """``np.broadcast_to(x, shape)`` (a read-only view with zero strides), built directly: 1.0 us
    against 1.8 us (np.broadcast_to walks an nditer), and the backward of every sum expands.
    Non-contiguous or non-broadcastable inputs go to np.broadcast_to (its view, or its error)."""
    pad = len(shape) - x.ndim
    if pad < 0 or not x.flags.c_contiguous:
        return np.broadcast_to(x, shape)
    strides = [0] * pad
    for n, m, stride in zip(x.shape, shape[pad:], x.strides):
        if n == m:
            strides.append(stride)
        elif n == 1:
            strides.append(0)
        else:
            return np.broadcast_to(x, shape)
    out = np.ndarray(shape, x.dtype, x, 0, tuple(strides))
    out.flags.writeable = False
    return out


#: elementwise ops whose kernel is a plain ufunc in the shared table (their outputs can come from the pool)
POOLED_UFUNCS = tuple(op for op, fn in elementwise_kernels(np).items() if isinstance(fn, np.ufunc))


class NumpyBackend(pg.Backend):
    name = "numpy"
    description = "vectorised CPU kernels on numpy arrays; scipy's compiled CSR SpMM"
    default_priority = 10  # the default backend unless the user picks another
    dlpack_devices = HOST_DLPACK_DEVICES

    def __init__(self) -> None:
        super().__init__()
        self.kernels = make_kernels(np)
        self.kernels[(Op.SPMM, "csr")] = compiled_spmm(self.kernels[(Op.SPMM, "csr")])
        self.vjp_kernels[(Op.SPMM, "csr")] = compiled_spmm_vjp(self.kernels[(Op.SDDMM, "csr")])
        self.kernels[(Op.WHERE, "dense")] = branch_free_where
        self.kernels[(Op.SUM, "dense")] = leading_axes_sum(
            trailing_axes_reduce(self.kernels[(Op.SUM, "dense")], np.add.reduce))
        self.kernels[(Op.MAX, "dense")] = trailing_axes_reduce(self.kernels[(Op.MAX, "dense")], np.maximum.reduce)
        for op in POOLED_UFUNCS:
            self.kernels[(op, "dense")] = pooled_ufunc(self.kernels[(op, "dense")])
        self.kernels[(Op.RELU, "dense")] = pooled_relu
        self.kernels[(Op.MATMUL, "dense")] = pooled_matmul
        self.kernels[(Op.EXPAND, "dense")] = expand
        # fused kernels call what dispatch runs (overrides and injected faults included)
        dispatched = DispatchKernels(self.name, self.kernels)
        self.kernels[(Op.ADDMM, "dense")] = addmm_kernel(dispatched)
        self.kernels[(Op.ADDCMUL, "dense")] = addcmul_kernel(dispatched)
        self.kernels[(Op.CROSS_ENTROPY, "dense")] = cross_entropy_kernel(dispatched, np)
        self.kernels[(Op.SOFT_CROSS_ENTROPY, "dense")] = soft_cross_entropy_kernel(dispatched, np)
        self.vjp_kernels[(Op.MATMUL, "dense")] = dense_matmul_vjp(dispatched)
        self.vjp_kernels[(Op.ADDMM, "dense")] = addmm_vjp(dispatched)
        self.vjp_kernels[(Op.ADDCMUL, "dense")] = addcmul_vjp(dispatched)
        self.vjp_kernels[(Op.CROSS_ENTROPY, "dense")] = cross_entropy_vjp(dispatched, np)
        self.vjp_kernels[(Op.SOFT_CROSS_ENTROPY, "dense")] = soft_cross_entropy_vjp(dispatched, np)
        self.pool = POOL
        # from the first product on, not only from the first parallel kernel: a product's bits
        # must not depend on how many threads OpenBLAS would have chosen (polygrad.runtime.threads)
        set_blas_threads(BLAS_THREADS)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_numpy(self, array) -> np.ndarray:
        return np.asarray(array)

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def shape(self, array) -> tuple[int, ...]:
        return array.shape

    def dtype(self, array) -> np.dtype:
        return array.dtype


@pg.hookimpl
def polygrad_backends():
    return [NumpyBackend()]
