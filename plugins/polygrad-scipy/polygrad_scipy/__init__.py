"""polygrad-scipy: int32-index scipy SpMM kernels (faster, a little more memory) and a scipy backend.

Installing this package (``pip install ./plugins/polygrad-scipy``) registers, through the entry
point ``scipy`` in the group ``polygrad``:

* **SpMM overrides for the numpy backend** (hook ``polygrad_kernels``): the forward ``A @ X`` and
  the fused backward (``dX = Aᵀ @ dY`` on scipy's CSC view, ``dA`` as an SDDMM at A's nonzeros).
  polygrad's numpy backend already runs both on scipy's compiled kernels, on the pattern's own
  int64 indices; these overrides run them on an int32 copy of the indices, converted once per
  pattern and cached on it: about 20% faster SpMM (measured at 1M nodes / 11M nonzeros, F=64:
  1.49 s against 1.88 s) for 4 more bytes per nonzero (and per row).  A speed-for-memory trade
  a user opts into by installing the plugin.  Priority 10, above the numpy backend's own (0);
  patterns too large for int32 use int64 (scipy's own choice).
* a **backend named "scipy"** (hook ``polygrad_backends``): numpy arrays, the same scipy kernels,
  numpy everything else -- selectable with ``pg.set_backend("scipy")`` and checkable with
  ``polygrad check scipy``: a complete third-party backend built on an existing library.
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
    # one key each: polygrad keys sparse kernels once, "csr" and "coo" label one canonical storage
    return [pg.KernelOverride("numpy", "spmm", "csr", kernels.spmm, PRIORITY),
            pg.KernelOverride("numpy", "spmm", "csr", kernels.spmm_vjp, PRIORITY, kind="vjp")]


__all__ = ["PRIORITY", "ScipyBackend", "kernels", "polygrad_backends", "polygrad_kernels"]
