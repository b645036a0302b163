"""Sparse ops: ``+ - * / **`` and ``@`` with sparse, dense and scalar operands.

``polygrad.tensor`` routes add/sub/mul/div/pow/sum/transpose/matmul here when an operand is sparse.
"""
from __future__ import annotations

import math
from numbers import Number
from typing import Any

import numpy as np

from ..runtime import memory
from ..runtime.config import config
from ..ir.errors import DTypeError, MixedBackendError, ShapeError
from ..tensor import Tensor, spmm
# the dense ops (polygrad's package namespace rebinds the name "tensor" to the function, so import
# them by name rather than through the module)
from ..tensor import add as _dense_add, div as _dense_div, pow as _dense_pow
from .pattern import Pattern
from .layout import _events
from .construct import _coalesce, _scatter, intersect_pattern, union_pattern
from .sparse_tensor import SparseTensor, _dense_operand, _describe, _gather_dense, to_dense, transpose


# =====================================================================================================
# ops (tensor.py routes add/sub/mul/div/pow/sum/transpose/matmul here when an operand is sparse)
# =====================================================================================================

def _is_zero_number(x: Any) -> bool:
    return isinstance(x, Number) and not isinstance(x, bool) and x == 0



def _check_same_shape(op: str, a: SparseTensor, b: SparseTensor) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"op '{op}': {_describe(a)} and {_describe(b)}: shapes must match (sparse operands "
                         "do not broadcast)")
    if a._be is not b._be:
        raise MixedBackendError(f"op '{op}': {_describe(a)} and {_describe(b)} live on different backends "
                                f"({a.backend} and {b.backend}); move one explicitly with .to(name)")



def _densify(a: Any, op: str) -> Any:
    return to_dense(a, op) if isinstance(a, SparseTensor) else a


def add(a: Any, b: Any) -> Tensor:
    """sparse + sparse -> sparse (pattern union); sparse + dense/scalar -> dense (except + 0)."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        _check_same_shape("add", a, b)
        if a.pattern.same_as(b.pattern):
            return SparseTensor._wrap(a.pattern, a._values + b._values)
        pattern, pa, pb = union_pattern(a.pattern, b.pattern)
        return SparseTensor._wrap(pattern, _scatter(a._values, pa, pattern.nnz)
                                  + _scatter(b._values, pb, pattern.nnz))
    sp, other = (a, b) if isinstance(a, SparseTensor) else (b, a)
    if _is_zero_number(other):
        return sp
    other = _dense_operand(other, sp, "add")
    out_shape = tuple(np.broadcast_shapes(sp.shape, other.shape)) if _broadcastable(sp.shape, other.shape) \
        else None
    if out_shape is None:
        raise ShapeError(f"op 'add': {_describe(a)} + {_describe(b)}: shapes cannot be broadcast together")
    memory.check("add", memory.nbytes(out_shape, np.promote_types(sp.dtype, other.dtype)), backend=sp._be,
                 what=f"the dense {out_shape} result of adding a dense operand to {_describe(sp)}")
    dense = to_dense(sp, "add")
    return _dense_add(dense, other) if sp is a else _dense_add(other, dense)


def _broadcastable(s: tuple, t: tuple) -> bool:
    try:
        np.broadcast_shapes(s, t)
        return True
    except ValueError:
        return False


def sub(a: Any, b: Any) -> Tensor:
    """a - b = a + (-b) with the same layout rules as :func:`add`."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise DTypeError("sub: at least one operand must be a polygrad tensor")
    operand: Any = b if isinstance(b, (Tensor, Number)) else np.asarray(b)
    return add(a, -operand)


def mul(a: Any, b: Any) -> Tensor:
    """sparse * sparse -> intersection; sparse * dense/scalar -> sparse, pattern kept."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        _check_same_shape("mul", a, b)
        if a.pattern.same_as(b.pattern):
            return SparseTensor._wrap(a.pattern, a._values * b._values)
        pattern, ia, ib = intersect_pattern(a.pattern, b.pattern)
        return SparseTensor._wrap(pattern, a._values[ia] * b._values[ib])
    sp, other = (a, b) if isinstance(a, SparseTensor) else (b, a)
    if isinstance(other, Number) and not isinstance(other, bool):
        return SparseTensor._wrap(sp.pattern, sp._values * other)
    g = _gather_dense(sp, other, "mul")
    return SparseTensor._wrap(sp.pattern, sp._values * g if sp is a else g * sp._values)


def div(a: Any, b: Any) -> Tensor:
    """sparse / dense-or-scalar -> sparse (pattern kept); a division *by* a sparse matrix divides by
    its implicit zeros, so it is computed densely (inf/nan where IEEE says so)."""
    if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
        if isinstance(b, Number) and not isinstance(b, bool):
            return SparseTensor._wrap(a.pattern, a._values / b)
        return SparseTensor._wrap(a.pattern, a._values / _gather_dense(a, b, "div"))
    return _dense_div(_densify(a, "div"), _densify(b, "div"))


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001
    """sparse ** positive scalar -> sparse (0 ** p = 0); any other power is computed densely."""
    if isinstance(a, SparseTensor) and not isinstance(b, SparseTensor):
        exponent: Any = b
        if isinstance(b, Tensor) and b.numel == 1:
            exponent = b.item()
        elif not isinstance(b, Tensor) and np.ndim(b) == 0:
            exponent = float(np.asarray(b))
        # Number declares no ordering (a complex exponent raises TypeError here, as always)
        if isinstance(exponent, Number) and exponent > 0:  # type: ignore[operator]
            if isinstance(b, Tensor):
                return SparseTensor._wrap(a.pattern, a._values ** _dense_operand(b, a, "pow").reshape(()))
            return SparseTensor._wrap(a.pattern, a._values ** b)
    return _dense_pow(_densify(a, "pow"), _densify(b, "pow"))



def _check_output_memory(op: str, shape: tuple, dtype: Any, backend: Any, what: str) -> None:
    memory.check(op, memory.nbytes(shape, dtype), backend=backend, what=what)


#: cost of one partial product of the sparse @ sparse expansion (gathers, a product, the counting-sort
#: coalesce: ~10 passes over nnz-length arrays), in multiply-adds of the compiled SpMM over a dense
#: operand.  Measured on this project's 2-core machine, A = gcn_norm of a random graph, B a random
#: bag-of-words: 91 ns/product vs 0.28 ns/multiply-add (2,708 nodes, 1,433 words: ratio 329),
#: 62 vs 0.55 (20,000 / 500: 112), 67 vs 0.61 (100,000 / 64: 110); the low end is kept, so the
#: dense path is taken only where it wins by that much
SPGEMM_COST_PER_PRODUCT = 100.0


def matmul(a: Any, b: Any) -> Tensor:
    """sparse @ dense -> dense (SpMM); dense @ sparse -> dense (through Aᵀ); sparse @ sparse -> sparse,
    or dense when the cost model says densifying the right operand is cheaper (see _sparse_sparse)."""
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        return _sparse_sparse(a, b)
    if isinstance(a, SparseTensor):
        x = _dense_operand(b, a, "matmul")
        if x.ndim not in (1, 2) or x.shape[0] != a.shape[1]:
            raise ShapeError(f"op 'matmul': {_describe(a)} @ dense {x.shape}: the dense operand must be 1-D or "
                             f"2-D with {a.shape[1]} rows")
        out_shape = (a.shape[0],) + x.shape[1:]
        _check_output_memory("matmul", out_shape, np.promote_types(a.dtype, x.dtype), a._be,
                             f"the dense {out_shape} result of {_describe(a)} @ dense {x.shape}")
        return spmm(a._values, x, a.pattern)
    x = _dense_operand(a, b, "matmul")
    if x.ndim not in (1, 2) or x.shape[-1] != b.shape[0]:
        raise ShapeError(f"op 'matmul': dense {x.shape} @ {_describe(b)}: the dense operand must be 1-D or 2-D "
                         f"with {b.shape[0]} columns")
    out_shape = x.shape[:-1] + (b.shape[1],)
    _check_output_memory("matmul", out_shape, np.promote_types(b.dtype, x.dtype), b._be,
                         f"the dense {out_shape} result of dense {x.shape} @ {_describe(b)}")
    bt = transpose(b)  # X @ A = (Aᵀ @ Xᵀ)ᵀ
    if x.ndim == 1:
        return spmm(bt._values, x, bt.pattern)
    return spmm(bt._values, x.T, bt.pattern).T


def _sparse_sparse(a: SparseTensor, b: SparseTensor) -> Tensor:
    """``A @ B`` with both operands sparse, through the layout cost model.

    The sparse product forms every partial product ``a_ik * b_kj`` (``flops`` of them) and
    coalesces them; the alternative densifies B and runs the compiled SpMM (``nnz(A) * m``
    multiply-adds, plus B's ``k * m`` entries), giving a dense result.  The cheaper one is taken
    (the densified path only when B and the result fit the memory budget, and for results of at
    least ``pg.config.sparse_min_elements`` entries: smaller ones stay sparse), and the decision goes
    to the ``polygrad_layout_chosen`` hook, so ``pg.monitor`` reports it.  A sparse bag-of-words
    ``X`` under ``A @ X`` typically has products spread over most of the result: dense wins there.
    (Operations run eagerly, so ``(A @ X) @ W`` cannot be re-associated into ``A @ (X @ W)``;
    writing the latter is still the cheapest when W is narrow.)
    """
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"op 'matmul': {_describe(a)} @ {_describe(b)}: inner dimensions differ")
    if a._be is not b._be:
        raise MixedBackendError(f"op 'matmul': {_describe(a)} and {_describe(b)} live on different backends; "
                                "move one with .to(name)")
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    flops = int(np.diff(b.pattern.indptr)[a.pattern.cols].sum())
    sparse_cost = SPGEMM_COST_PER_PRODUCT * flops
    dense_cost = float(a.nnz) * m + float(k) * m
    dtype = np.promote_types(a.dtype, b.dtype)
    cells = n * m
    # expected distinct entries when the products land uniformly (a bound to report, not a count)
    expected_nnz = int(cells * -math.expm1(-flops / cells)) if cells else 0
    fits = memory.fits(memory.nbytes((k, m), dtype) + memory.nbytes((n, m), dtype), a._be)
    # below pg.config.sparse_min_elements the result stays sparse as documented: either path is cheap
    densify = dense_cost < sparse_cost and fits and cells >= config.sparse_min_elements
    hook = _events["polygrad_layout_chosen"]
    if hook is not None:
        why = (f"sparse @ sparse: {flops} partial products x {SPGEMM_COST_PER_PRODUCT:g} "
               f"{'>' if sparse_cost > dense_cost else '<='} {dense_cost:.4g} multiply-adds with the right operand "
               f"dense" + ("" if fits or dense_cost >= sparse_cost else " (dense does not fit the memory budget)"))
        hook(op="matmul", shape=(n, m), nnz=expected_nnz, density=expected_nnz / cells if cells else 0.0,
             layout="dense" if densify else a.layout, reason=why)
    if densify:
        return spmm(a._values, to_dense(b, "matmul"), a.pattern)
    return _spgemm(a, b)


def _spgemm(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """sparse @ sparse, kept sparse: every product a_ik * b_kj is formed once (O(flops) memory, checked
    against the budget) and summed into its (i, j) slot by a deterministic scatter."""
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"op 'matmul': {_describe(a)} @ {_describe(b)}: inner dimensions differ")
    if a._be is not b._be:
        raise MixedBackendError(f"op 'matmul': {_describe(a)} and {_describe(b)} live on different backends; "
                                "move one with .to(name)")
    pa, pb = a.pattern, b.pattern
    n, m = a.shape[0], b.shape[1]
    counts = np.diff(pb.indptr)[pa.cols]
    total = int(counts.sum())
    itemsize = np.promote_types(a.dtype, b.dtype).itemsize
    memory.check("matmul", total * (4 * 8 + 2 * itemsize), backend=a._be,
                 what=f"the {total} partial products of {_describe(a)} @ {_describe(b)}")
    ia = np.repeat(np.arange(pa.nnz, dtype=np.int64), counts)
    starts = np.repeat(pb.indptr[pa.cols] - (np.cumsum(counts) - counts), counts)
    ib = starts + np.arange(total, dtype=np.int64)
    rows, cols = pa.rows[ia], pb.cols[ib]
    products = a._values[ia] * b._values[ib]
    if total == 0:
        return SparseTensor._wrap(Pattern.from_sorted((n, m), rows, cols, a.layout), products)
    return _coalesce("matmul", (n, m), rows, cols, products, a.layout)

