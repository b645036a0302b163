"""polygrad-arrayapi: one polygrad backend per installed Array API namespace.

``array_api`` + the namespace's name: ``array_api_strict`` (the reference implementation, if
installed) and, through ``array_api_compat``, ``array_api_numpy`` (and ``array_api_torch`` /
``array_api_jax`` when those libraries are installed).  Kernels use only standard functions except
the ops listed in :data:`polygrad_arrayapi.kernels.NONSTANDARD` (no scatter-add or segment
reduction in the standard), which each backend declares in ``Backend.nonstandard``.  Deferred: the
libraries are imported when one of these backends is first used.
"""
from __future__ import annotations

import importlib
import importlib.util

import polygrad as pg

from .backend import ArrayAPIBackend

__version__ = "0.1.0"
__all__ = ["ArrayAPIBackend", "NAMESPACES"]

#: backend name -> (module to import, its array namespace) ; host-memory libraries only
NAMESPACES = {
    "array_api_strict": ("array_api_strict", "array_api_strict"),
    "array_api_numpy": ("numpy", "array_api_compat.numpy"),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pg.hookimpl
def polygrad_backends():
    out = []
    for name, (library, namespace) in NAMESPACES.items():
        if _installed(library) and _installed(namespace.partition(".")[0]):
            out.append(ArrayAPIBackend(name, importlib.import_module(namespace)))
    return out
