"""The NumPy backend: vectorised CPU kernels from the shared array-namespace module."""
from __future__ import annotations

import numpy as np

import polygrad as pg
from polygrad.backend import HOST_DLPACK_DEVICES

from .array_kernels import make_kernels


class NumpyBackend(pg.Backend):
    name = "numpy"
    description = "vectorised CPU kernels on numpy arrays"
    default_priority = 10  # the default backend unless the user picks another
    dlpack_devices = HOST_DLPACK_DEVICES

    def __init__(self) -> None:
        super().__init__()
        self.kernels = make_kernels(np)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_numpy(self, array) -> np.ndarray:
        return np.asarray(array)

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def shape(self, array) -> tuple[int, ...]:
        return array.shape

    def dtype(self, array) -> np.dtype:
        return array.dtype


@pg.hookimpl
def polygrad_backends():
    return [NumpyBackend()]
