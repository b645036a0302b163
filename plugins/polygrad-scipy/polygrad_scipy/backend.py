"""The ``scipy`` backend: numpy arrays, dense ops on numpy, sparse ops on scipy.sparse.

A complete backend in one small module, written only against polygrad's public plugin API
(``polygrad.Backend`` and the ``polygrad.ir.ops.Op`` names).  Kernel signatures follow the
convention in ``polygrad.runtime.backend``: ``kernel(*arrays, **attrs) -> array``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import polygrad as pg
from polygrad.ir.ops import Op
from polygrad.runtime.backend import elementwise_kernels

from . import kernels


def _reduce(fn):
    def run(x: np.ndarray, *, axes: tuple, keepdims: bool) -> np.ndarray:
        return np.asarray(fn(x, axis=axes, keepdims=keepdims))
    return run


def _index_add(src: np.ndarray, *, index: tuple, shape: tuple) -> np.ndarray:
    out = np.zeros(shape, dtype=src.dtype)
    np.add.at(out, index, src)  # unbuffered: repeated indices accumulate
    return out


DENSE: dict[Op, Any] = {
    **elementwise_kernels(np),  # neg, exp, log, tanh, add, mul, pow, maximum, the comparisons, where, ...
    Op.RELU: lambda x: np.maximum(x, x.dtype.type(0)),
    Op.CAST: lambda x, *, dtype: x.astype(dtype),
    Op.SUM: _reduce(np.sum), Op.MAX: _reduce(np.max),
    Op.RESHAPE: lambda x, *, shape: np.reshape(x, shape),
    Op.PERMUTE: lambda x, *, perm: np.transpose(x, perm),
    Op.EXPAND: lambda x, *, shape: np.broadcast_to(x, shape),
    Op.GETITEM: lambda x, *, index: x[index],
    Op.INDEX_ADD: _index_add,
    Op.CONCAT: lambda *xs, axis: np.concatenate(xs, axis=axis),
    Op.MATMUL: np.matmul,
}

SPARSE: dict[Op, Any] = {
    Op.SPMM: kernels.spmm, Op.SDDMM: kernels.sddmm,
    Op.SEGMENT_SUM: kernels.segment_sum, Op.SEGMENT_MAX: kernels.segment_max,
}


class ScipyBackend(pg.Backend):
    name = "scipy"
    description = "numpy arrays; sparse ops on scipy.sparse (polygrad-scipy)"
    install_hint = "pip install polygrad-scipy"

    def __init__(self) -> None:
        super().__init__()
        self.kernels = {(op, "dense"): fn for op, fn in DENSE.items()}
        # keyed once: "csr" and "coo" label polygrad's one canonical CSR storage
        self.kernels.update({(op, "csr"): fn for op, fn in SPARSE.items()})
        self.vjp_kernels[(Op.SPMM, "csr")] = kernels.spmm_vjp

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_numpy(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def owns(self, array: Any) -> bool:
        return isinstance(array, np.ndarray)
