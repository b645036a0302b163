"""polygrad-scipy: a backend named "scipy", built on scipy.sparse, as a third-party plugin.

Installing this package (``pip install ./plugins/polygrad-scipy``) registers, through the entry
point ``scipy`` in the group ``polygrad``, a **backend named "scipy"** (hook ``polygrad_backends``):
numpy arrays, numpy for every dense op, and sparse kernels of its own (SpMM and its fused
backward on scipy's compiled CSR/CSC routines over int32 indices cached per pattern, SDDMM in
bounded chunks, segment sums by ``reduceat``).  Selectable with ``pg.set_backend("scipy")`` and
checkable with ``polygrad check scipy``: a complete backend written only against polygrad's public
plugin contract, and an independent implementation of the sparse ops that the cross-backend
gradient tests compare the numpy backend against.

Version 0.2 of this plugin also overrode the numpy backend's SpMM with int32-index kernels (hook
``polygrad_kernels``); the numpy backend now does that itself, so the override is gone.
"""
from __future__ import annotations

import polygrad as pg

from . import kernels
from .backend import ScipyBackend

__version__ = "0.3.0"


@pg.hookimpl
def polygrad_backends() -> list:
    return [ScipyBackend()]


__all__ = ["ScipyBackend", "kernels", "polygrad_backends"]
