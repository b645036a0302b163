"""The executor: a capture's program as one generated Python function (buffers as locals, a line
per entry, no dispatch on the entry kind); a checked variant of the same function serves
validation mode and event listeners."""
from __future__ import annotations

import builtins
import contextlib
import time
from typing import Any, Callable, Iterator

import numpy as np

from ..runtime.config import config
from ..engine.dispatch import fallback, registry, validate_against_reference
from ..ir.errors import PolygradError
from ..sparse import SparseTensor
from ..tensor import Tensor
from .program import (ARG, ASSERT_FINITE, BACKWARD, CALL, FRESH, FUSED, GRAD, HOST, KERNEL, LOAD, SET_DATA,
                      SET_GRAD, SET_STATE, STATE, Capture, _call_source, _HostFailed, _NotFinite, _numbers,
                      _ReplayFault, _reads, _result_slots, _shape_check_source, _ShapeMismatch)
from .backend_compile import offer
from ..runtime.heap import keep_heap_top
from .rewrite import _all_finite, _push_row_gathers
from .two_hop import _push_two_hops
from .inline_steps import _inline_cross_entropy


#: set by :func:`profile_entries`: the per-entry seconds of the replays prepared meanwhile
_profile: dict[str, float] | None = None


@contextlib.contextmanager
def profile_entries() -> Iterator[dict[str, float]]:
    """Time each program entry of the replays of the steps captured inside the block.

    Yields a dict, filled as those replays run (inside the block or after it): a description of an
    entry (``"<capture>:<entry> <kind> <op>"`` and its generated line) -> seconds summed over its
    replays.  Diagnostic only (``python -m benchmarks.compile_profile``): the timed function costs
    two clock reads per entry; replays prepared outside the block are untimed."""
    global _profile
    times: dict[str, float] = {}
    previous, _profile = _profile, times
    try:
        yield times
    finally:
        _profile = previous


def prepare(cap: Capture) -> Capture:
    """Rewrite ``cap``'s program (unless an op listener must see eager's ops: whether one listens is
    part of the guard key) and generate its function."""
    if registry.events["polygrad_op_executed"] is None:
        cap.program, cap.meta = _push_row_gathers(cap.program, cap.meta, cap.spec)
        cap.program, cap.meta = _push_two_hops(cap.program, cap.meta, cap.spec)
        cap.program, cap.meta = _inline_cross_entropy(cap.program, cap.meta, cap.spec)
    # a backend may compile its kernels (backend_compile.py)
    cap.fast = offer(cap, _generate(cap, timings=_profile), _result, _rebuild)
    keep_heap_top()  # replays free their intermediates at the end of every call (runtime/heap.py)
    return cap


def run(cap: Capture, flat: list) -> Any:
    """Replay ``cap`` on the call's flattened tensor arguments; a kernel fault raises _ReplayFault,
    an exception from host code (the optimizer) _HostFailed."""
    events = registry.events
    fn: Callable[[list, dict, dict], Any] | None
    if (config.validate or events["polygrad_op_executed"] is not None
            or events["polygrad_backward_finished"] is not None):
        if cap.checked is None:
            cap.checked = _generate(cap, checked=True)
        fn = cap.checked
    else:
        fn = cap.fast
    assert fn is not None  # prepare() generated it
    try:
        return fn(flat, registry.tables, registry.vjp_tables)
    except (_HostFailed, _ReplayFault):
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel fault before any step: the caller re-runs eagerly
        raise _ReplayFault(exc, False) from exc


def _make(buf: Any, meta: list, slot: int) -> Tensor:
    be, shape, dtype = meta[slot]
    return Tensor._make(buf[slot], be, shape, dtype)


def _rebuild(value: tuple, buf: Any, meta: list) -> Any:
    kind = value[0]
    if kind == 1:
        return _make(buf, meta, value[1])
    if kind == 0:
        return None
    if kind == 2:
        return value[1]
    return SparseTensor._wrap(value[1], _rebuild(value[2], buf, meta))


def _result(spec: tuple, buf: list, meta: list, flat: list) -> Any:
    kind, payload = spec[0], spec[1]
    if kind == "tensor":
        return _rebuild(payload, buf, meta)
    if kind == "const":
        return payload
    if kind == "item":
        be = meta[payload][0]
        return be.to_numpy(buf[payload]).reshape(()).item()
    if kind == "dict":
        return {k: _result(v, buf, meta, flat) for k, v in payload}
    if kind == "arg":
        return flat[payload]
    items = [_result(v, buf, meta, flat) for v in payload]
    return items if kind == "list" else tuple(items)


def _small(kernel: Callable, size: int) -> Callable:
    """``kernel``'s variant for outputs of fewer than ``size`` elements, if it declares one.

    A kernel may carry ``polygrad_small = (kernel, small, max_elements)``: for outputs of fewer
    than ``max_elements`` elements ``small(*args)`` returns what ``kernel(*args)`` does, without
    its checks for large outputs (the numpy backend's pooled ufuncs: the raw ufunc).  Honoured only
    when the tuple names ``kernel`` itself, so a wrapper that copied the attribute along with the
    function's ``__dict__`` (``functools.wraps``), e.g. an injected fault, is called as it is.
    """
    declared = getattr(kernel, "polygrad_small", None)
    if declared is not None and declared[0] is kernel and declared[2] >= size:
        return declared[1]
    return kernel


def _generate(cap: Capture, checked: bool = False,
              timings: dict[str, float] | None = None) -> Callable[[list, dict, dict], Any]:
    """The program as one Python function -- the one executor: a line per entry, buffers as local
    variables deleted after their last use (no loop, no dispatch on the entry kind, no argument
    lists built per call).  ``checked``: also shadow-check each kernel against the scalar
    reference (``POLYGRAD_VALIDATE``) and fire ``polygrad_op_executed`` /
    ``polygrad_backward_finished`` as eager does.  ``timings``: add each entry's seconds to it
    (:func:`profile_entries`).

    Faults: before a non-idempotent host call (the optimizer's step) any exception propagates and
    the caller re-runs the call eagerly; after it (a re-run would step twice) a failing forward
    kernel is recomputed in place through the fallback chain, and anything else raises
    :class:`_ReplayFault` with ``after_step`` set.
    """
    env: dict[str, Any] = {"MAKE": Tensor._make, "WRAP": SparseTensor._wrap, "HostFailed": _HostFailed, "SMALL": _small,
                           "FINITE": _all_finite, "NotFinite": _NotFinite, "Fault": _ReplayFault,
                           "RESULT": _result, "SPEC": cap.spec, "META": cap.meta, "Mismatch": _ShapeMismatch,
                           "CHECK": _check_kernel, "BWD": _backward_event, "FALLBACK": _fallback_in_place,
                           "PERF": time.perf_counter, "GONE": _gone,
                           "NUMBERS": _numbers}
    stepped = False
    body: list[list[str]] = []      # the lines of each entry
    reads: list[list[int]] = []     # the slots each entry reads
    tables: dict[tuple, str] = {}   # (vjp?, backend name, key) -> local name of the kernel
    small: dict[str, int] = {}      # local name of a kernel -> the output size its small variant serves

    def const(value: Any) -> str:
        name = f"C{len(env)}"
        env[name] = value
        return name

    def kernel(fused: bool, be, key: tuple) -> str:
        ident = (fused, be.name, key)
        if ident not in tables:
            tables[ident] = f"k{len(tables)}"
        return tables[ident]

    def small_kernel(be, key: tuple, shape: tuple) -> str:
        """The kernel's small-output variant for a call site whose output has fewer elements than
        the kernel declares (``polygrad_small``, see :func:`_small`), else the kernel itself."""
        name = kernel(False, be, key)
        declared = getattr(registry.tables.get(be.name, {}).get(key), "polygrad_small", None)
        if declared is None or int(np.prod(shape, dtype=np.int64)) >= declared[2]:
            return name
        small[name] = declared[2]
        return f"{name}s"

    def shape_check(var: str, be, shape: tuple) -> str:
        return _shape_check_source(var, be, shape, const)

    def target(ref: Any) -> str:
        return f"flat[{ref}]" if type(ref) is int else const(ref)

    def rebuild(value: tuple) -> str:
        if value[0] == 1:
            be, shape, dtype = cap.meta[value[1]]
            return f"MAKE(b{value[1]}, {const(be)}, {const(shape)}, {const(dtype)})"
        if value[0] == 0:
            return "None"
        if value[0] == 2:
            return const(value[1])
        return f"WRAP({const(value[1])}, {rebuild(value[2])})"

    def call_args(ins: tuple, kwargs: dict) -> str:
        return _call_source(ins, kwargs, const)

    def slots(used: Any) -> str:
        return "{" + ", ".join(f"{i}: b{i}" for i in sorted(set(used))) + "}"

    def guarded(lines: list[str], handler: list[str]) -> list[str]:
        return ["try:", *[f"    {line}" for line in lines], "except Exception as exc:", *[f"    {h}" for h in handler]]

    for e in cap.program:
        kind = e[0]
        lines: list[str] = []
        if kind == KERNEL:
            _, be, key, ins, attrs, out, shape = e
            lines = [f"b{out} = {small_kernel(be, key, shape)}({call_args(ins, attrs)})",
                     shape_check(f"b{out}", be, shape)]
            if stepped:  # a re-run would step twice: recompute this kernel through the fallback chain
                lines = guarded(lines, [f"b{out} = FALLBACK({const(e)}, {slots(ins)}, META, exc)"])
            if checked:
                lines.append(f"CHECK({const(e)}, {slots((*ins, out))}, META)")
        elif kind == FUSED:
            _, be, key, ins, kwargs, outs = e
            lines = [f"r = {kernel(True, be, key)}({call_args(ins, kwargs)})"]
            for i, slot in enumerate(outs):
                if slot >= 0:
                    lines += [f"b{slot} = r[{i}]", shape_check(f"b{slot}", be, cap.meta[slot][1])]
            if stepped:
                lines = guarded(lines, ["raise Fault(exc, True) from exc"])
        elif kind == CALL:
            _, be, fn, attrs, numbers, ins, outs = e
            kw = call_args((), attrs)
            args = [*(f"b{i}" for i in ins), f"*NUMBERS({const(e)})", *([kw] if kw else [])]
            lines = [f"r = {const(fn)}({', '.join(args)})"]
            for i, slot in enumerate(outs):
                lines += [f"b{slot} = r[{i}]", shape_check(f"b{slot}", be, cap.meta[slot][1])]
            if stepped:
                lines = guarded(lines, ["raise Fault(exc, True) from exc"])
        elif kind == STATE:
            lines = [f"b{e[1]} = {const(e[2])}.state[{e[3]!r}][{e[4]!r}]"]
        elif kind == SET_STATE:
            lines = [f"{const(e[1])}.state[{e[2]!r}][{e[3]!r}] = b{e[4]}"]
        elif kind == LOAD:
            lines = [f"b{e[1]} = {const(e[2])}._data"]
        elif kind == ARG:
            lines = [f"b{e[1]} = flat[{e[2]}]._data"]
        elif kind == GRAD:
            lines = [f"g = {const(e[2])}.grad", f"if g is None: raise GONE({stepped})", f"b{e[1]} = g._data"]
        elif kind == FRESH:
            lines = [f"b{e[1]} = {const(e[2])}(){'' if e[3] else '._data'}"]
        elif kind == HOST:
            lines = ["try:", f"    {const(e[1])}()", "except Exception as exc:", "    raise HostFailed(exc)"]
            stepped = stepped or not e[2]
        elif kind == SET_GRAD:
            lines = [f"{target(e[1])}.grad = {rebuild(e[2])}"]
        elif kind == SET_DATA:
            lines = [f"{target(e[1])}._data = b{e[2]}"]
        elif kind == ASSERT_FINITE:
            lines = [f"if not FINITE(b{e[1]}): raise Fault(NotFinite(), {stepped})"]
        elif kind == BACKWARD and checked:  # only fires the event
            lines = [f"BWD({const(e)}, {slots(_reads(e))}, META, flat, started)"]
        body.append(lines)
        reads.append(_reads(e))
    result_slots = sorted(_result_slots(cap.spec))
    last: dict[int, int] = {}
    for n, used in enumerate(reads):
        for slot in used:
            last[slot] = n
    dies: dict[int, list[int]] = {}  # entry -> the slots nothing reads after it
    for slot, n in last.items():
        if slot not in result_slots:
            dies.setdefault(n, []).append(slot)
    src = ["def replay(flat, tables, vjp_tables):"]
    if checked:
        src.append("    started = PERF()")
    for (fused, name, key), local in tables.items():
        src.append(f"    {local} = {'vjp_tables' if fused else 'tables'}[{name!r}][{const(key)}]")
        if local in small:
            src.append(f"    {local}s = SMALL({local}, {small[local]})")
    if timings is not None:
        env["TIMES"] = timings
    for n, lines in enumerate(body):
        if timings is not None and lines:
            e = cap.program[n]
            what = (e[2][0].value if e[0] in (KERNEL, FUSED)
                    else getattr(e[2], "__qualname__", "") if e[0] == CALL else "")
            label = f"{id(cap):x}:{n} {type(e).__name__} {what}: {lines[0]}"
            timings.setdefault(label, 0.0)
            lines = ["t_ = PERF()", *lines, f"TIMES[{const(label)}] += PERF() - t_"]
        src += [f"    {line}" for line in lines]
        if n in dies:
            src.append(f"    del {', '.join(f'b{s}' for s in sorted(dies[n]))}")
    src.append(f"    return RESULT(SPEC, {{{', '.join(f'{s}: b{s}' for s in result_slots)}}}, META, flat)")
    exec(builtins.compile("\n".join(src), "<pg.compile replay>", "exec"), env)
    return env["replay"]


def _inputs(e: tuple, buf: Any, meta: list) -> tuple:
    return tuple(_make(buf, meta, i) for i in e[3])


def _gone(after_step: bool) -> _ReplayFault:
    return _ReplayFault(PolygradError("a gradient the capture accumulated into is gone"), after_step)


def _check_kernel(e: tuple, buf: dict, meta: list) -> None:
    """POLYGRAD_VALIDATE shadow check and the op-executed event, for one replayed kernel."""
    _check(e, buf, meta, registry.events)


def _backward_event(e: tuple, buf: dict, meta: list, flat: list, started: float) -> None:
    """``polygrad_backward_finished`` for a replayed backward pass, with the replayed gradients."""
    ev = registry.events["polygrad_backward_finished"]
    if ev is not None:
        grads = [(flat[ref] if type(ref) is int else ref, _rebuild(value, buf, meta)) for ref, value in e[2]]
        ev(num_nodes=e[1], seconds=time.perf_counter() - started, grads=grads)


def _check(e: tuple, buf: Any, meta: list, events) -> None:
    """POLYGRAD_VALIDATE shadow check and the op-executed event, for one replayed kernel."""
    _, be, key, _ins, attrs, out, _shape = e
    inputs = _inputs(e, buf, meta)
    if config.validate:
        validate_against_reference(key[0], inputs, attrs, key[1], buf[out])
    ev = events["polygrad_op_executed"]
    if ev is not None:
        ev(op=key[0].value, backend=be.name, layout=key[1], inputs=inputs, output=_make(buf, meta, out))


def _fallback_in_place(e: tuple, buf: Any, meta: list, exc: BaseException) -> Any:
    """A kernel failed after the optimizer stepped (re-running the call would step twice): recompute
    just this kernel through the usual fallback chain."""
    _, be, key, _ins, attrs, out, shape = e
    array, _ = fallback(key[0], _inputs(e, buf, meta), attrs, key[1], shape, meta[out][2], exc)
    return array
