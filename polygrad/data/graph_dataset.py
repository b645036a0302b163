"""``GraphDataset``: a node-classification graph (features, labels, ``edge_index``, split masks)
as numpy arrays; the Planetoid loader and the synthetic generators both return one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad.ir.errors import DataError

from .csr import CSRMatrix
from .edge_index import edge_index_to_csr


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
