"""Matrix products: ``matmul`` (dense or sparse operands, routed), ``addmm`` and the sparse
primitives ``spmm``, ``sddmm``, ``segment_sum``, ``segment_max``."""
from __future__ import annotations



from ..engine.dispatch import apply
from ..ir.ops import Op
from ..runtime.registry import registry

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


_ADDMM_KEY = (Op.ADDMM, "dense")
_NO_KERNELS: dict = {}


def addmm(input: Tensor, mat1, mat2) -> Tensor:  # noqa: A002 - PyTorch's name
    """``mat1 @ mat2 + input`` (PyTorch's ``torch.addmm`` without ``beta``/``alpha``; polygrad's
    ``nn.Linear``).  Two dense 2-D matrices and an ``input`` of their dtype that broadcasts to the
    product run as one op, ``Op.ADDMM``, on a backend with its kernel (the composite's bits);
    anything else -- a sparse operand, a batch, mixed dtypes -- runs the composite itself."""
    if (type(mat1) is type(mat2) is type(input) and not is_sparse(mat1) and not is_sparse(mat2)
            and not is_sparse(input) and mat1.ndim == 2 and mat2.ndim == 2 and input.ndim <= 2
            and mat1.dtype == mat2.dtype == input.dtype
            and registry.tables.get(mat1._be.name, _NO_KERNELS).get(_ADDMM_KEY) is not None
            and _sparse("maybe_sparsify_for_matmul")(mat1, mat2) is None):
        return apply(Op.ADDMM, (input, mat1, mat2))
    return mat1 @ mat2 + input


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
