"""Dispatch: run one primitive op on its backend, check the result, fall back when a kernel fails.

``apply(op, inputs, attrs, layout)`` is the single path every primitive takes:

1. all inputs must live on one backend (else MixedBackendError naming both);
2. the op's inference validates the operands and predicts the output shape/dtype (user errors
   are raised here, before any kernel runs, and are never "fallen back" from); an output over
   the memory budget is refused here too (MemoryBudgetError), before anything is allocated;
3. the backend's kernel for ``(op, layout)`` runs -- a dict lookup in the table the registry
   built at load time;
4. its output is checked against the inference; an exception or a contradicting output is a
   kernel fault, handled by the fallback policy: the backend's fallback chain (a GPU backend
   may retry on the host), then scalar decomposition over :class:`polygrad.Value`, whose ``backward`` later
   supplies the gradient so no rule or kernel of the failing backend is trusted;
5. when grad mode is on and an input requires grad, a Node is recorded.
"""
from __future__ import annotations

import math
import threading
import warnings
from collections import Counter
from contextvars import ContextVar
from typing import Any, Sequence

import numpy as np

from ..runtime import memory
from . import reference
from ..runtime.config import config
from ..ir.dtypes import needs_cast, promote
from ..ir.errors import BackendError, FallbackWarning, MemoryBudgetError, MixedBackendError, PolygradError
from ..runtime.events import hook_failures
from .graph import Node, saved_inputs
from .inference import _RULES as _infer_rules
from ..ir.ops import NON_DIFFERENTIABLE, Op, kernel_key
from ..runtime.backend import sum_dtype
from ..runtime.registry import registry

_grad_enabled: ContextVar[bool] = ContextVar("polygrad_grad_enabled", default=True)
#: the recorder of a ``pg.compile`` capture running in this context (None: nothing is recorded)
_recording: ContextVar[Any] = ContextVar("polygrad_recording", default=None)
#: a ``pg.compile`` default-mode call's inference results (None: not in one): each op's output
#: shape and dtype, keyed by everything inference reads (op, operand shapes and dtypes, attributes)
_inference_memo: ContextVar[Any] = ContextVar("polygrad_inference_memo", default=None)
#: a ``pg.compile`` default-mode call's walk along its forward plan (None: not in one): each op is
#: matched against the plan's next entry and, when equal, run with the entry's decisions
#: (polygrad.compile.forward_plan)
_forward: ContextVar[Any] = ContextVar("polygrad_forward_plan", default=None)
_events = registry.events


def guard_host_array(arr: Any) -> None:
    """Under a ``pg.compile`` capture, guard a numpy array the step hands an op on the host (data,
    an index, classes, a mask, weights) by content: the caller's own array, which they may edit in
    place between calls (guard it, not a copy made from it: a copy never changes)."""
    if isinstance(arr, np.ndarray):
        rec = _recording.get()
        if rec is not None:
            rec.host_array(arr)
_tables = registry.tables
EMPTY: dict = {}


def _memo_infer(memo: dict, op: Op, shapes: tuple, dtypes: tuple, attrs: dict) -> tuple:
    """Inference through ``memo``; attributes are keyed with their types, and a tuple's with its
    items' types (1, 1.0 and True hash alike but may infer differently); ones that cannot be
    hashed (arrays) are inferred every time."""
    key: tuple = (op, shapes, dtypes)
    for k, v in attrs.items():
        key += (k, type(v), v, tuple(map(type, v)) if type(v) is tuple else None)
    try:
        hit = memo.get(key)
    except TypeError:  # an unhashable attribute (an index array): infer every time
        return _infer_rules[op](op, shapes, dtypes, attrs)
    if hit is None:
        hit = memo[key] = _infer_rules[op](op, shapes, dtypes, attrs)
        if len(memo) > 4096:  # a step that keeps making new shapes: keep the memo bounded
            memo.clear()
    return hit


def note_host_read(t: Any) -> None:
    """Tell a running ``pg.compile`` capture that ``t``'s values were read on the host (as indices,
    targets, a graph): a replay would reuse what they were, so the capture guards them."""
    rec = _recording.get()
    if rec is not None:
        rec.host_read(t)

# -- statistics (pg.stats()) ------------------------------------------------------------------------
_stats_lock = threading.Lock()
fallback_counts: Counter = Counter()      # (op, backend, layout) -> times
_warned: set = set()


def stats() -> dict:
    """Counters since start (or ``pg.reset_stats()``).

    ``fallbacks``: {"op/backend/layout": count}; ``fallbacks_by_op``: {"op": count};
    ``fallbacks_total``: the sum; ``hook_failures``: {"plugin/hook": "error"} for every event-hook
    listener disabled because it raised (not cleared by reset_stats: it stays disabled).
    A fallback is counted each time a kernel (forward or fused
    backward) fails, whichever link of the fallback chain then serves the op."""
    with _stats_lock:
        by_op: Counter = Counter()
        for (op, _be, _layout), n in fallback_counts.items():
            by_op[op] += n
        return {"fallbacks": {f"{op}/{be}/{layout}": n for (op, be, layout), n in fallback_counts.items()},
                "fallbacks_by_op": dict(by_op),
                "fallbacks_total": sum(fallback_counts.values()),
                "hook_failures": dict(hook_failures)}


def reset_stats() -> None:
    with _stats_lock:
        fallback_counts.clear()
        _warned.clear()


def is_grad_enabled() -> bool:
    return _grad_enabled.get()


class KernelFault(BackendError):
    """A kernel's output contradicts the op's inference.

    Dispatch treats it like a kernel exception (it triggers the fallback); it is a BackendError
    so that, under ``pg.config.fallback = "raise"``, what escapes is a polygrad error naming the
    op, the backend and the expected and actual outputs."""


def _mixed(op: Op, inputs: tuple) -> MixedBackendError:
    names = sorted({t._be.name for t in inputs})
    desc = ", ".join(f"{t.shape}@{t._be.name}" for t in inputs)
    return MixedBackendError(f"op '{op}' got operands on different backends ({' and '.join(names)}): "
                             f"{desc}; move one explicitly with t.to(name)")


def _kernel(be, op: Op, layout: str):
    table = registry.tables.get(be.name, EMPTY)
    return table.get(kernel_key(op, layout))


def run_kernel(be, op: Op, layout: str, arrays: Sequence[Any], attrs: dict, shape: tuple, dtype) -> Any:
    """Run the backend's kernel and check its output; KernelFault / the kernel's error on failure."""
    kernel = _kernel(be, op, layout)
    if kernel is None:
        raise NotImplementedError(f"backend {be.name!r} provides no kernel for op '{op}' (layout {layout})")
    out = kernel(*arrays, **attrs)
    if be.shape(out) != shape or be.dtype(out) != dtype:
        raise _contradiction(be, op, layout, out, shape, dtype)
    return out


def _contradiction(be, op: Op, layout: str, out: Any, shape: tuple, dtype) -> KernelFault:
    return KernelFault(f"kernel for op '{op}' on backend {be.name!r} ({layout}) returned "
                       f"shape {be.shape(out)} dtype {be.dtype(out)}, expected {shape} {dtype}")


def apply(op: Op, inputs: tuple, attrs: dict = EMPTY, layout: str = "dense"):
    """Run primitive ``op`` on tensors ``inputs`` and record it for autodiff.

    This is the hot path of every op: keep it free of generator expressions and extra calls."""
    cursor = _forward.get()
    planned = False  # whether pg.compile's forward plan was asked about this op
    if cursor is not None:
        if _recording.get() is not None or config.validate:
            cursor = None  # a pass being captured: its ops are not part of the call's plan
        elif ((pos := cursor.pos) >= 0
              and (len(inputs) == 1 or (len(inputs) == 2 and inputs[0].dtype is inputs[1].dtype))):
            # operands no promotion applies to (the mixed-backend check is the plan's: an entry's
            # inputs all lived on one backend): ask the plan first, before anything else is computed
            # -- the entry's generated matcher directly where it has one (what Cursor.run calls)
            plan = cursor.plan
            fast = plan[pos].fast if pos < len(plan) else None
            result = (cursor.run(op, inputs, attrs, layout) if fast is None
                      else fast(cursor, pos, op, inputs, attrs, layout))
            if result is not None:
                return result
            planned = True
    first = inputs[0]
    be = first._be
    n = len(inputs)
    shapes: tuple
    dtypes: tuple
    arrays: Sequence[Any]
    if n == 1:
        shapes, dtypes, arrays = (first.shape,), (first.dtype,), (first._data,)
        needs_grad = first.requires_grad
    elif n == 2:
        second = inputs[1]
        if second._be is not be:
            raise _mixed(op, inputs)
        if first.dtype != second.dtype and op in PROMOTING and needs_cast(first.dtype, second.dtype):
            return apply(op, _promoted(op, inputs), attrs, layout)  # type: ignore[arg-type]
        shapes, dtypes = (first.shape, second.shape), (first.dtype, second.dtype)
        arrays = (first._data, second._data)
        needs_grad = first.requires_grad or second.requires_grad
    else:
        promoted = _promoted(op, inputs) if op in PROMOTING else None
        if promoted is not None:
            return apply(op, promoted, attrs, layout)
        shape_list, dtype_list, array_list = [], [], []
        needs_grad = False
        for t in inputs:
            if t._be is not be:
                raise _mixed(op, inputs)
            shape_list.append(t.shape)
            dtype_list.append(t.dtype)
            array_list.append(t._data)
            needs_grad = needs_grad or t.requires_grad
        shapes, dtypes, arrays = tuple(shape_list), tuple(dtype_list), array_list
    if cursor is not None and not planned and cursor.pos >= 0:  # (after any promotion)
        result = cursor.run(op, inputs, attrs, layout)
        if result is not None:
            return result
    memo = _inference_memo.get()
    if memo is None:
        shape, dtype = _infer_rules[op](op, shapes, dtypes, attrs)
    else:  # pg.compile's default mode: inference is a pure function of what the key holds
        shape, dtype = _memo_infer(memo, op, shapes, dtypes, attrs)
    if op is Op.SUM and be.dtypes is not None and dtype.kind in "iu":  # a backend without int64
        dtype = sum_dtype(be, dtype)
    # the memory budget is checked before the kernel allocates, from the inferred output size
    need = math.prod(shape) * dtype.itemsize
    if need >= memory.CHECK_FLOOR:  # below it: no check, and no message built on the hot path
        memory.check(str(op), need, backend=be,
                     what=f"its {dtype} output of shape {shape} (operands {', '.join(map(str, shapes))})")
    scalar = None
    kernel = None
    try:
        kernel = _tables.get(be.name, EMPTY).get(kernel_key(op, layout))
        if kernel is None:
            out = run_kernel(be, op, layout, arrays, attrs, shape, dtype)
        else:
            out = kernel(*arrays, **attrs)
            if be.shape(out) != shape or be.dtype(out) != dtype:  # run_kernel's check, inlined
                raise _contradiction(be, op, layout, out, shape, dtype)
    except KernelFault as exc:  # an output contradicting the inference: a kernel fault
        out, scalar = fallback(op, inputs, attrs, layout, shape, dtype, exc)
    except PolygradError:  # raised on purpose (e.g. a kernel's own validation): the user's to see
        raise
    except Exception as exc:  # noqa: BLE001 - any kernel fault goes to the fallback policy
        out, scalar = fallback(op, inputs, attrs, layout, shape, dtype, exc)
    else:
        if config.validate:
            validate_against_reference(op, inputs, attrs, layout, out)
    result = first._new(out, be, shape, dtype)
    rec = _recording.get()
    if needs_grad and dtype.kind == "f" and op not in NON_DIFFERENTIABLE and _grad_enabled.get():
        result.requires_grad = True
        # a capture (pg.compile) replays the step from the tensors themselves: keep them whole
        result._node = Node(op, inputs if rec is not None else saved_inputs(op, inputs), attrs, layout,
                            be, scalar)
    if rec is not None:  # pg.compile is capturing this step (polygrad.capture)
        rec.kernel(op, layout, be, inputs, attrs, result)
    elif cursor is not None:  # pg.compile's default mode: the op joins the call's forward plan
        cursor.record(op, layout, attrs, inputs, _grad_enabled.get(), kernel, result, scalar)
    ev = _events["polygrad_op_executed"]
    if ev is not None:
        ev(op=op.value, backend=be.name, layout=layout, inputs=inputs, output=result)
    return result


# -- dtype promotion ------------------------------------------------------------------------------------

#: ops whose operands are brought to one dtype (``dtypes.promote``) before the kernel runs, so
#: kernels never promote on their own (numpy's rules differ: int64 + float32 -> float64)
PROMOTING = frozenset({Op.ADD, Op.MUL, Op.POW, Op.MAXIMUM, Op.WHERE, Op.CONCAT, Op.MATMUL,
                       Op.SPMM, Op.SDDMM})


def kernel_dtypes(op: Op, dtypes: tuple) -> tuple:
    """The operand dtypes a kernel of ``op`` is called with, given the user's operand dtypes
    (the conformance kit calls kernels directly and must feed them what dispatch would)."""
    if op not in PROMOTING:
        return tuple(dtypes)
    start = 1 if op == Op.WHERE else 0
    values = dtypes[start:]
    common = values[0]
    for d in values[1:]:
        common = promote(common, d)
    if np.result_type(*values) == common:  # numpy-style kernels get it right by themselves
        return tuple(dtypes)
    return tuple(dtypes[:start]) + (common,) * len(values)


def _promoted(op: Op, inputs: tuple) -> tuple | None:
    """``inputs`` with operands cast (recorded CAST nodes) to the dtypes the kernel must see, or
    None when they already are."""
    want = kernel_dtypes(op, tuple(t.dtype for t in inputs))
    if all(t.dtype == d for t, d in zip(inputs, want)):
        return None
    return tuple(t if t.dtype == d else apply(Op.CAST, (t,), {"dtype": d}) for t, d in zip(inputs, want))


# -- fallback -----------------------------------------------------------------------------------------

def report_fallback(op: Op, be, layout: str, exc: BaseException) -> None:
    rec = _recording.get()
    if rec is not None:  # a step whose op fell back is not replayed: it stays eager
        rec.refuse(f"op '{op}' fell back on backend {be.name!r} ({layout})")
    note_fallback(op.value, be.name, layout, exc, f"op '{op}' failed on backend {be.name!r} ({layout}) with "
                  f"{type(exc).__name__}: {exc}; recomputed through the fallback chain")


def note_fallback(op: str, backend: str, layout: str, exc: BaseException, message: str) -> None:
    """Count a fallback, warn ``message`` once per (op, backend, layout, error type) -- the one
    warn-once record ``pg.reset_stats()`` clears -- and fire ``polygrad_fallback``."""
    key = (op, backend, layout)
    with _stats_lock:
        fallback_counts[key] += 1
        first = (key, type(exc)) not in _warned
        _warned.add((key, type(exc)))
    if first:  # stacklevel: the user's line, above report_fallback / report and this helper
        warnings.warn(message, FallbackWarning, stacklevel=5)
    ev = _events["polygrad_fallback"]
    if ev is not None:
        ev(op=op, backend=backend, layout=layout, exception=exc)


def fallback(op: Op, inputs: tuple, attrs: dict, layout: str, shape: tuple, dtype, exc: BaseException):
    """(output array on the inputs' backend, scalar decomposition or None) after a kernel fault.

    ``pg.config.fallback == "raise"`` re-raises ``exc``.  Otherwise the fault is reported, the
    backends of ``pg.config.fallback_chain[backend]`` (default: the backend's own
    ``fallback_chain``) are tried in order (a link that is unknown,
    unavailable or fails as well is reported and skipped), and last the op is decomposed into
    scalar :class:`Value` operations (see :func:`scalar_decompose`).
    """
    be = inputs[0]._be
    if config.fallback == "raise":
        raise exc
    need = memory.nbytes(shape, dtype)
    if not memory.fits(need) and not memory.fits(need, be):
        # not a kernel fault: the output alone does not fit, so no other backend and no scalar
        # decomposition could produce it either (and no FallbackWarning for a user's oversize op)
        try:
            memory.check(str(op), need, what=f"its {dtype} output of shape {shape}")
        except MemoryBudgetError as err:
            raise err from exc
    report_fallback(op, be, layout, exc)
    for alt_name in config.fallback_chain.get(be.name, be.fallback_chain):
        if alt_name == be.name:
            continue
        try:
            alt = registry.get(alt_name)
        except PolygradError:  # the chain names a backend that is not installed here: skip it
            continue
        try:
            host = [alt.from_numpy(be.to_numpy(t._data)) for t in inputs]
            out = run_kernel(alt, op, layout, host, attrs, shape, dtype)
            # The alternative's forward is trusted, and so is the VJP rule (polygrad's own, made of
            # primitives that are each checked and fall back on their own) on the original backend.
            return be.from_numpy(alt.to_numpy(out)), None
        except Exception as alt_exc:  # noqa: BLE001 - this link failed too: report, try the next
            report_fallback(op, alt, layout, alt_exc)
            continue
    # Values only where a node will be recorded (the same condition as in apply)
    want_grad = dtype.kind == "f" and op not in NON_DIFFERENTIABLE and _grad_enabled.get()
    decomposition = scalar_decompose(op, inputs, attrs, shape, exc, be, layout, want_grad=want_grad)
    try:
        out = be.from_numpy(np.asarray(reference.data_of(decomposition[1]), dtype=dtype).reshape(shape))
    except Exception as conv_exc:  # noqa: BLE001 - e.g. a Python int that overflows the dtype
        raise BackendError(f"op '{op}' failed on backend {be.name!r} ({layout}) with "
                           f"{type(exc).__name__}: {exc}; its scalar decomposition could not be "
                           f"converted to {dtype} {shape}: {type(conv_exc).__name__}: {conv_exc}") from exc
    if not (want_grad and any(t.requires_grad for t in inputs)):
        decomposition = None  # no node will be recorded: keep no Values alive
    return out, decomposition


def scalar_cost(op: Op, shapes: tuple, attrs: dict, out_shape: tuple) -> int:
    """Scalar operations a decomposition of ``op`` needs (what the size guard compares).

    Elements read and written, plus the inner products of the contracting ops, whose work is
    not bounded by their operand sizes (a [n, k] @ [k, m] matmul does n*k*m multiplications)."""
    numel = math.prod  # Python ints: no int64 overflow on absurd shapes

    size = sum(numel(s) for s in shapes) + numel(out_shape)
    if op == Op.MATMUL:
        a, b = shapes
        size += numel(out_shape) * (a[-1] if a else 1)
    elif op == Op.SPMM:
        x = shapes[1]
        size += shapes[0][0] * (x[1] if len(x) == 2 else 1)
    elif op == Op.SDDMM:
        size += numel(out_shape) * (shapes[0][1] if len(shapes[0]) == 2 else 1)
    return size


def scalar_decompose(op: Op, inputs: tuple, attrs: dict, shape: tuple, exc: BaseException, be,
                     layout: str, want_grad: bool = True):
    """Decompose ``op`` into Values: (input leaves per operand, output elements).

    Inputs that require grad (when ``want_grad``) become :class:`Value` leaves, so
    ``Value.backward`` over the outputs later gives their gradients without trusting any kernel
    or VJP rule.  Raises :class:`BackendError` naming the op, the size and ``exc`` when the
    decomposition would exceed ``pg.config.scalar_fallback_max_elements``, or when the scalar
    reference itself fails."""
    size = scalar_cost(op, tuple(t.shape for t in inputs), attrs, shape)
    if size > config.scalar_fallback_max_elements:
        raise BackendError(
            f"op '{op}' failed on backend {be.name!r} ({layout}) with {type(exc).__name__}: {exc}; "
            f"scalar decomposition would take {size} scalar operations (operands "
            f"{', '.join(str(t.shape) for t in inputs)} -> {shape}), more than "
            f"pg.config.scalar_fallback_max_elements={config.scalar_fallback_max_elements}") from exc
    try:
        leaves = [reference.leaves_of(be.to_numpy(t._data), want_grad and t.requires_grad) for t in inputs]
        items, _ = reference.run(op, [(items, t.shape) for items, t in zip(leaves, inputs)], attrs)
    except Exception as ref_exc:  # noqa: BLE001 - the last resort failed: say so, with both errors
        raise BackendError(f"op '{op}' failed on backend {be.name!r} ({layout}) with "
                           f"{type(exc).__name__}: {exc}; its scalar decomposition failed too: "
                           f"{type(ref_exc).__name__}: {ref_exc}") from exc
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
