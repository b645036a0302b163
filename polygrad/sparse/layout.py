"""The layout policy: dense or sparse, by density, size, feature width and memory (the ONE place it lives).

:func:`choose_layout` decides; :func:`break_even_density` is the cost model behind it.  Every
decision is reported through the ``polygrad_layout_chosen`` event hook when a plugin listens.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..runtime import memory
from ..runtime.config import config
from ..ir.dtypes import default_float
from ..ir.ops import Op
from ..runtime.registry import registry

LAYOUTS = ("csr", "coo")
_events = registry.events


# =====================================================================================================
# the layout policy (the ONE place it lives)
# =====================================================================================================

#: Cost-model constants: sparse beats dense matmul below the density ``break_even_density(F)``
#: = BREAK_EVEN_F16 * (F / 16) ** -BREAK_EVEN_EXPONENT (clipped to [BREAK_EVEN_MIN, BREAK_EVEN_MAX]).
#: Calibrated by ``python -m benchmarks sparse`` section (b) on this machine (2 shared cores, numpy
#: 2.4, OpenBLAS): A @ X forward + backward w.r.t. X, polygrad sparse (the numpy backend's own
#: kernels) vs polygrad dense (BLAS), 2708 x 2708 float32 with uniform random patterns, densities
#: 0.5%..40%; the break-even is where the time ratio crosses 1 (log-linear interpolation).  Three
#: runs gave 4.1% / 2.1% / 4.1% at F=16 and 2.9% / 2.5% / 2.3% at F=1433; the constants are their
#: means.  The pure-numpy SpMM's per-nonzero overhead is largest at small F, so its break-even
#: barely moves with F.  With faster SpMM kernels (the polygrad-scipy plugin) sparse wins up to
#: 17-32% at F=16 and 6-8% at F=1433 (same runs): these constants are then conservative (sparse is
#: never chosen where it would lose; some wins are left); ``pg.config.sparse_threshold`` overrides.
BREAK_EVEN_F16 = 0.034
BREAK_EVEN_F1433 = 0.0255
BREAK_EVEN_EXPONENT = math.log(BREAK_EVEN_F16 / BREAK_EVEN_F1433) / math.log(1433 / 16)
BREAK_EVEN_MIN = 0.002
BREAK_EVEN_MAX = 0.5
#: feature width assumed when a layout is chosen with no matmul in sight (``pg.tensor(layout="auto")``)
DEFAULT_FEATURE_WIDTH = 64


#: attribute a backend's (or a plugin's) forward SpMM kernel may carry to declare its own measured
#: break-even densities ``(at F=16, at F=1433)`` when it is faster or slower than the numpy kernels
#: these constants describe (e.g. a scipy.sparse SpMM); polygrad then uses them for that backend
BREAK_EVEN_ATTRIBUTE = "polygrad_break_even"


def _declared_break_even(backend: Any) -> tuple[float, float] | None:
    if backend is None:
        return None
    name = backend if isinstance(backend, str) else getattr(backend, "name", None)
    kernel = registry.tables.get(name, {}).get((Op.SPMM, "csr")) if name else None
    declared = getattr(kernel, BREAK_EVEN_ATTRIBUTE, None)
    if declared is None:
        return None
    try:
        d16, d1433 = (float(v) for v in declared)
    except (TypeError, ValueError):
        return None  # a malformed declaration is ignored, never fatal
    return (d16, d1433) if 0 < d16 <= 1 and 0 < d1433 <= 1 else None


def break_even_density(feature_width: int | None = None, backend: Any = None) -> float:
    """Density below which SpMM with ``feature_width`` columns beats a dense matmul (cost model).

    ``backend``: when its SpMM kernel declares its own break-evens (``BREAK_EVEN_ATTRIBUTE``),
    those are used instead of the numpy kernels' calibration.
    """
    f = max(1, int(feature_width or DEFAULT_FEATURE_WIDTH))
    declared = _declared_break_even(backend)
    d16, d1433 = declared if declared is not None else (BREAK_EVEN_F16, BREAK_EVEN_F1433)
    d = d16 * (f / 16) ** -(math.log(d16 / d1433) / math.log(1433 / 16))
    return min(BREAK_EVEN_MAX, max(BREAK_EVEN_MIN, d))


def _threshold(feature_width: int | None, backend: Any = None) -> tuple[float, str]:
    """(density limit, where it comes from) -- the user's threshold, else the cost model."""
    if config.sparse_threshold is not None:
        return config.sparse_threshold, "pg.config.sparse_threshold"
    f = int(feature_width or DEFAULT_FEATURE_WIDTH)
    return break_even_density(f, backend), "cost-model break-even at F=%d" % f


def choose_layout(shape: Sequence[int], nnz: int | Callable[[], int], *, op: str = "tensor",
                  feature_width: int | None = None, dtype: Any = None, backend: Any = None,
                  dense_grad: bool = False, layout: str = "csr",
                  sampled_density: float | None = None, dense_exists: bool = False) -> str:
    """``"dense"`` or ``layout`` (a sparse label) for a matrix of ``shape`` with ``nnz`` nonzeros.

    The rules, in order:

    1. ``dense_grad``: the caller needs a gradient at every entry (a dense leaf) -> dense;
    2. not 2-D, or fewer than ``pg.config.sparse_min_elements`` elements -> dense (bookkeeping
       costs more than it saves);
    3. the dense form would not fit the memory budget (``pg.config.memory_fraction``) -> sparse
       (skipped with ``dense_exists``: a dense operand already in memory costs nothing more);
    4. density below ``pg.config.sparse_threshold`` when it is set, else below
       :func:`break_even_density` for the feature width ``F`` of the matmul (and the backend's
       SpMM kernel, when it declares its own break-evens) -> sparse;
    5. otherwise dense.

    ``nnz`` may be a callable, evaluated only when a rule needs it (counting is O(n*m)); with a
    ``sampled_density`` (from a scattered sample) far above the threshold, rule 4 answers dense
    without counting.  Every decision is reported through the ``polygrad_layout_chosen`` event hook
    (when a plugin implements it) with the nnz (-1 when not counted), density, layout and reason.
    """
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    count: int | None = None if callable(nnz) else int(nnz)

    def nnz_now() -> int:
        nonlocal count
        if count is None:
            count = int(nnz())  # type: ignore[operator]
        return count

    itemsize = np.dtype(dtype).itemsize if dtype is not None else np.dtype(default_float).itemsize
    # reasons are formatted only when a plugin listens (this runs before large dense matmuls)
    if dense_grad:
        chosen, why = "dense", lambda: "a dense leaf requiring grad needs a gradient at every entry"
    elif len(shape) != 2:
        chosen, why = "dense", lambda: f"{len(shape)}-D: sparse layouts are 2-D"
    elif numel < config.sparse_min_elements:
        chosen, why = "dense", lambda: (f"{numel} elements < pg.config.sparse_min_elements="
                                        f"{config.sparse_min_elements}")
    elif not dense_exists and not memory.fits(numel * itemsize, backend):
        chosen, why = layout, lambda: (f"the dense form needs {memory.format_bytes(numel * itemsize)}, over "
                                       f"the memory budget (pg.config.memory_fraction={config.memory_fraction})")
    else:
        limit, source = _threshold(feature_width, backend)
        if count is None and sampled_density is not None and sampled_density > 2 * limit + 0.05:
            chosen, why = "dense", lambda: f"sampled density ~{sampled_density:.3g} >> {limit:.4g} ({source})"
        else:
            density = nnz_now() / numel
            if density < limit:
                chosen, why = layout, lambda: f"density {density:.4g} < {limit:.4g} ({source})"
            else:
                chosen, why = "dense", lambda: f"density {density:.4g} >= {limit:.4g} ({source})"
    hook = _events["polygrad_layout_chosen"]
    if hook is not None:
        if count is None and numel < max(config.sparse_min_elements, 1):
            nnz_now()  # tiny: counting is cheap and makes the report complete
        if count is not None:
            reported = count / numel if numel else 0.0
        else:
            reported = sampled_density if sampled_density is not None else float("nan")
        hook(op=op, shape=shape, nnz=-1 if count is None else count, density=reported, layout=chosen,
             reason=why())
    return chosen



def _check_layout(op: str, layout: str, allow_auto: bool = True) -> None:
    allowed = LAYOUTS + (("auto",) if allow_auto else ())
    if layout not in allowed:
        raise ValueError(f"{op}: layout must be one of {', '.join(map(repr, allowed))}, got {layout!r}")

