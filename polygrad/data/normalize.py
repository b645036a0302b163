"""The preprocessing of Kipf & Welling's GCN reference code: ``row_normalize`` (features) and
``normalized_adjacency`` (D^-1/2 (A + I) D^-1/2)."""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.engine.autodiff import no_grad
from polygrad.ir.errors import DataError
from polygrad.sparse import from_edge_index, gcn_norm

from .csr import CSRMatrix
from .edge_index import coalesce_edge_index, remove_self_loops


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
