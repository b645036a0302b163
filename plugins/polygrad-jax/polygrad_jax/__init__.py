"""polygrad-jax: a polygrad backend on ``jax.Array``, with whole steps compiled by ``jax.jit``.

Installing this package registers, through the entry point ``jax`` in the group ``polygrad``, a
**backend named "jax"**.  The plugin is *deferred* (entry-point group ``polygrad.backends``):
polygrad imports it, and JAX, only the first time the backend is used, so installing it costs a
numpy-only process nothing.

* every primitive op as a JAX kernel (``kernels.py``), sparse ops as gathers and sorted segment
  sums (each row summed on its own: an ``inf`` stays in its row);
* ``immutable = True``: ``pg.tensor(jax_array)`` keeps the array (no host round trip) and
  ``fit()``'s snapshots share arrays;
* the ``polygrad_compile_kernels`` hook: a ``pg.compile(step, pure=True)`` step's kernels --
  forward, backward and fused backward kernels -- become one ``jax.jit`` function
  (``compile.py``); the optimizer's update runs as JAX ops on device.

JAX computes in float32 unless its process-wide 64-bit mode is on; polygrad's float64 API needs
it, so the backend turns ``jax_enable_x64`` on when it loads (set ``POLYGRAD_JAX_X64=0`` to keep
JAX's default: the backend then declares ``float32``/``int32``/``bool`` only).
"""
from __future__ import annotations

import polygrad as pg

from .backend import JaxBackend
from .compile import compile_kernels

__version__ = "0.1.0"
__all__ = ["JaxBackend", "compile_kernels"]

_BACKEND = JaxBackend()


@pg.hookimpl
def polygrad_backends():
    return [_BACKEND]


@pg.hookimpl
def polygrad_compile_kernels(program, backend):
    if backend is not _BACKEND:
        return None
    return compile_kernels(program, _BACKEND)
