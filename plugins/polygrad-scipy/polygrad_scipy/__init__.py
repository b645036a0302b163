"""polygrad-scipy: a memory-lean SpMM backward and a scipy backend for polygrad.

Installing this package (``pip install ./plugins/polygrad-scipy``) registers, through the entry
point ``scipy`` in the group ``polygrad``:

* **a fused SpMM backward for the numpy backend** (hook ``polygrad_kernels``, ``kind="vjp"``):
  ``dX = Aᵀ @ dY`` on scipy's CSC view of A's own arrays, and ``dA`` as an SDDMM at A's nonzeros,
  each only when needed.  polygrad's numpy backend already runs SpMM on scipy's compiled kernel;
  its backward goes through A's cached transpose (a CSC copy of the pattern plus a permutation:
  three more nnz-length index arrays per adjacency, and a gather of the values every step).
  This override trades that cache for a column-order product: no transpose is built, nothing
  is gathered, so the largest graphs fit in less memory.  Priority 10, above the numpy
  backend's own (0).
* a **backend named "scipy"** (hook ``polygrad_backends``): numpy arrays, the same scipy kernels,
  numpy everything else -- selectable with ``pg.set_backend("scipy")`` and checkable with
  ``polygrad check scipy``: the reference example of a third-party backend built on an existing
  library.
"""
from __future__ import annotations

import polygrad as pg

from . import kernels
from .backend import ScipyBackend

__version__ = "0.2.0"
#: priority of the override; the numpy backend's own kernels have 0, the highest priority wins
PRIORITY = 10


@pg.hookimpl
def polygrad_backends() -> list:
    return [ScipyBackend()]


@pg.hookimpl
def polygrad_kernels() -> list:
    # one key: polygrad keys sparse kernels once, "csr" and "coo" label one canonical storage
    return [pg.KernelOverride("numpy", "spmm", "csr", kernels.spmm_vjp, PRIORITY, kind="vjp")]


__all__ = ["PRIORITY", "ScipyBackend", "kernels", "polygrad_backends", "polygrad_kernels"]
