"""The executor: a capture's program as one generated Python function (buffers as locals, a line
per entry, no dispatch on the entry kind), plus the interpreter that serves validation mode,
event listeners and in-place fallback after an optimizer step."""
from __future__ import annotations

import builtins
import keyword
import time
from typing import Any, Callable

import numpy as np

from ..backend import Backend
from ..config import config
from ..dispatch import fallback, registry, validate_against_reference
from ..errors import PolygradError
from ..sparse import SparseTensor
from ..tensor import Tensor
from .program import (ARG, ASSERT_FINITE, BACKWARD, FRESH, FUSED, GRAD, HOST, KERNEL, LOAD, SET_DATA,
                      SET_GRAD, Capture, _HostFailed, _NotFinite, _ReplayFault, _reads, _result_slots,
                      _ShapeMismatch)
from .backend_compile import offer
from .rewrite import _all_finite, _push_row_gathers

_default_shape = Backend.shape
#: longest program replayed through a generated function (longer ones use the interpreter)
MAX_GENERATED = 20_000


def prepare(cap: Capture) -> Capture:
    """Rewrite ``cap``'s program (unless an op listener must see eager's ops: whether one listens is
    part of the guard key) and generate its function."""
    if registry.events["polygrad_op_executed"] is None:
        cap.program, cap.meta = _push_row_gathers(cap.program, cap.meta, cap.spec)
    cap.fast = offer(cap, _generate(cap), _result, _rebuild)  # a backend may compile its kernels (backend_compile.py)
    return cap


def _make(buf: list, meta: list, slot: int) -> Tensor:
    be, shape, dtype = meta[slot]
    return Tensor._make(buf[slot], be, shape, dtype)


def _rebuild(value: tuple, buf: list, meta: list) -> Any:
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


def _generate(cap: Capture) -> Callable[[list, dict, dict], Any] | None:
    """The program as one Python function: a line per entry, buffers as local variables that are
    deleted after their last use.  This is what makes a replay cheap (no loop, no dispatch on the
    entry kind, no argument lists built per call).  None when the program has kernels after a
    non-idempotent host call: a fault there must be handled in place, which the interpreter does;
    and for programs longer than ``MAX_GENERATED`` entries, whose source would take longer to compile
    than the interpreter loses on them.
    """
    if len(cap.program) > MAX_GENERATED:
        return None
    stepped = False
    for e in cap.program:
        if e[0] == HOST and not e[2]:
            stepped = True
        elif stepped and e[0] in (KERNEL, FUSED):
            return None
    env: dict[str, Any] = {"MAKE": Tensor._make, "WRAP": SparseTensor._wrap, "HostFailed": _HostFailed, "SMALL": _small,
                           "FINITE": _all_finite, "NotFinite": _NotFinite,
                           "RESULT": _result, "SPEC": cap.spec, "META": cap.meta, "Mismatch": _ShapeMismatch}
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
        default = type(be).shape is _default_shape
        got = f"{var}.shape" if default else f"{const(be.shape)}({var})"
        return f"if {got} != {const(shape)}: raise Mismatch({const(shape)}, {got})"

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
        args = [f"b{i}" for i in ins]
        if all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in kwargs):
            args += [f"{k}={const(v)}" for k, v in kwargs.items()]
        elif kwargs:
            args.append(f"**{const(kwargs)}")
        return ", ".join(args)

    for e in cap.program:
        kind = e[0]
        lines: list[str] = []
        if kind == KERNEL:
            _, be, key, ins, attrs, out, shape = e
            lines = [f"b{out} = {small_kernel(be, key, shape)}({call_args(ins, attrs)})",
                     shape_check(f"b{out}", be, shape)]
        elif kind == FUSED:
            _, be, key, ins, kwargs, outs = e
            lines = [f"r = {kernel(True, be, key)}({call_args(ins, kwargs)})"]
            for i, slot in enumerate(outs):
                if slot >= 0:
                    lines += [f"b{slot} = r[{i}]", shape_check(f"b{slot}", be, cap.meta[slot][1])]
        elif kind == LOAD:
            lines = [f"b{e[1]} = {const(e[2])}._data"]
        elif kind == ARG:
            lines = [f"b{e[1]} = flat[{e[2]}]._data"]
        elif kind == GRAD:
            lines = [f"b{e[1]} = {const(e[2])}.grad._data"]
        elif kind == FRESH:
            lines = [f"b{e[1]} = {const(e[2])}(){'' if e[3] else '._data'}"]
        elif kind == HOST:
            lines = ["try:", f"    {const(e[1])}()", "except Exception as exc:", "    raise HostFailed(exc)"]
        elif kind == SET_GRAD:
            lines = [f"{target(e[1])}.grad = {rebuild(e[2])}"]
        elif kind == SET_DATA:
            lines = [f"{target(e[1])}._data = b{e[2]}"]
        elif kind == ASSERT_FINITE:
            lines = [f"if not FINITE(b{e[1]}): raise NotFinite()"]
        # BACKWARD only fires an event: the generated path runs only while no one listens
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
    for (fused, name, key), local in tables.items():
        src.append(f"    {local} = {'vjp_tables' if fused else 'tables'}[{name!r}][{const(key)}]")
        if local in small:
            src.append(f"    {local}s = SMALL({local}, {small[local]})")
    for n, lines in enumerate(body):
        src += [f"    {line}" for line in lines]
        if n in dies:
            src.append(f"    del {', '.join(f'b{s}' for s in sorted(dies[n]))}")
    src.append(f"    return RESULT(SPEC, {{{', '.join(f'{s}: b{s}' for s in result_slots)}}}, META, flat)")
    exec(builtins.compile("\n".join(src), "<pg.compile replay>", "exec"), env)
    return env["replay"]


def _replay(cap: Capture, flat: list) -> Any:
    """Run ``cap``'s program; a failing kernel raises _ReplayFault."""
    buf: list = [None] * len(cap.meta)
    tables = registry.tables
    events = registry.events
    checked = config.validate or events["polygrad_op_executed"] is not None
    after_step = False
    started = time.perf_counter()
    for e in cap.program:
        kind = e[0]
        if kind == KERNEL:
            _, be, key, ins, attrs, out, shape = e
            try:
                array = tables[be.name][key](*[buf[i] for i in ins], **attrs)
                if be.shape(array) != shape:
                    raise PolygradError(f"replayed kernel for op '{key[0]}' on backend {be.name!r} returned "
                                        f"shape {be.shape(array)}, the capture saw {shape}")
            except Exception as exc:  # noqa: BLE001 - any fault: the caller re-runs the step eagerly
                if not after_step:
                    raise _ReplayFault(exc, after_step) from exc
                array = _fallback_in_place(e, buf, cap.meta, exc)
            buf[out] = array
            if checked:
                _check(e, buf, cap.meta, events)
        elif kind == LOAD:
            buf[e[1]] = e[2]._data
        elif kind == ASSERT_FINITE:
            if not _all_finite(buf[e[1]]):
                raise _ReplayFault(_NotFinite(), after_step)
        elif kind == ARG:
            buf[e[1]] = flat[e[2]]._data
        elif kind == FUSED:
            _, be, key, ins, kwargs, outs = e
            try:
                arrays = registry.vjp_tables[be.name][key](*[buf[i] for i in ins], **kwargs)
                for slot, array in zip(outs, arrays):
                    if slot >= 0:
                        if be.shape(array) != cap.meta[slot][1]:
                            raise PolygradError(f"replayed fused backward of '{key[0]}' returned shape "
                                                f"{be.shape(array)}, the capture saw {cap.meta[slot][1]}")
                        buf[slot] = array
            except Exception as exc:  # noqa: BLE001
                raise _ReplayFault(exc, after_step) from exc
        elif kind == GRAD:
            g = e[2].grad
            if g is None:
                raise _ReplayFault(PolygradError("a gradient the capture accumulated into is gone"), after_step)
            buf[e[1]] = g._data
        elif kind == FRESH:
            buf[e[1]] = e[2]() if e[3] else e[2]()._data
        elif kind == HOST:
            e[1]()
            after_step = after_step or not e[2]
        elif kind == SET_GRAD:
            t = flat[e[1]] if type(e[1]) is int else e[1]
            t.grad = _rebuild(e[2], buf, cap.meta)
        elif kind == SET_DATA:
            t = flat[e[1]] if type(e[1]) is int else e[1]
            t._data = buf[e[2]]
        elif kind == BACKWARD:
            ev = events["polygrad_backward_finished"]
            if ev is not None:
                grads = []
                for ref, value in e[2]:
                    leaf = flat[ref] if type(ref) is int else ref
                    grads.append((leaf, _rebuild(value, buf, cap.meta)))
                ev(num_nodes=e[1], seconds=time.perf_counter() - started, grads=grads)
    return _result(cap.spec, buf, cap.meta, flat)


def _inputs(e: tuple, buf: list, meta: list) -> tuple:
    return tuple(_make(buf, meta, i) for i in e[3])


def _check(e: tuple, buf: list, meta: list, events) -> None:
    """POLYGRAD_VALIDATE shadow check and the op-executed event, for one replayed kernel."""
    _, be, key, _ins, attrs, out, _shape = e
    inputs = _inputs(e, buf, meta)
    if config.validate:
        validate_against_reference(key[0], inputs, attrs, key[1], buf[out])
    ev = events["polygrad_op_executed"]
    if ev is not None:
        ev(op=key[0].value, backend=be.name, layout=key[1], inputs=inputs, output=_make(buf, meta, out))


def _fallback_in_place(e: tuple, buf: list, meta: list, exc: BaseException) -> Any:
    """A kernel failed after the optimizer stepped (re-running the call would step twice): recompute
    just this kernel through the usual fallback chain."""
    _, be, key, _ins, attrs, out, shape = e
    array, _ = fallback(key[0], _inputs(e, buf, meta), attrs, key[1], shape, meta[out][2], exc)
    return array
