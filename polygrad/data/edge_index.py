"""Small ``edge_index`` utilities (an int64 array of shape ``[2, E]``: row 0 the source nodes, row
1 the targets): ``index_to_mask``, ``remove_self_loops``, ``coalesce_edge_index``, ``to_undirected``,
``edge_index_to_csr``.  Malformed arguments raise :class:`polygrad.errors.DataError`."""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.ir.errors import DataError

from .csr import CSRMatrix, unique_sorted


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
