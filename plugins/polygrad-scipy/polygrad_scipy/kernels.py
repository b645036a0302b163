"""Sparse kernels on scipy.sparse, in polygrad's kernel calling convention.

Every kernel receives the operands as numpy arrays and the sparsity pattern as the ``pattern``
attribute (a ``polygrad.sparse.pattern.Pattern``: canonical CSR ``indptr``/``cols``, the ``rows`` of
each nonzero, ``shape``, ``nnz``, a cached ``transpose()`` and a per-key cache ``on(key, fn)``).

SpMM is where scipy wins: its compiled CSR x dense product (``csr_matvecs``) beats numpy's
gather + ``add.reduceat`` by 4-20x (see the README).  SDDMM and the segment reductions have no
scipy routine that beats numpy, so they are plain numpy here (used by the ``scipy`` backend; the
numpy backend keeps its own).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse import _sparsetools

_INT32_MAX = np.iinfo(np.int32).max
#: elements per temporary in the chunked SDDMM (bounds memory at O(chunk), not O(nnz * F))
CHUNK_ELEMENTS = 1 << 22


def _index_arrays(pattern: Any) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) in the index dtype scipy would pick, converted once per pattern and cached."""
    def convert(arr: np.ndarray) -> np.ndarray:
        fits = max(pattern.shape) <= _INT32_MAX and pattern.nnz <= _INT32_MAX
        return arr.astype(np.int32 if fits else np.int64, copy=False)
    indptr, _, cols = pattern.on("polygrad_scipy", convert)
    return indptr, cols


def as_csr(values: np.ndarray, pattern: Any, dtype: Any = None) -> sp.csr_matrix:
    """The scipy CSR matrix (pattern, values) without copying the index arrays."""
    indptr, indices = _index_arrays(pattern)
    data = values if dtype is None else values.astype(dtype, copy=False)
    return sp.csr_matrix((data, indices, indptr), shape=pattern.shape, copy=False)


#: dtypes the direct sparsetools calls below cover; others go through ``csr_matrix @ X``
DIRECT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _matvecs(routine_1d: Any, routine_2d: Any, n_out: int, n_in: int, indptr: np.ndarray, indices: np.ndarray,
             values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One sparsetools routine on (indptr, indices, values) and ``x``, into a fresh zeroed output.

    Called directly rather than through ``csr_matrix @ x``: building the scipy matrix re-checks the
    index arrays on every call, ~13 us that a Cora-sized SpMM (~40 us) cannot afford.
    """
    if x.ndim == 1:
        out = np.zeros(n_out, dtype=x.dtype)
        if values.shape[0]:
            routine_1d(n_out, n_in, indptr, indices, values, x, out)
        return out
    f = x.shape[1]
    out = np.zeros((n_out, f), dtype=x.dtype)
    if values.shape[0] and f:
        routine_2d(n_out, n_in, f, indptr, indices, values, x.ravel(), out.ravel())
    return out


def spmm(values: np.ndarray, x: np.ndarray, *, pattern: Any) -> np.ndarray:
    """``A @ X`` (X 1-D or 2-D) with A = (pattern, values); dtype as numpy's result_type."""
    dtype = np.result_type(values.dtype, x.dtype)
    if dtype not in DIRECT_DTYPES:
        out = as_csr(values, pattern, dtype) @ x.astype(dtype, copy=False)
        return np.asarray(out, dtype=dtype)
    indptr, indices = _index_arrays(pattern)
    n, m = pattern.shape
    return _matvecs(_sparsetools.csr_matvec, _sparsetools.csr_matvecs, n, m, indptr, indices,
                    np.ascontiguousarray(values, dtype=dtype), np.ascontiguousarray(x, dtype=dtype))


# Break-even densities (at F=16, at F=1433) below which this SpMM beats a dense matmul, measured with
# `python -m benchmarks sparse` on the project's 2-core machines (17-32% and 6-8%; the low ends kept):
# polygrad's layout policy uses them instead of the pure-numpy kernels' calibration.
spmm.polygrad_break_even = (0.17, 0.06)  # type: ignore[attr-defined]


def sddmm(p: np.ndarray, q: np.ndarray, *, pattern: Any) -> np.ndarray:
    """``(P @ Q.T)`` at the pattern's nonzeros, in bounded chunks: O(nnz * F) work, O(chunk) memory."""
    rows, cols = pattern.rows, pattern.cols
    dtype = np.result_type(p.dtype, q.dtype)
    out = np.empty(pattern.nnz, dtype=dtype)
    step = max(1, CHUNK_ELEMENTS // max(p.shape[1], 1))
    for lo in range(0, pattern.nnz, step):
        hi = min(pattern.nnz, lo + step)
        out[lo:hi] = np.einsum("ij,ij->i", p[rows[lo:hi]], q[cols[lo:hi]])
    return out


def _segment(values: np.ndarray, pattern: Any, ufunc: Any) -> np.ndarray:
    out = np.zeros(pattern.shape[0], dtype=values.dtype)
    starts = pattern.indptr[:-1]
    nonempty = starts < pattern.indptr[1:]
    if values.shape[0]:
        out[nonempty] = ufunc.reduceat(values, starts[nonempty])
    return out


def segment_sum(values: np.ndarray, *, pattern: Any) -> np.ndarray:
    """Row sums over the nonzeros (deterministic: one reduceat, no atomics)."""
    return _segment(values, pattern, np.add)


def segment_max(values: np.ndarray, *, pattern: Any) -> np.ndarray:
    """Row maxima over the nonzeros; empty rows give 0 (polygrad's convention)."""
    return _segment(values, pattern, np.maximum)


def spmm_vjp(g: np.ndarray, values: np.ndarray, x: np.ndarray, *, needs: tuple, pattern: Any) -> tuple:
    """Fused backward of SpMM: ``dX = A.T @ dY`` (scipy's CSC view of A: no transpose, no gather)
    and ``dA = dY X.T`` only at A's nonzeros (an SDDMM), each computed only when needed."""
    dvalues = dx = None
    if needs[0]:
        g2 = g.reshape(-1, 1) if g.ndim == 1 else g
        x2 = x.reshape(-1, 1) if x.ndim == 1 else x
        dvalues = sddmm(g2, x2, pattern=pattern).astype(values.dtype, copy=False)
    if needs[1]:
        dtype = np.result_type(values.dtype, g.dtype)
        if dtype in DIRECT_DTYPES:
            # Aᵀ (m x n) stored column-major is exactly A's CSR: the CSC routine on A's own arrays
            indptr, indices = _index_arrays(pattern)
            n, m = pattern.shape
            dx = _matvecs(_sparsetools.csc_matvec, _sparsetools.csc_matvecs, m, n, indptr, indices,
                          np.ascontiguousarray(values, dtype=dtype), np.ascontiguousarray(g, dtype=dtype))
        else:
            dx = np.asarray(as_csr(values, pattern, dtype).T @ g.astype(dtype, copy=False))
        dx = dx.astype(x.dtype, copy=False)
    return dvalues, dx
