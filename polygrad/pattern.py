"""The sparsity pattern of a sparse matrix: canonical CSR index arrays, shared and immutable.

A sparse tensor is a :class:`Pattern` plus a dense 1-D tensor of values (one per nonzero).  Keeping
the pattern outside the autodiff graph is what lets every sparse op be written as dense ops on the
values plus a few pattern-aware primitives (SpMM, SDDMM, segment reductions), and what makes a
gradient w.r.t. a sparse tensor a sparse tensor with the same pattern.

Canonical form (sorted row-major, no duplicates) is established once by the constructors in
``sparse.py``; a Pattern trusts it and never re-sorts.  The transpose (CSC order) is computed on
first use and cached, as are the index arrays converted for each backend.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import memory


class Pattern:
    """Row-major canonical pattern of an ``nrows x ncols`` sparse matrix.

    Attributes (numpy arrays, host memory; never mutated):
      indptr  int64[nrows+1]  CSR row pointers
      rows    int64[nnz]      row of each nonzero (COO view of the same order)
      cols    int64[nnz]      column of each nonzero, sorted within each row
    ``layout`` is the user-facing label ("csr" or "coo"): both share this canonical storage.
    """

    __slots__ = ("shape", "indptr", "rows", "cols", "layout", "_transpose", "_device", "__weakref__")

    def __init__(self, shape: tuple[int, int], indptr: np.ndarray, cols: np.ndarray,
                 layout: str = "csr", rows: np.ndarray | None = None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.indptr = indptr
        self.cols = cols
        if rows is None:
            rows = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(indptr))
            rows.flags.writeable = False  # ours: read-only lets backends cache device copies
        self.rows = rows
        for arr in (indptr, cols, rows):  # never mutated: enforced, so device caches stay valid
            if isinstance(arr, np.ndarray):
                arr.flags.writeable = False
        self.layout = layout
        self._transpose: tuple[Pattern, np.ndarray] | None = None
        self._device: dict[Any, Any] = {}

    @property
    def nnz(self) -> int:
        return int(self.cols.shape[0])

    @property
    def density(self) -> float:
        size = self.shape[0] * self.shape[1]
        return self.nnz / size if size else 0.0

    def with_layout(self, layout: str) -> "Pattern":
        """The same pattern under another label, sharing arrays and caches."""
        if layout == self.layout:
            return self
        twin = Pattern(self.shape, self.indptr, self.cols, layout, self.rows)
        twin._transpose, twin._device = self._transpose, self._device
        return twin

    def transpose(self) -> tuple["Pattern", np.ndarray]:
        """(pattern of Aᵀ, perm) with ``values_T = values[perm]``; computed once, then cached."""
        if self._transpose is None:
            # budgeted before allocating: the column pointers follow the column count, which a
            # hostile shape can make far larger than nnz (int64 indptr, perm, rows, cols, inverse)
            memory.check("transpose", 8 * (self.shape[1] + 1) + 32 * self.nnz,
                         what=f"the transpose of a sparse {self.shape} pattern with {self.nnz} entries")
            # stable sort by column keeps rows ascending within each column: canonical for Aᵀ
            perm = np.argsort(self.cols, kind="stable")
            perm.flags.writeable = False  # ours: read-only lets backends cache device copies
            t_indptr = np.zeros(self.shape[1] + 1, dtype=np.int64)
            np.cumsum(np.bincount(self.cols, minlength=self.shape[1]), out=t_indptr[1:])
            t = Pattern((self.shape[1], self.shape[0]), t_indptr, self.rows[perm], self.layout,
                        rows=self.cols[perm])
            inv = np.empty_like(perm)
            inv[perm] = np.arange(perm.shape[0])
            t._transpose = (self, inv)
            self._transpose = (t, perm)
        return self._transpose

    def on(self, key: Any, convert: Callable[[np.ndarray], Any]) -> tuple[Any, Any, Any]:
        """(indptr, rows, cols) converted once per backend (``key``) and cached: no copy per call."""
        arrays = self._device.get(key)
        if arrays is None:
            arrays = (convert(self.indptr), convert(self.rows), convert(self.cols))
            self._device[key] = arrays
        return arrays

    def same_as(self, other: "Pattern") -> bool:
        return self is other or (self.shape == other.shape and self.nnz == other.nnz
                                 and np.array_equal(self.indptr, other.indptr)
                                 and np.array_equal(self.cols, other.cols))

    def __repr__(self) -> str:
        return f"Pattern(shape={self.shape}, nnz={self.nnz}, layout={self.layout!r})"
