"""Kernels written against the Array API standard (``xp``), plus the few the standard has no
function for, supplied per library (:data:`NONSTANDARD`).

Standard: every elementwise op, reductions, reshape/permute/broadcast, concat, matmul, casts, and
SDDMM (``take`` then a row-wise sum).  Not in the standard: a scatter-add (``index_add``, the
segment reductions that SpMM ends with) and numpy-style advanced indexing (``getitem`` with index
arrays).  For libraries on host memory these go through DLPack to numpy and back (no copy where
the library allows it); each backend lists them in ``Backend.nonstandard``.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad.ir.ops import BINARY, COMPARE, Op
from polygrad.runtime.backend import elementwise_kernels

#: ops whose kernels are not written with standard functions, and how they are supplied
NONSTANDARD = {
    Op.INDEX_ADD: "no scatter-add in the standard: numpy's add.at / bincount through DLPack",
    Op.GETITEM: "integer-array (advanced) indexing: numpy through DLPack when the index holds arrays",
    Op.SPMM: "gather with take (standard), row sums with numpy's add.reduceat through DLPack",
    Op.SEGMENT_SUM: "no segment reduction in the standard: numpy's add.reduceat through DLPack",
    Op.SEGMENT_MAX: "no segment reduction in the standard: numpy's maximum.reduceat through DLPack",
}


def make_kernels(xp: Any, to_numpy: Callable[[Any], np.ndarray], from_numpy: Callable[[np.ndarray], Any],
                 dtype_of: Callable[[Any], Any]) -> dict[tuple[Op, str], Callable]:
    """The kernel table for namespace ``xp``; ``dtype_of(numpy dtype) -> xp dtype``."""

    def np_dtype(x) -> np.dtype:
        return np.dtype(str(x.dtype).rpartition(".")[2])

    def promoting(fn: Callable, first: int = 0) -> Callable:
        """``fn`` on operands brought to numpy's common dtype: polygrad hands kernels mixed dtypes
        where numpy's result type is polygrad's (int with float), which the standard refuses."""
        def kernel(*arrays, **attrs):
            head, rest = arrays[:first], arrays[first:]
            dtypes = {np_dtype(a) for a in rest}
            if len(dtypes) > 1:
                common = dtype_of(np.result_type(*dtypes))
                rest = tuple(a if a.dtype == common else xp.astype(a, common) for a in rest)
            return fn(*head, *rest, **attrs)
        return kernel

    def relu(x):
        return xp.maximum(x, xp.zeros_like(x))

    def reciprocal(x):
        return xp.divide(xp.ones_like(x), x)

    def cast(x, *, dtype):
        return xp.astype(x, dtype_of(np.dtype(dtype)))

    def reduce_sum(x, *, axes, keepdims):
        kind = np_dtype(x).kind
        if not axes and kind == "f":
            return x
        if kind == "b":  # the standard sums numbers only; polygrad counts bools as int64
            x = xp.astype(x, dtype_of(np.dtype("int64")))
        return xp.sum(x, axis=tuple(axes), keepdims=keepdims)

    def reduce_max(x, *, axes, keepdims):
        return xp.max(x, axis=tuple(axes), keepdims=keepdims) if axes else x

    def reshape(x, *, shape):
        return xp.reshape(x, tuple(shape))

    def permute(x, *, perm):
        return xp.permute_dims(x, tuple(perm))

    def expand(x, *, shape):
        return xp.broadcast_to(x, tuple(shape))

    def concat(*arrays, axis):
        return xp.concat(arrays, axis=axis)

    # -- supplied through numpy (not in the standard) -------------------------------------------
    def getitem(x, *, index):
        if not any(isinstance(i, np.ndarray) for i in index):
            # the standard wants every axis named: a trailing ellipsis covers the rest
            return x[index if any(i is Ellipsis for i in index) else index + (Ellipsis,)]
        return from_numpy(np.array(to_numpy(x)[index], order="C"))

    def index_add(src, *, index, shape):
        s = to_numpy(src)
        out = np.zeros(shape, dtype=s.dtype)
        np.add.at(out, index, s)
        return from_numpy(out)

    def _segment(values: np.ndarray, pattern: Any, ufunc: Any) -> np.ndarray:
        n = pattern.shape[0]
        out = np.zeros((n,) + values.shape[1:], dtype=values.dtype)
        starts = pattern.indptr[:-1]
        nonempty = starts < pattern.indptr[1:]
        if values.shape[0]:
            out[nonempty] = ufunc.reduceat(values, starts[nonempty], axis=0)
        return out

    def segment_sum(values, *, pattern):
        return from_numpy(_segment(to_numpy(values), pattern, np.add))

    def segment_max(values, *, pattern):
        return from_numpy(_segment(to_numpy(values), pattern, np.maximum))

    def _cols(pattern):
        return pattern.on(("arrayapi", xp.__name__), lambda a: from_numpy(np.asarray(a)))

    def spmm(values, x, *, pattern):
        _, rows, cols = _cols(pattern)
        x2 = xp.reshape(x, (-1, 1)) if x.ndim == 1 else x
        contrib = xp.take(x2, cols, axis=0) * xp.reshape(values, (-1, 1))
        out = from_numpy(_segment(to_numpy(contrib), pattern, np.add))
        return xp.reshape(out, (-1,)) if x.ndim == 1 else out

    def sddmm(p, q, *, pattern):
        _, rows, cols = _cols(pattern)
        prod = xp.take(p, rows, axis=0) * xp.take(q, cols, axis=0)
        return xp.sum(prod, axis=1, dtype=prod.dtype)

    # the standard does not promote across array kinds the way polygrad's scalar operands need:
    # every operand of an op with several goes through promoting()
    shared = elementwise_kernels(xp)
    dense: dict[Op, Callable] = {
        **{op: promoting(fn) if op in BINARY | COMPARE else fn for op, fn in shared.items()},
        Op.RELU: relu, Op.RECIPROCAL: reciprocal, Op.CAST: cast, Op.WHERE: promoting(xp.where, first=1),
        Op.SUM: reduce_sum, Op.MAX: reduce_max,
        Op.RESHAPE: reshape, Op.PERMUTE: permute, Op.EXPAND: expand, Op.GETITEM: getitem,
        Op.INDEX_ADD: index_add, Op.CONCAT: promoting(concat), Op.MATMUL: promoting(xp.matmul),
    }
    table = {(op, "dense"): fn for op, fn in dense.items()}
    table[(Op.SPMM, "csr")] = spmm
    table[(Op.SDDMM, "csr")] = sddmm
    table[(Op.SEGMENT_SUM, "csr")] = segment_sum
    table[(Op.SEGMENT_MAX, "csr")] = segment_max
    return table
