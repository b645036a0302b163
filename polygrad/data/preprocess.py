"""Containers and preprocessing helpers shared by the polygrad datasets (numpy only).

Everything here works on plain numpy arrays so the data layer does not depend on the tensor
layer; converting to polygrad tensors is the caller's job (``pg.tensor(ds.x_dense())``,
``pg.from_edge_index(ds.edge_index, ds.num_nodes)``...).

Contents
--------
:class:`CSRMatrix`
    A compressed-sparse-row matrix as a validated numpy triple (``indptr``, ``indices``,
    ``data``) plus its ``shape``.  Dataset features are stored in this form.
:class:`GraphDataset`
    A node-classification graph: features, labels, ``edge_index`` and split masks.  The
    Planetoid loader and the synthetic generators both return one.
:func:`row_normalize`, :func:`normalized_adjacency`
    The preprocessing of Kipf & Welling's GCN reference code.
:func:`standardize`, :func:`train_test_split`
    Tabular helpers used with :func:`polygrad.data.make_moons`.
:func:`index_to_mask`, :func:`remove_self_loops`, :func:`coalesce_edge_index`,
:func:`to_undirected`, :func:`edge_index_to_csr`
    Small ``edge_index`` utilities (``edge_index`` is an int64 array of shape ``[2, E]``:
    row 0 the source nodes, row 1 the targets).

Errors: malformed arguments raise :class:`polygrad.errors.DataError` (a ``ValueError``);
structurally invalid sparse triples raise :class:`polygrad.errors.SparseIndexError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from polygrad.autodiff import no_grad
from polygrad.errors import DataError, SparseIndexError
from polygrad.pattern import Pattern, rows_of
from polygrad.sparse import from_edge_index, gcn_norm

__all__ = [
    "CSRMatrix",
    "GraphDataset",
    "row_normalize",
    "normalized_adjacency",
    "standardize",
    "train_test_split",
    "index_to_mask",
    "remove_self_loops",
    "coalesce_edge_index",
    "to_undirected",
    "edge_index_to_csr",
    "as_generator",
    "unique_sorted",
]


def as_generator(seed: Any, what: str = "seed") -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for ``seed``.

    Parameters
    ----------
    seed:
        ``None`` (fresh OS entropy), a non-negative ``int``, or an existing
        ``numpy.random.Generator`` (returned unchanged, so callers can share one stream).
    what:
        Name used in the error message.
    """
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"{what} must be None, a non-negative int or a numpy Generator, "
                        f"got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise DataError(f"{what} must be non-negative, got {seed}")
    return np.random.default_rng(int(seed))


# ----------------------------------------------------------------------------------------------
# CSR container
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Graph dataset container
# ----------------------------------------------------------------------------------------------


@dataclass(eq=False)
class GraphDataset:
    """A node-classification graph held as numpy arrays.

    Attributes
    ----------
    name:
        Dataset name (e.g. ``"cora"``, ``"sbm"``).
    x:
        Node features, a :class:`CSRMatrix` of shape ``[num_nodes, num_features]``.
    y:
        int64 class label of each node, in ``[0, num_classes)``.
    edge_index:
        int64 array ``[2, E]`` of directed edges (each undirected edge appears in both
        directions), sorted by source then target, without duplicates.
    train_mask, val_mask, test_mask:
        Boolean arrays of length ``num_nodes``.
    num_classes:
        Number of classes (for Planetoid: the width of the one-hot label files, which can
        exceed ``y.max() + 1`` in principle).

    ``num_nodes``, ``num_features`` and ``num_edges`` are derived properties.  The
    constructor checks that all shapes agree and raises :class:`polygrad.errors.DataError`
    otherwise.
    """

    name: str
    x: CSRMatrix
    y: np.ndarray
    edge_index: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        if not isinstance(self.x, CSRMatrix):
            raise DataError(f"{self.name}: x must be a CSRMatrix, got {type(self.x).__name__}")
        n = self.x.shape[0]
        self.y = np.asarray(self.y)
        if self.y.shape != (n,) or self.y.dtype.kind not in "iu":
            raise DataError(f"{self.name}: y must be an integer array of shape ({n},), "
                            f"got {self.y.dtype} {self.y.shape}")
        self.y = self.y.astype(np.int64, copy=False)
        self.num_classes = int(self.num_classes)
        if n and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise DataError(f"{self.name}: labels must lie in [0, {self.num_classes}), got "
                            f"[{int(self.y.min())}, {int(self.y.max())}]")
        ei = np.asarray(self.edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
            raise DataError(f"{self.name}: edge_index must be an integer array of shape [2, E], "
                            f"got {ei.dtype} {ei.shape}")
        ei = ei.astype(np.int64, copy=False)
        if ei.size and (ei.min() < 0 or ei.max() >= n):
            raise DataError(f"{self.name}: edge_index refers to nodes outside [0, {n})")
        self.edge_index = ei
        for mname in ("train_mask", "val_mask", "test_mask"):
            m = np.asarray(getattr(self, mname))
            if m.shape != (n,) or m.dtype != np.bool_:
                raise DataError(f"{self.name}: {mname} must be a bool array of shape ({n},), "
                                f"got {m.dtype} {m.shape}")
            setattr(self, mname, m)

    @property
    def num_nodes(self) -> int:
        """Number of nodes (rows of :attr:`x`)."""
        return self.x.shape[0]

    @property
    def num_features(self) -> int:
        """Feature width (columns of :attr:`x`)."""
        return self.x.shape[1]

    @property
    def num_edges(self) -> int:
        """Number of directed edges (columns of :attr:`edge_index`)."""
        return int(self.edge_index.shape[1])

    def x_dense(self, dtype: Any = None) -> np.ndarray:
        """Features as a dense ``[num_nodes, num_features]`` array.

        Parameters
        ----------
        dtype:
            dtype of the result; default: the stored dtype (float32 for Planetoid files).
        """
        return self.x.to_dense(dtype)

    def adjacency(self, dtype: Any = np.float32) -> CSRMatrix:
        """The adjacency matrix ``A[src, dst] = 1`` as a canonical :class:`CSRMatrix`."""
        return edge_index_to_csr(self.edge_index, self.num_nodes, dtype=dtype)

    def split_sizes(self) -> tuple[int, int, int]:
        """``(train, val, test)`` node counts."""
        return int(self.train_mask.sum()), int(self.val_mask.sum()), int(self.test_mask.sum())

    def __repr__(self) -> str:
        tr, va, te = self.split_sizes()
        return (f"{type(self).__name__}(name={self.name!r}, num_nodes={self.num_nodes}, "
                f"num_features={self.num_features}, num_classes={self.num_classes}, "
                f"num_edges={self.num_edges}, x_nnz={self.x.nnz}, split={tr}/{va}/{te})")


# ----------------------------------------------------------------------------------------------
# GCN preprocessing
# ----------------------------------------------------------------------------------------------


def row_normalize(csr: CSRMatrix, dtype: Any = None) -> CSRMatrix:
    """Divide every row by its sum (Kipf & Welling's ``preprocess_features``).

    Rows whose sum is zero are left as they are (all zero for non-negative features), exactly
    like the reference code's ``r_inv[isinf(r_inv)] = 0``.  (PyG's ``NormalizeFeatures``
    additionally clamps the row sum at 1; for binary bag-of-words features both agree.)

    Parameters
    ----------
    csr:
        The feature matrix.
    dtype:
        dtype of the result's data; default: float32 if the input is float32, else float64.

    Returns
    -------
    CSRMatrix
        Same sparsity pattern, normalised values.
    """
    if not isinstance(csr, CSRMatrix):
        raise DataError(f"row_normalize expects a CSRMatrix, got {type(csr).__name__}")
    if dtype is None:
        dtype = np.float32 if csr.data.dtype == np.float32 else np.float64
    sums = csr.row_sums()
    inv = np.zeros_like(sums)
    np.divide(1.0, sums, out=inv, where=sums != 0)
    data = (csr.data.astype(np.float64) * np.repeat(inv, np.diff(csr.indptr))).astype(dtype)
    return CSRMatrix(csr.indptr, csr.indices, data, csr.shape)


def normalized_adjacency(edge_index: Any, num_nodes: int, *, add_self_loops: bool = True,
                         dtype: Any = np.float64) -> CSRMatrix:
    """The GCN propagation matrix ``D^-1/2 (A + I) D^-1/2`` as a canonical :class:`CSRMatrix`.

    Reference helper (numpy) for checking a polygrad GCN.  Duplicate edges are merged first;
    with ``add_self_loops`` any existing self loop is replaced by a single weight-1 loop (as
    PyG's ``gcn_norm`` does).  Nodes of degree zero get zero rows.

    Parameters
    ----------
    edge_index:
        int array ``[2, E]``.
    num_nodes:
        Number of nodes.
    add_self_loops:
        Add the identity before normalising (the GCN renormalisation trick).
    dtype:
        dtype of the values.
    """
    # de-duplicated edges with self loops removed, then polygrad's gcn_norm (which adds the
    # missing loops with weight 1): every loop ends up weight 1, as documented above
    ei = coalesce_edge_index(edge_index, num_nodes)
    if add_self_loops:
        ei = remove_self_loops(ei)
    with no_grad():
        adj = gcn_norm(from_edge_index(ei, num_nodes, dtype=np.float64), add_self_loops=add_self_loops)
    p = adj.pattern
    return CSRMatrix(p.indptr, p.cols, adj.values.numpy().astype(dtype), p.shape)


# ----------------------------------------------------------------------------------------------
# edge_index helpers
# ----------------------------------------------------------------------------------------------


def _check_edge_index(edge_index: Any, num_nodes: int | None, where: str) -> tuple[np.ndarray, int]:
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DataError(f"{where}: edge_index must have shape [2, E], got {ei.shape}")
    if ei.size and ei.dtype.kind not in "iu":
        raise DataError(f"{where}: edge_index must hold integers, got dtype {ei.dtype}")
    ei = ei.astype(np.int64, copy=False)
    if num_nodes is None:
        num_nodes = int(ei.max()) + 1 if ei.size else 0
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise DataError(f"{where}: num_nodes must be non-negative, got {num_nodes}")
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise DataError(f"{where}: edge_index has node ids outside [0, {num_nodes}): "
                        f"range [{int(ei.min())}, {int(ei.max())}]")
    return ei, num_nodes


def index_to_mask(index: Any, size: int) -> np.ndarray:
    """Bool mask of length ``size`` that is True at ``index``.

    Parameters
    ----------
    index:
        Integer ids in ``[0, size)``.
    size:
        Length of the mask.
    """
    idx = np.asarray(index)
    if idx.size and idx.dtype.kind not in "iu":
        raise DataError(f"index_to_mask: index must hold integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise DataError(f"index_to_mask: ids must lie in [0, {size})")
    mask = np.zeros(int(size), dtype=bool)
    mask[idx] = True
    return mask


def remove_self_loops(edge_index: Any) -> np.ndarray:
    """Drop the columns of ``edge_index`` whose source equals its target (order kept)."""
    ei, _ = _check_edge_index(edge_index, None, "remove_self_loops")
    return ei[:, ei[0] != ei[1]]


def coalesce_edge_index(edge_index: Any, num_nodes: int | None = None) -> np.ndarray:
    """Sort ``edge_index`` by (source, target) and drop duplicate columns (PyG's ``coalesce``).

    Parameters
    ----------
    edge_index:
        int array ``[2, E]``.
    num_nodes:
        Number of nodes (default ``max id + 1``); ids must lie in ``[0, num_nodes)``.
    """
    ei, n = _check_edge_index(edge_index, num_nodes, "coalesce_edge_index")
    if ei.shape[1] == 0:
        return ei.reshape(2, 0).copy()
    key = unique_sorted(ei[0] * max(n, 1) + ei[1])
    return np.stack([key // max(n, 1), key % max(n, 1)])


def to_undirected(edge_index: Any, num_nodes: int | None = None) -> np.ndarray:
    """Add the reverse of every edge, then :func:`coalesce_edge_index` (self loops kept once)."""
    ei, n = _check_edge_index(edge_index, num_nodes, "to_undirected")
    return coalesce_edge_index(np.concatenate([ei, ei[::-1]], axis=1), n)


def edge_index_to_csr(edge_index: Any, num_nodes: int, *, values: Any = None,
                      dtype: Any = np.float32) -> CSRMatrix:
    """The ``num_nodes x num_nodes`` matrix with ``A[src, dst] = value`` (duplicates summed).

    Parameters
    ----------
    edge_index:
        int array ``[2, E]``.
    num_nodes:
        Matrix size.
    values:
        Optional weights, one per edge (default 1).
    dtype:
        dtype of the values.
    """
    ei, n = _check_edge_index(edge_index, num_nodes, "edge_index_to_csr")
    vals = np.ones(ei.shape[1], dtype=dtype) if values is None else np.asarray(values, dtype=dtype)
    if vals.shape != (ei.shape[1],):
        raise DataError(f"edge_index_to_csr: values must have shape ({ei.shape[1]},), got {vals.shape}")
    return CSRMatrix.from_coo(ei[0], ei[1], vals, (n, n))


# ----------------------------------------------------------------------------------------------
# tabular helpers
# ----------------------------------------------------------------------------------------------


def _as_float_matrix(X: Any, where: str) -> np.ndarray:
    try:
        a = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: X must be numeric, got {type(X).__name__}") from exc
    if a.ndim not in (1, 2):
        raise DataError(f"{where}: X must be 1-D or 2-D, got shape {a.shape}")
    if a.shape[0] == 0:
        raise DataError(f"{where}: X is empty")
    if not np.all(np.isfinite(a)):
        raise DataError(f"{where}: X contains NaN or Inf")
    return a


def standardize(X: Any, mean: Any = None, std: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre and scale the columns of ``X``: ``(X - mean) / std``.

    Statistics are computed from ``X`` (population std, ``ddof=0``) unless given, so the
    training set's ``mean``/``std`` can be reused on a test set.  A column with std 0 (or a
    given std of 0) is only centred, not scaled: the returned ``std`` holds 1 there, so the
    returned statistics always reproduce ``Xs`` when passed back in.

    Parameters
    ----------
    X:
        Array ``[n, d]`` (or ``[n]``) of finite numbers.
    mean:
        Optional per-column means, shape ``[d]`` (or scalar).
    std:
        Optional per-column standard deviations, shape ``[d]`` (or scalar), non-negative.

    Returns
    -------
    (Xs, mean, std)
        float64 arrays: the standardised data and the statistics used.
    """
    a = _as_float_matrix(X, "standardize")
    col_shape = a.shape[1:]
    if mean is None:
        mu = a.mean(axis=0)
    else:
        mu = _stat(mean, col_shape, "mean")
    if std is None:
        sd = a.std(axis=0)
    else:
        sd = _stat(std, col_shape, "std")
        if np.any(sd < 0):
            raise DataError("standardize: std must be non-negative")
    sd = np.where(sd == 0, 1.0, sd)
    return (a - mu) / sd, np.asarray(mu, dtype=np.float64), np.asarray(sd, dtype=np.float64)


def _stat(v: Any, col_shape: tuple, name: str) -> np.ndarray:
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"standardize: {name} must be numeric") from exc
    try:
        arr = np.broadcast_to(arr, col_shape).copy()
    except ValueError as exc:
        raise DataError(f"standardize: {name} has shape {arr.shape}, expected {col_shape}") from exc
    if not np.all(np.isfinite(arr)):
        raise DataError(f"standardize: {name} contains NaN or Inf")
    return arr


def train_test_split(*arrays: Any, test_size: float | int = 0.25, seed: Any = None,
                     stratify: Any = None, shuffle: bool = True) -> list[np.ndarray]:
    """Split arrays (along their first axis) into random train and test parts.

    Parameters
    ----------
    *arrays:
        One or more array-likes with the same first dimension ``n``.
    test_size:
        Fraction in ``(0, 1)`` (the test part gets ``ceil(test_size * n)`` rows, as in
        scikit-learn) or an absolute count in ``[1, n-1]``.
    seed:
        ``None``, an int or a ``numpy.random.Generator`` (see :func:`as_generator`).
    stratify:
        Optional labels of length ``n``; each class is then split in the same proportion
        (largest-remainder rounding so the total test size is exact).
    shuffle:
        If False, the last ``n_test`` rows become the test part (``stratify`` must be None).

    Returns
    -------
    list of numpy arrays
        ``[a_train, a_test, b_train, b_test, ...]`` in the order the arrays were given.
    """
    if not arrays:
        raise DataError("train_test_split: at least one array is required")
    arrs = [np.asarray(a) for a in arrays]
    for k, a in enumerate(arrs):
        if a.ndim == 0:
            raise DataError(f"train_test_split: array {k} is a scalar")
    n = arrs[0].shape[0]
    for k, a in enumerate(arrs):
        if a.shape[0] != n:
            raise DataError(f"train_test_split: arrays have different lengths "
                            f"({[x.shape[0] for x in arrs]})")
    if n < 2:
        raise DataError(f"train_test_split: need at least 2 samples, got {n}")
    n_test = _resolve_test_size(test_size, n)
    rng = as_generator(seed)
    if stratify is not None:
        if not shuffle:
            raise DataError("train_test_split: stratify requires shuffle=True")
        labels = np.asarray(stratify)
        if labels.shape[:1] != (n,) or labels.ndim != 1:
            raise DataError(f"train_test_split: stratify must be 1-D of length {n}, "
                            f"got shape {labels.shape}")
        test_idx, train_idx = _stratified_indices(labels, n_test, rng)
    elif shuffle:
        perm = rng.permutation(n)
        test_idx, train_idx = perm[:n_test], perm[n_test:]
    else:
        train_idx = np.arange(n - n_test)
        test_idx = np.arange(n - n_test, n)
    out: list[np.ndarray] = []
    for a in arrs:
        out += [a[train_idx], a[test_idx]]
    return out


def _resolve_test_size(test_size: Any, n: int) -> int:
    if isinstance(test_size, (bool, np.bool_)):
        raise DataError("train_test_split: test_size must be a float in (0, 1) or an int count")
    if isinstance(test_size, (int, np.integer)):
        if not 1 <= test_size <= n - 1:
            raise DataError(f"train_test_split: test_size={test_size} must lie in [1, {n - 1}] "
                            f"for {n} samples")
        return int(test_size)
    if isinstance(test_size, (float, np.floating)):
        if not 0.0 < test_size < 1.0:
            raise DataError(f"train_test_split: test_size={test_size} must lie in (0, 1)")
        k = math.ceil(float(test_size) * n)
        if not 1 <= k <= n - 1:
            raise DataError(f"train_test_split: test_size={test_size} leaves an empty part "
                            f"for {n} samples")
        return k
    raise DataError(f"train_test_split: test_size must be a float or int, got {type(test_size).__name__}")


def _stratified_indices(labels: np.ndarray, n_test: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = labels.shape[0]
    classes, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    exact = counts * (n_test / n)
    alloc = np.floor(exact).astype(np.int64)
    remainder = n_test - int(alloc.sum())
    if remainder:
        # largest fractional part first; ties by class order (deterministic)
        order = np.argsort(-(exact - alloc), kind="stable")
        order = order[alloc[order] < counts[order]]
        alloc[order[:remainder]] += 1
    test_parts, train_parts = [], []
    for c in range(classes.shape[0]):
        members = rng.permutation(np.flatnonzero(inv == c))
        test_parts.append(members[:alloc[c]])
        train_parts.append(members[alloc[c]:])
    test_idx = rng.permutation(np.concatenate(test_parts))
    train_idx = rng.permutation(np.concatenate(train_parts))
    return test_idx, train_idx
