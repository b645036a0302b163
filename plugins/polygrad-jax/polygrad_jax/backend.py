"""The ``jax`` backend: arrays are ``jax.Array``, kernels from :mod:`polygrad_jax.kernels`."""
from __future__ import annotations

import math
import os
from typing import Any

import jax
import numpy as np

import polygrad as pg
from polygrad.runtime.backend import KDLCPU

from .kernels import make_kernels

X64 = os.environ.get("POLYGRAD_JAX_X64", "1") != "0"
if X64:
    jax.config.update("jax_enable_x64", True)


class JaxBackend(pg.Backend):
    name = "jax"
    description = "JAX arrays; pg.compile steps become one jax.jit (polygrad-jax)"
    install_hint = "pip install jax"
    immutable = True
    dlpack_devices = (KDLCPU,)
    dtypes = None if X64 else ("float32", "int32", "bool")   # None: every dtype polygrad supports

    def __init__(self) -> None:
        super().__init__()
        self.kernels = make_kernels()

    def from_numpy(self, array: np.ndarray) -> Any:
        return jax.numpy.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def owns(self, array: Any) -> bool:
        return isinstance(array, jax.Array)

    def shape(self, array: Any) -> tuple[int, ...]:
        return tuple(array.shape)

    def dtype(self, array: Any) -> np.dtype:
        return np.dtype(array.dtype)

    def from_dlpack(self, obj: Any) -> Any:
        return jax.numpy.asarray(np.from_dlpack(obj))

    def random_mask(self, k0: Any, k1: Any, *, shape: tuple, dtype: Any, drop_below: int, scale: float) -> Any:
        """Dropout's mask from JAX's counter-based generator (threefry) keyed by ``(k0, k1)``: the
        same bits eagerly and under ``jax.jit``, so a compiled step draws what its eager run does."""
        jnp = jax.numpy
        key = jax.random.wrap_key_data(jnp.stack([jnp.asarray(k0), jnp.asarray(k1)]).astype(jnp.uint32))
        bits = draw_uint16(key, shape)
        return jnp.where(bits >= drop_below, jnp.asarray(scale, dtype), jnp.zeros((), dtype))


def draw_uint16(key: Any, shape: tuple) -> Any:
    """16-bit random draws of ``shape`` from ``key``, four per threefry evaluation (two without
    64-bit mode): ``jax.random.bits(key, shape, uint16)`` evaluates threefry once per draw and
    keeps 16 of its 64 bits, which made the dropout masks about a third of a compiled Cora GCN
    step on a CPU.  The draws are 16-bit slices of full-width threefry words, so as uniform and
    independent as JAX's own."""
    jnp = jax.numpy
    word = jnp.uint64 if X64 else jnp.uint32
    n = math.prod(shape)
    words = jax.random.bits(key, (-(-n // (jnp.dtype(word).itemsize // 2)),), word)
    return jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:n].reshape(shape)
