"""Matrix products: ``matmul`` (dense or sparse operands, routed) and the sparse primitives
``spmm``, ``sddmm``, ``segment_sum``, ``segment_max``."""
from __future__ import annotations



from ..engine.dispatch import apply
from ..ir.ops import Op

from .args import Tensor
from .elementwise import _pair
from .sparse_routing import _sparse, is_sparse


def matmul(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse("matmul")(a, b)
    a, b = _pair(a, b)
    return _dense_matmul(a, b)


def _dense_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for two dense tensors: sparse when the layout policy says ``a`` is cheaper so."""
    a_sparse = _sparse("maybe_sparsify_for_matmul")(a, b)
    if a_sparse is not None:
        return _sparse("matmul")(a_sparse, b)
    return apply(Op.MATMUL, (a, b))


# -- sparse primitives (the pattern rides in attrs; values are a dense 1-D operand) --------------------

def spmm(values: Tensor, x: Tensor, pattern) -> Tensor:
    """``A @ X`` for the sparse matrix (pattern, values): touches only A's nonzeros."""
    return apply(Op.SPMM, (values, x), {"pattern": pattern}, pattern.layout)


def sddmm(p: Tensor, q: Tensor, pattern) -> Tensor:
    """``(P @ Qᵀ)`` sampled at the pattern's nonzeros: one value per nonzero, O(nnz·F)."""
    return apply(Op.SDDMM, (p, q), {"pattern": pattern}, pattern.layout)


def segment_sum(values: Tensor, pattern) -> Tensor:
    """Row sums of the sparse matrix (pattern, values) (deterministic segment reduction)."""
    return apply(Op.SEGMENT_SUM, (values,), {"pattern": pattern}, pattern.layout)


def segment_max(values: Tensor, pattern) -> Tensor:
    """Row maxima over the nonzeros (no gradient; empty rows give 0)."""
    return apply(Op.SEGMENT_MAX, (values,), {"pattern": pattern}, pattern.layout)
