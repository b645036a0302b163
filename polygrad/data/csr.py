"""``CSRMatrix``: a compressed-sparse-row matrix as a validated numpy triple (``indptr``,
``indices``, ``data``) plus its ``shape``; dataset features are stored in this form.  Numpy only:
converting to polygrad tensors is the caller's job.

Structurally invalid triples raise :class:`polygrad.errors.SparseIndexError`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from polygrad.ir.errors import DataError, SparseIndexError
from polygrad.sparse.pattern import Pattern, rows_of



@dataclass(frozen=True, eq=False)
class CSRMatrix:
    """A compressed-sparse-row matrix as plain numpy arrays.

    Row ``i`` holds the entries ``data[indptr[i]:indptr[i+1]]`` at the columns
    ``indices[indptr[i]:indptr[i+1]]``.

    Attributes
    ----------
    indptr:
        int64 array of length ``shape[0] + 1``; non-decreasing, starts at 0, ends at ``nnz``.
    indices:
        int64 array of length ``nnz``; column ids in ``[0, shape[1])``.
    data:
        1-D numeric array of length ``nnz`` (float32 for the Planetoid files, as stored there).
    shape:
        ``(rows, cols)`` as Python ints.

    The constructor converts index arrays to int64 and validates the structure (raising
    :class:`polygrad.errors.SparseIndexError`).  It does not require sorted or duplicate-free
    column indices; :meth:`canonical` returns that form.
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(s) for s in self.shape)
        except (TypeError, ValueError) as exc:
            raise SparseIndexError(f"CSRMatrix: shape must be two ints, got {self.shape!r}") from exc
        if len(shape) != 2 or shape[0] < 0 or shape[1] < 0:
            raise SparseIndexError(f"CSRMatrix: shape must be two non-negative ints, got {self.shape!r}")
        indptr = _as_index_array(self.indptr, "indptr")
        indices = _as_index_array(self.indices, "indices")
        data = np.asarray(self.data)
        if data.ndim != 1:
            raise SparseIndexError(f"CSRMatrix: data must be 1-D, got shape {data.shape}")
        if data.dtype.kind not in "biuf":
            raise SparseIndexError(
                f"CSRMatrix: data must be numeric (bool/int/float), got dtype {data.dtype}")
        rows, cols = shape
        if indptr.shape != (rows + 1,):
            raise SparseIndexError(
                f"CSRMatrix: indptr must have length rows+1 = {rows + 1}, got {indptr.shape[0]}")
        nnz = indices.shape[0]
        if data.shape[0] != nnz:
            raise SparseIndexError(
                f"CSRMatrix: data has {data.shape[0]} entries but indices has {nnz}")
        if indptr[0] != 0 or indptr[-1] != nnz:
            raise SparseIndexError(
                f"CSRMatrix: indptr must start at 0 and end at nnz={nnz}, "
                f"got {int(indptr[0])}..{int(indptr[-1])}")
        if rows and np.any(np.diff(indptr) < 0):
            raise SparseIndexError("CSRMatrix: indptr must be non-decreasing")
        if nnz and (indices.min() < 0 or indices.max() >= cols):
            raise SparseIndexError(
                f"CSRMatrix: column indices must lie in [0, {cols}), "
                f"got range [{int(indices.min())}, {int(indices.max())}]")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "shape", shape)

    # -- basic properties -----------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of stored entries (explicit zeros and duplicates included)."""
        return int(self.indices.shape[0])

    @property
    def dtype(self) -> np.dtype:
        """dtype of :attr:`data`."""
        return self.data.dtype

    @property
    def density(self) -> float:
        """``nnz / (rows * cols)`` (0.0 for an empty shape)."""
        total = self.shape[0] * self.shape[1]
        return self.nnz / total if total else 0.0

    def row_ids(self) -> np.ndarray:
        """int64 row index of every stored entry (the COO row array)."""
        return rows_of(self.indptr)

    def __repr__(self) -> str:
        return (f"CSRMatrix(shape={self.shape}, nnz={self.nnz}, dtype={self.data.dtype}, "
                f"density={self.density:.4g})")

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, array: Any) -> "CSRMatrix":
        """Build a CSR matrix holding the nonzeros of a 2-D array.

        Parameters
        ----------
        array:
            Any 2-D array-like of numbers.
        """
        a = np.asarray(array)
        if a.ndim != 2:
            raise DataError(f"CSRMatrix.from_dense: expected a 2-D array, got shape {a.shape}")
        rows, cols = np.nonzero(a)  # row-major: canonical order
        pattern = Pattern.from_sorted(a.shape, rows, cols)
        return cls(pattern.indptr, pattern.cols, a[rows, cols], a.shape)

    @classmethod
    def from_coo(cls, row: Any, col: Any, data: Any, shape: tuple[int, int]) -> "CSRMatrix":
        """Build a canonical CSR matrix from COO triplets; duplicate entries are summed.

        Parameters
        ----------
        row, col:
            Integer coordinates of each entry.
        data:
            Values, one per entry.
        shape:
            ``(rows, cols)``.
        """
        row = _as_index_array(row, "row")
        col = _as_index_array(col, "col")
        data = np.asarray(data)
        if not (row.shape == col.shape == data.shape):
            raise SparseIndexError(
                f"CSRMatrix.from_coo: row, col and data must have equal lengths, got "
                f"{row.shape[0]}, {col.shape[0]}, {data.shape}")
        rows, cols = int(shape[0]), int(shape[1])
        if row.size and (row.min() < 0 or row.max() >= rows or col.min() < 0 or col.max() >= cols):
            raise SparseIndexError(f"CSRMatrix.from_coo: coordinates out of range for shape {shape}")
        return _canonical_from_coo(row, col, data, (rows, cols))

    @staticmethod
    def vstack(blocks: Sequence["CSRMatrix"]) -> "CSRMatrix":
        """Stack CSR matrices with the same number of columns on top of each other."""
        if not blocks:
            raise DataError("CSRMatrix.vstack: need at least one block")
        cols = blocks[0].shape[1]
        for b in blocks:
            if b.shape[1] != cols:
                raise DataError(f"CSRMatrix.vstack: column counts differ ({b.shape[1]} vs {cols})")
        offsets = np.cumsum([0] + [b.nnz for b in blocks[:-1]])
        indptr = np.concatenate([blocks[0].indptr[:1]]
                                + [b.indptr[1:] + off for b, off in zip(blocks, offsets)])
        dtype = np.result_type(*[b.data.dtype for b in blocks])
        return CSRMatrix(indptr,
                         np.concatenate([b.indices for b in blocks]),
                         np.concatenate([b.data.astype(dtype, copy=False) for b in blocks]),
                         (sum(b.shape[0] for b in blocks), cols))

    # -- transforms -----------------------------------------------------------------------------
    def take_rows(self, rows: Any) -> "CSRMatrix":
        """Return the matrix whose row ``k`` is this matrix's row ``rows[k]``.

        Parameters
        ----------
        rows:
            1-D integer array of row ids in ``[0, shape[0])`` (repeats allowed).
        """
        rows = _as_index_array(rows, "rows")
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise DataError(f"CSRMatrix.take_rows: row ids must lie in [0, {self.shape[0]})")
        starts = self.indptr[rows]
        counts = self.indptr[rows + 1] - starts
        indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        # gather positions: for each output entry, start of its source row + offset within row
        pos = np.repeat(starts - indptr[:-1], counts) + np.arange(indptr[-1], dtype=np.int64)
        return CSRMatrix(indptr, self.indices[pos], self.data[pos], (rows.shape[0], self.shape[1]))

    def canonical(self) -> "CSRMatrix":
        """Return an equal matrix with sorted column indices and duplicates summed.

        Explicit zeros are kept.  Returns ``self`` when already canonical.
        """
        if self.nnz == 0:
            return self
        row = self.row_ids()
        key = row * max(self.shape[1], 1) + self.indices
        if np.all(key[1:] > key[:-1]):
            return self
        return _canonical_from_coo(row, self.indices, self.data, self.shape)

    def astype(self, dtype: Any) -> "CSRMatrix":
        """Return a copy whose :attr:`data` has ``dtype`` (index arrays are shared)."""
        return CSRMatrix(self.indptr, self.indices, self.data.astype(dtype), self.shape)

    def to_dense(self, dtype: Any = None) -> np.ndarray:
        """Return the dense ``shape`` array (duplicates summed).

        Parameters
        ----------
        dtype:
            dtype of the result; default: the dtype of :attr:`data`.
        """
        out = np.zeros(self.shape, dtype=dtype if dtype is not None else self.data.dtype)
        np.add.at(out, (self.row_ids(), self.indices), self.data)
        return out

    def row_sums(self) -> np.ndarray:
        """Sum of each row, as float64 array of length ``shape[0]``."""
        sums = np.zeros(self.shape[0], dtype=np.float64)
        np.add.at(sums, self.row_ids(), self.data.astype(np.float64))
        return sums

    def transpose(self) -> "CSRMatrix":
        """Return the transpose, in canonical CSR form."""
        return _canonical_from_coo(self.indices, self.row_ids(), self.data,
                                   (self.shape[1], self.shape[0]))

    @property
    def T(self) -> "CSRMatrix":  # noqa: N802 - numpy naming
        """The transpose (see :meth:`transpose`)."""
        return self.transpose()

    def matmul(self, dense: Any) -> np.ndarray:
        """Reference ``self @ dense`` for a 1-D or 2-D dense array (plain numpy, float64-safe)."""
        b = np.asarray(dense)
        if b.shape[0] != self.shape[1]:
            raise DataError(f"CSRMatrix.matmul: shapes {self.shape} and {b.shape} do not align")
        dtype = np.result_type(self.data.dtype, b.dtype)
        out = np.zeros((self.shape[0],) + b.shape[1:], dtype=dtype)
        contrib = b[self.indices] * (self.data.reshape((-1,) + (1,) * (b.ndim - 1)))
        np.add.at(out, self.row_ids(), contrib)
        return out

    def __matmul__(self, other: Any) -> np.ndarray:
        return self.matmul(other)


def unique_sorted(values: Any) -> np.ndarray:
    """Sorted distinct values of a 1-D array (sort + adjacent compare).

    Same result as ``np.unique(values)``, but always sort-based: some numpy releases (2.3+)
    switched ``np.unique`` to a hash-based path that is many times slower on ~10^7 int64 keys.
    """
    s = np.sort(np.asarray(values).ravel())
    if s.size < 2:
        return s
    keep = np.empty(s.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def _as_index_array(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise SparseIndexError(f"CSRMatrix: {name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise SparseIndexError(f"CSRMatrix: {name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise SparseIndexError(f"CSRMatrix: {name} has values beyond int64")
    return arr.astype(np.int64, copy=False)


def _canonical_from_coo(row: np.ndarray, col: np.ndarray, data: np.ndarray,
                        shape: tuple[int, int]) -> CSRMatrix:
    """Canonical CSR (sorted, duplicates summed in input order) through polygrad's one canonicaliser."""
    # copies: a pattern owns (and freezes) the index arrays it is handed, and these are the caller's
    pattern, perm, slot = Pattern.from_coo(shape, np.array(row, dtype=np.int64), np.array(col, dtype=np.int64))
    data = np.asarray(data)
    if perm is not None:
        data = data[perm]
    elif slot is not None:
        summed = np.zeros(pattern.nnz, dtype=data.dtype)
        np.add.at(summed, slot, data)  # in input order, in data's dtype
        data = summed
    return CSRMatrix(pattern.indptr, pattern.cols, data, shape)
