"""Sparse tensors (COO / CSR), their ops, and the layout policy.

A :class:`SparseTensor` is a :class:`~polygrad.sparse.pattern.Pattern` (canonical CSR index arrays on the
host, shared and immutable) plus a dense 1-D :class:`~polygrad.tensor.Tensor` of values, one per
stored entry.  Only the values live in the autodiff graph, so every sparse op below is a few dense
ops on the values plus the pattern-aware primitives SPMM, SDDMM and SEGMENT_SUM/MAX
(``polygrad.tensor.spmm`` ...).  Consequences:

* the gradient of a sparse leaf is a sparse tensor with the leaf's pattern (``A.grad``);
* a leaf used in several places accumulates its values' gradient like any dense tensor;
* ``A + B`` of different patterns gives the union pattern, ``A * B`` the intersection, so adding
  two sparse gradients merges their patterns;
* reductions are segment (CSR) based or sort-free bincounts: deterministic, bitwise reproducible.

Canonical form is established once, at construction: entries sorted row-major, duplicates summed
(in input order, deterministically), explicit zeros *kept* as stored entries (they are structure:
a learnable edge weight may start at 0).  "coo" and "csr" are two labels of this one storage, so
no op ever re-sorts.  The transpose permutation (CSC order) is computed on first use and cached on
the pattern.

Elementwise functions (``relu``, ``exp``, ...) act on the stored values only: the implicit zeros
stay implicit, which is what attention-style GNNs want; for a function with f(0) != 0 this is not
the dense ``f(A)`` -- use ``A.to_dense().exp()`` for that.  Likewise ``sparse * dense`` ignores the
dense operand outside the pattern (``0 * inf`` is taken as 0).

The package, one concern per module (each imports only those listed before it):

* ``layout``        -- :func:`choose_layout`, the one place the density / cost / memory policy lives;
* ``sparse_tensor`` -- :class:`SparseTensor` and the value-level ops its methods are made of;
* ``construct``     -- validation, canonical form, conversions, pattern union / intersection;
* ``ops``           -- arithmetic and matmul with sparse operands (``polygrad.tensor`` routes here);
* ``graph``         -- ``add_self_loops``, ``gcn_norm``;
* ``autosparse``    -- the cached automatic sparsification of dense matmul operands.
"""
from __future__ import annotations

from .layout import (BREAK_EVEN_ATTRIBUTE, BREAK_EVEN_EXPONENT, BREAK_EVEN_F16, BREAK_EVEN_F1433, BREAK_EVEN_MAX,
                     BREAK_EVEN_MIN, DEFAULT_FEATURE_WIDTH, LAYOUTS, break_even_density, choose_layout)
from ..tensor import is_sparse, register_sparse_api
from .sparse_tensor import SparseTensor, row_softmax, scale_cols, scale_rows, sparse_sum, to_dense, transpose
from .construct import (from_dense_data, from_edge_index, from_scipy, intersect_pattern, sparse_coo, sparse_csr,
                        to_sparse, union_pattern)
from .ops import add, div, matmul, mul, pow, sub  # noqa: A004
from .graph import add_self_loops, gcn_norm
from .autosparse import _matmul_cache, maybe_sparsify_for_matmul

# Tensor's sparse routing (sparse operands of add/mul/matmul/sum/transpose, to_sparse, layout=):
# the dense module cannot import this package, which imports it, so it is handed these here.
register_sparse_api(to_sparse=to_sparse, from_dense_data=from_dense_data, sum=sparse_sum, transpose=transpose,
                    matmul=matmul, add=add, sub=sub, mul=mul, div=div, pow=pow,
                    maybe_sparsify_for_matmul=maybe_sparsify_for_matmul)

__all__ = [
    "SparseTensor", "sparse_coo", "sparse_csr", "from_edge_index", "from_scipy", "to_sparse", "to_dense",
    "is_sparse", "add_self_loops", "gcn_norm", "scale_rows", "scale_cols", "row_softmax",
    "union_pattern", "intersect_pattern", "choose_layout", "break_even_density",
]
