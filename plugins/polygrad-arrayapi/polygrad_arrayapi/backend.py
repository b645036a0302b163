"""A polygrad backend over one Array API namespace (arrays on host memory, read through DLPack)."""
from __future__ import annotations

from typing import Any

import numpy as np

import polygrad as pg

from .kernels import NONSTANDARD, make_kernels

_NAMES = ("float64", "float32", "int64", "int32", "int16", "int8", "uint8", "bool")


class ArrayAPIBackend(pg.Backend):
    description = "an Array API namespace (polygrad-arrayapi)"
    dtypes = ("float64", "float32", "int64", "int32", "bool")

    def __init__(self, name: str, xp: Any) -> None:
        super().__init__()
        self.name = name
        self.xp = xp
        self.description = f"the Array API namespace {xp.__name__} (polygrad-arrayapi)"
        self._to_xp = {np.dtype(n): getattr(xp, n) for n in _NAMES if hasattr(xp, n)}
        self._array_type = type(xp.asarray(np.zeros(1)))
        #: ops not written with standard functions, and how they are supplied
        self.nonstandard = {op.value: how for op, how in NONSTANDARD.items()}
        self.kernels = make_kernels(xp, self.to_numpy, self.from_numpy, self._to_xp.__getitem__)

    def from_numpy(self, array: np.ndarray) -> Any:
        return self.xp.asarray(np.array(array, order="C"), dtype=self._to_xp[array.dtype])

    def to_numpy(self, array: Any) -> np.ndarray:
        if isinstance(array, np.generic):   # numpy (through array_api_compat) returns 0-d results as scalars
            return np.asarray(array)
        return np.from_dlpack(array)

    def owns(self, array: Any) -> bool:
        return isinstance(array, self._array_type)

    def dtype(self, array: Any) -> np.dtype:
        return np.dtype(str(array.dtype).rpartition(".")[2])   # "array_api_strict.float64" -> float64
