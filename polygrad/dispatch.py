"""Dispatch: run one primitive op on its backend, check the result, fall back when a kernel fails.

``apply(op, inputs, attrs, layout)`` is the single path every primitive takes:

1. all inputs must live on one backend (else MixedBackendError naming both);
2. the op's inference validates the operands and predicts the output shape/dtype (user errors
   are raised here, before any kernel runs, and are never "fallen back" from);
3. the backend's kernel for ``(op, layout)`` runs -- a dict lookup in the table the registry
   built at load time;
4. its output is checked against the inference; an exception or a contradicting output is a
   kernel fault, handled by the fallback policy: the backend's fallback chain (e.g. cupy ->
   numpy), then scalar decomposition over :class:`polygrad.Value`, whose ``backward`` later
   supplies the gradient so no rule or kernel of the failing backend is trusted;
5. when grad mode is on and an input requires grad, a Node is recorded.
"""
from __future__ import annotations

import threading
import warnings
from collections import Counter
from contextvars import ContextVar
from typing import Any

import numpy as np

from . import reference
from .config import config
from .errors import BackendError, FallbackWarning, MixedBackendError, PolygradError
from .graph import Node
from .inference import infer
from .ops import NON_DIFFERENTIABLE, SPARSE, Op
from .registry import registry

_grad_enabled: ContextVar[bool] = ContextVar("polygrad_grad_enabled", default=True)
_events = registry.events
EMPTY: dict = {}
_make_tensor: Any = None  # Tensor._make, bound by polygrad.tensor (which imports this module)

# -- statistics (pg.stats()) ------------------------------------------------------------------------
_stats_lock = threading.Lock()
fallback_counts: Counter = Counter()      # (op, backend, layout) -> times
_warned: set = set()


def stats() -> dict:
    """Counters since start (or ``pg.reset_stats()``): fallbacks per (op, backend, layout)."""
    with _stats_lock:
        return {"fallbacks": {f"{op}/{be}/{layout}": n for (op, be, layout), n in fallback_counts.items()},
                "fallbacks_total": sum(fallback_counts.values())}


def reset_stats() -> None:
    with _stats_lock:
        fallback_counts.clear()
        _warned.clear()


def is_grad_enabled() -> bool:
    return _grad_enabled.get()


class KernelFault(Exception):
    """A kernel's output contradicts the op's inference (internal: triggers the fallback)."""


def _mixed(op: Op, inputs: tuple) -> MixedBackendError:
    names = sorted({t._be.name for t in inputs})
    desc = ", ".join(f"{t.shape}@{t._be.name}" for t in inputs)
    return MixedBackendError(f"op '{op}' got operands on different backends ({' and '.join(names)}): "
                             f"{desc}; move one explicitly with t.to(name)")


def _kernel(be, op: Op, layout: str):
    table = registry.tables.get(be.name, EMPTY)
    kernel = table.get((op, layout))
    if kernel is None and layout == "coo":
        kernel = table.get((op, "csr"))  # both layouts share the canonical storage
    return kernel


def run_kernel(be, op: Op, layout: str, arrays: list, attrs: dict, shape: tuple, dtype) -> Any:
    """Run the backend's kernel and check its output; KernelFault / the kernel's error on failure."""
    kernel = _kernel(be, op, layout)
    if kernel is None:
        raise NotImplementedError(f"backend {be.name!r} provides no kernel for op '{op}' (layout {layout})")
    out = kernel(*arrays, **attrs)
    out_shape = be.shape(out)
    if out_shape != shape or be.dtype(out) != dtype:
        raise KernelFault(f"kernel for op '{op}' on backend {be.name!r} ({layout}) returned "
                          f"shape {out_shape} dtype {be.dtype(out)}, expected {shape} {dtype}")
    return out


def apply(op: Op, inputs: tuple, attrs: dict = EMPTY, layout: str = "dense"):
    """Run primitive ``op`` on tensors ``inputs`` and record it for autodiff."""
    be = inputs[0]._be
    for t in inputs:
        if t._be is not be:
            raise _mixed(op, inputs)
    shape, dtype = infer(op, tuple(t.shape for t in inputs), tuple(t.dtype for t in inputs), attrs)
    arrays = [t._data for t in inputs]
    scalar = None
    try:
        out = run_kernel(be, op, layout, arrays, attrs, shape, dtype)
    except PolygradError:
        raise
    except Exception as exc:  # noqa: BLE001 - any kernel fault goes to the fallback policy
        out, scalar = fallback(op, inputs, attrs, layout, shape, dtype, exc)
    else:
        if config.validate:
            validate_against_reference(op, inputs, attrs, layout, out)
    result = _make_tensor(out, be, shape, dtype)
    if _grad_enabled.get() and op not in NON_DIFFERENTIABLE:
        for t in inputs:
            if t.requires_grad:
                result.requires_grad = True
                result._node = Node(op, inputs, attrs, layout, be, scalar)
                break
    ev = _events["polygrad_op_executed"]
    if ev is not None:
        ev(op=op.value, backend=be.name, layout=layout, inputs=inputs, output=result)
    return result


# -- fallback -----------------------------------------------------------------------------------------

def report_fallback(op: Op, be, layout: str, exc: BaseException) -> None:
    key = (op.value, be.name, layout)
    with _stats_lock:
        fallback_counts[key] += 1
        first = (key, type(exc)) not in _warned
        _warned.add((key, type(exc)))
    if first:
        warnings.warn(f"op '{op}' failed on backend {be.name!r} ({layout}) with {type(exc).__name__}: "
                      f"{exc}; recomputed through the fallback chain", FallbackWarning, stacklevel=4)
    ev = _events["polygrad_fallback"]
    if ev is not None:
        ev(op=op.value, backend=be.name, layout=layout, exception=exc)


def fallback(op: Op, inputs: tuple, attrs: dict, layout: str, shape: tuple, dtype, exc: BaseException):
    """(output array on the inputs' backend, scalar decomposition or None) after a kernel fault."""
    be = inputs[0]._be
    if config.fallback == "raise":
        raise exc
    report_fallback(op, be, layout, exc)
    for alt_name in config.fallback_chain.get(be.name, ()):
        try:
            alt = registry.get(alt_name)
            host = [alt.from_numpy(be.to_numpy(t._data)) for t in inputs]
            out = run_kernel(alt, op, layout, host, attrs, shape, dtype)
            # the alternative's forward is trusted, and so is the VJP rule on the original backend
            return be.from_numpy(alt.to_numpy(out)), None
        except PolygradError:
            raise
        except Exception:  # noqa: BLE001 - try the next link of the chain
            continue
    decomposition = scalar_decompose(op, inputs, attrs, shape, exc, be, layout)
    out = be.from_numpy(np.asarray(reference.data_of(decomposition[1]), dtype=dtype).reshape(shape))
    return out, decomposition


def scalar_decompose(op: Op, inputs: tuple, attrs: dict, shape: tuple, exc: BaseException, be, layout: str):
    """Decompose ``op`` into Values: (input leaves per operand, output elements)."""
    size = sum(int(np.prod(t.shape, dtype=np.int64)) for t in inputs) + int(np.prod(shape, dtype=np.int64))
    if size > config.scalar_fallback_max_elements:
        raise BackendError(
            f"op '{op}' failed on backend {be.name!r} ({layout}) with {type(exc).__name__}: {exc}; "
            f"scalar decomposition would touch {size} elements, more than "
            f"pg.config.scalar_fallback_max_elements={config.scalar_fallback_max_elements}") from exc
    leaves = [reference.leaves_of(be.to_numpy(t._data), t.requires_grad) for t in inputs]
    items, _ = reference.run(op, [(items, t.shape) for items, t in zip(leaves, inputs)], attrs)
    return leaves, items


def validate_against_reference(op: Op, inputs: tuple, attrs: dict, layout: str, out: Any) -> None:
    """POLYGRAD_VALIDATE=1: compare a kernel's output with the scalar reference, raise on mismatch."""
    be = inputs[0]._be
    flats = [(reference.leaves_of(be.to_numpy(t._data), False), t.shape) for t in inputs]
    items, ref_shape = reference.run(op, flats, attrs)
    got = np.asarray(be.to_numpy(out), dtype=np.float64)
    want = np.asarray(reference.data_of(items), dtype=np.float64).reshape(ref_shape)
    if got.shape != want.shape or not np.allclose(got, want, rtol=config.validate_rtol,
                                                   atol=config.validate_atol, equal_nan=True):
        err = np.max(np.abs(got - want)) if got.shape == want.shape else float("nan")
        raise BackendError(f"POLYGRAD_VALIDATE: op '{op}' on backend {be.name!r} ({layout}) disagrees with "
                           f"the scalar reference (max abs error {err:.3g})")


def is_sparse_op(op: Op) -> bool:
    return op in SPARSE
