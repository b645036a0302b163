"""polygrad-scipy: scipy.sparse kernels for polygrad.

Installing this package (``pip install polygrad-scipy``) registers, through the entry point
``scipy`` in the group ``polygrad``:

* **kernel overrides for the numpy backend** (hook ``polygrad_kernels``): SpMM (``A @ X``, csr
  and coo) forward on scipy's compiled CSR product, and its fused backward (``dX = A.T @ dY``
  on scipy's CSC view, ``dA`` as an SDDMM at A's nonzeros).  They have priority 10, above the
  numpy backend's own kernels (priority 0), so every numpy-backend user gets them, with no code
  change.  SDDMM and the segment reductions stay numpy's: scipy has nothing faster for them.
* a **backend named "scipy"** (hook ``polygrad_backends``): numpy arrays, the same scipy SpMM,
  numpy everything else -- selectable with ``pg.set_backend("scipy")`` and checkable with
  ``polygrad check scipy``.
"""
from __future__ import annotations

import polygrad as pg

from . import kernels
from .backend import ScipyBackend

__version__ = "0.1.0"
#: priority of the overrides; the numpy backend's own kernels have 0, the highest priority wins
PRIORITY = 10


@pg.hookimpl
def polygrad_backends() -> list:
    return [ScipyBackend()]


@pg.hookimpl
def polygrad_kernels() -> list:
    out = []
    for layout in ("csr", "coo"):
        out.append(pg.KernelOverride("numpy", "spmm", layout, kernels.spmm, PRIORITY))
        out.append(pg.KernelOverride("numpy", "spmm", layout, kernels.spmm_vjp, PRIORITY, kind="vjp"))
    return out


__all__ = ["PRIORITY", "ScipyBackend", "kernels", "polygrad_backends", "polygrad_kernels"]
