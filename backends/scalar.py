"""The scalar backend: pure Python, float64, element by element -- the reference.

Its kernels *are* polygrad's scalar reference (``polygrad.engine.reference``) run on plain Python
numbers, so this backend, the fallback path and the conformance oracle share one definition per
op.  It is slow by design and exists to be obviously right.
"""
from __future__ import annotations

import numpy as np

import polygrad as pg
from polygrad.engine import reference
from polygrad.engine.inference import infer
from polygrad.ir.ops import Op


class ScalarArray:
    """A row-major list of Python numbers with a shape and a dtype label (math is float64)."""

    __slots__ = ("items", "shape", "dtype")

    def __init__(self, items: list, shape: tuple, dtype: np.dtype):
        self.items, self.shape, self.dtype = items, tuple(shape), np.dtype(dtype)

    def __repr__(self) -> str:
        return f"ScalarArray(shape={self.shape}, dtype={self.dtype})"


def _coerce(items: list, dtype: np.dtype) -> list:
    if dtype.kind == "f":
        return [float(x) for x in items]
    if dtype.kind == "b":
        return [bool(x) for x in items]
    return _wrap_ints([int(x) for x in items], dtype)


def _wrap_ints(items: list, dtype: np.dtype) -> list:
    """Python ints reduced to ``dtype``'s range modulo 2**bits: integer overflow wraps exactly as
    numpy's (two's complement), so both backends give the same int8/int64/uint8 answers."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    span = hi - lo + 1
    return [x if lo <= x <= hi else (x - lo) % span + lo for x in items]


def _kernel(op: Op):
    def run(*arrays: ScalarArray, **attrs) -> ScalarArray:
        shapes = tuple(a.shape for a in arrays)
        _, dtype = infer(op, shapes, tuple(a.dtype for a in arrays), attrs)
        items, shape = reference.run(op, [(a.items, a.shape) for a in arrays], attrs)
        return ScalarArray(_coerce(items, dtype), shape, dtype)
    run.__name__ = f"scalar_{op.value}"
    return run


class ScalarBackend(pg.Backend):
    name = "scalar"
    description = "pure-Python float64 reference (slow, obviously right)"

    def __init__(self) -> None:
        super().__init__()
        dense = {(op, "dense"): _kernel(op) for op in Op if op not in (Op.SPMM, Op.SDDMM,
                                                                       Op.SEGMENT_SUM, Op.SEGMENT_MAX)}
        # keyed once: "csr" and "coo" label one canonical storage (polygrad.ir.ops.kernel_key)
        sparse = {(op, "csr"): _kernel(op) for op in (Op.SPMM, Op.SDDMM, Op.SEGMENT_SUM, Op.SEGMENT_MAX)}
        self.kernels = {**dense, **sparse}

    def from_numpy(self, array: np.ndarray) -> ScalarArray:
        array = np.asarray(array)
        return ScalarArray(array.ravel().tolist(), array.shape, array.dtype)

    def to_numpy(self, array: ScalarArray) -> np.ndarray:
        return np.array(array.items, dtype=array.dtype).reshape(array.shape)

    def owns(self, array) -> bool:
        return isinstance(array, ScalarArray)

    def shape(self, array: ScalarArray) -> tuple[int, ...]:
        return array.shape

    def dtype(self, array: ScalarArray) -> np.dtype:
        return array.dtype


@pg.hookimpl
def polygrad_backends():
    return [ScalarBackend()]
