"""Backends that compile whole steps: the ``polygrad_compile_kernels`` hook.

``pg.compile(step, pure=True)`` records a step as a typed program (``polygrad.compile``) and
replays it kernel by kernel.  A backend that can compile a whole dataflow graph (JAX: one
``jax.jit``) receives the program's *kernel region* instead -- every forward and fused backward
kernel of the step, the optimizer's updates (``Call`` entries of each parameter's update rule) and
the dropout masks a backend draws itself (``Call`` entries of its ``random_mask``), with the slots
they read from outside and the slots the rest of the step reads -- and returns one callable for it.
polygrad keeps everything else as it is:

* **guards**: a call replays (compiled or not) only when the capture's guards hold;
* **the host numbers** of each ``Call`` (learning rate, bias corrections, a random key drawn from
  ``pg.manual_seed``'s generator), computed on the host before the callable runs, in program order,
  and passed to it as arguments;
* **the rest of the step**: reading the arguments, parameters and optimizer state, host-drawn
  dropout masks (backends without ``random_mask``), gradients, parameters and state written, the
  optimizer's host calls (``zero_grad``, its step counters), events and the result, run as in a replay;
* **fallbacks**: a compiled callable that raises, or returns the wrong number of arrays or a
  shape the capture did not see, is reported once (``FallbackWarning``, the ``polygrad_fallback``
  event with op ``"compiled-step"``, ``pg.stats()["fallbacks"]``), never called again for that
  capture, and the region's entries run one by one instead, in the same call and with the same
  host numbers -- so a failing compiled step still gives the replay's numbers; a kernel that fails
  then drops the capture and the call re-runs eagerly, as in any replay;
* **validation and events**: with ``POLYGRAD_VALIDATE`` or an op/backward listener, steps replay
  through the interpreter, kernel by kernel, and the compiled callable is not used.

The region is the run of program entries from the first kernel or call to the last one; it is
offered only when no host code runs inside it (no optimizer host call, no storage or gradient
written between two kernels: what a step written as forward / backward / ``opt.step()`` gives,
when the optimizer's updates are rules on raw arrays) and all its kernels are on one backend.
Otherwise the step replays as usual.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .program import (ARG as _ARG, ASSERT_FINITE as _ASSERT_FINITE, BACKWARD as _BACKWARD, CALL as _CALL,
                      FRESH as _FRESH, FUSED as _FUSED, GRAD as _GRAD, HOST as _HOST, KERNEL as _KERNEL, LOAD as _LOAD,
                      SET_DATA as _SET_DATA, SET_GRAD as _SET_GRAD, SET_STATE as _SET_STATE, STATE as _STATE,
                      _HostFailed, _NotFinite, _numbers, _reads, _result_slots)
from .rewrite import _all_finite
from ..engine.dispatch import note_fallback, registry
from ..ir.errors import PolygradError

#: the op name compiled-step fallbacks are reported under (events, warnings, ``pg.stats()``)
COMPILED_STEP = "compiled-step"
#: entries that may sit inside the region: they read state, or draw, but run no host code
#: (``Backward`` only fires an event, and with a listener a step replays through the interpreter)
_REGION_KINDS = frozenset({_LOAD, _ARG, _GRAD, _STATE, _KERNEL, _FUSED, _CALL, _FRESH, _ASSERT_FINITE, _BACKWARD})
#: the entries a compiled callable computes
_COMPUTED = (_KERNEL, _FUSED, _CALL)
#: the region's entries that read what the compiled callable needs, run on the host before it
_READS = (_LOAD, _ARG, _GRAD, _STATE, _FRESH)


class KernelProgram(NamedTuple):
    """What a backend compiles: ``entries`` (the step's ``Kernel``, ``Fused`` and ``Call`` program
    entries, in order), ``inputs`` (the slots they read that no entry of theirs writes: pass them in
    this order), ``outputs`` (the slots the rest of the step reads: return them in this order),
    ``meta`` (slot -> ``(backend, shape, dtype)``) and ``backend`` (the one backend all entries run on).

    A compiled callable is ``fn(*input_arrays, numbers) -> sequence of output arrays``: it must
    compute what calling each entry in order does (``Kernel``: ``tables[key](*inputs, **attrs)``
    into slot ``out``; ``Fused``: ``vjp_tables[key](*inputs, **kwargs)`` into ``outs``, -1 not
    wanted; ``Call``: ``fn(*inputs, *numbers[j], **attrs)`` into ``outs``, with ``numbers[j]`` the
    tuple of Python numbers polygrad computed on the host for the ``j``-th ``Call`` of this call:
    a compiler passes them as traced arguments, not constants), read nothing else that changes
    between calls, and write nothing (polygrad writes the results)."""
    entries: tuple
    inputs: tuple
    outputs: tuple
    meta: list
    backend: Any


def _writes(e: tuple) -> list[int]:
    if e[0] == _KERNEL:
        return [e[5]]
    if e[0] == _FUSED:
        return [s for s in e[5] if s >= 0]
    if e[0] == _CALL:
        return list(e[6])
    return []


def _inputs(e: tuple) -> tuple:
    return e[5] if e[0] == _CALL else e[3]


def kernel_region(cap: Any) -> tuple[int, int, KernelProgram] | None:
    """(first, end, program) of ``cap``'s kernel region, or None when it has none to offer."""
    program = cap.program
    kernels = [n for n, e in enumerate(program) if e[0] in _COMPUTED]
    if not kernels:
        return None
    first, end = kernels[0], kernels[-1] + 1
    region = program[first:end]
    if any(e[0] not in _REGION_KINDS for e in region):
        return None
    backends = {e[1] for e in region if e[0] in _COMPUTED}
    if len(backends) != 1:
        return None
    written: set[int] = set()
    inputs: list[int] = []
    for e in region:
        if e[0] in _COMPUTED:
            for slot in _inputs(e):
                if slot not in written and slot not in inputs:
                    inputs.append(slot)
            written.update(_writes(e))
    read_later = set(_result_slots(cap.spec))
    for e in region:
        if e[0] == _ASSERT_FINITE:
            read_later.add(e[1])
    for e in program[end:]:
        read_later.update(_reads(e))
    outputs = tuple(s for s in sorted(written) if s in read_later)
    entries = tuple(e for e in region if e[0] in _COMPUTED)
    return first, end, KernelProgram(entries, tuple(inputs), outputs, cap.meta, backends.pop())


def offer(cap: Any, fast: Callable | None, result: Callable, rebuild: Callable) -> Callable | None:
    """The replay function of ``cap``: ``fast`` as it is, or one running a backend's compiled
    kernel region (when a ``polygrad_compile_kernels`` implementation returns one).  ``result`` and
    ``rebuild`` are the executor's builders of the step's result and of gradient values."""
    hook = registry.pm.hook.polygrad_compile_kernels
    if fast is None or not hook.get_hookimpls():
        return fast
    found = kernel_region(cap)
    if found is None:
        return fast
    first, end, program = found
    try:
        compiled = hook(program=program, backend=program.backend)
        if compiled is not None and not callable(compiled):
            raise PolygradError(f"polygrad_compile_kernels returned {type(compiled).__name__}, not a callable")
    except Exception as exc:  # noqa: BLE001 - a broken compiler: the step replays as usual
        report(program.backend, exc)
        return fast
    if compiled is None:
        return fast
    return CompiledStep(cap, first, end, program, compiled, result, rebuild)


def report(be: Any, exc: BaseException) -> None:
    """A compiled step failed on backend ``be``: counted, warned once and reported like any fallback."""
    note_fallback(COMPILED_STEP, be.name, "-", exc, f"the compiled step of backend {be.name!r} failed with "
                  f"{type(exc).__name__}: {exc}; its kernels run one by one instead")


class CompiledStep:
    """A capture's replay with its kernel region run by a backend's compiled callable (signature
    of the executor's generated function: ``(flat, tables, vjp_tables) -> result``)."""

    def __init__(self, cap: Any, first: int, end: int, program: KernelProgram, compiled: Callable,
                 result: Callable, rebuild: Callable):
        self.cap, self.first, self.end, self.program = cap, first, end, program
        self.result, self.rebuild = result, rebuild
        self.compiled: Callable | None = compiled
        self.calls = 0      # times the compiled callable ran to completion (tests, benchmarks)
        # what each call runs, split once here rather than filtered on every call (a compiled
        # step's host side is per-call overhead the hand-written jax.jit loop does not have)
        region = cap.program[first:end]
        self._before = [*cap.program[:first], *(e for e in region if e[0] in _READS)]
        self._after = [*(e for e in region if e[0] == _ASSERT_FINITE), *cap.program[end:]]
        self._calls = [e for e in program.entries if e[0] == _CALL]
        self._shapes = [tuple(program.meta[slot][1]) for slot in program.outputs]

    def __call__(self, flat: list, tables: dict, vjp_tables: dict) -> Any:
        cap = self.cap
        buf: list = [None] * len(cap.meta)
        self._host_entries(self._before, buf, flat)
        numbers = [_numbers(e) for e in self._calls]  # host numbers, in program order
        if not self._run_compiled(buf, numbers):
            self._run_kernels(buf, tables, vjp_tables, numbers)
        self._host_entries(self._after, buf, flat)
        return self.result(cap.spec, buf, cap.meta, flat)

    def _run_compiled(self, buf: list, numbers: list) -> bool:
        compiled, program = self.compiled, self.program
        if compiled is None:
            return False
        be = program.backend
        try:
            outs = list(compiled(*[buf[s] for s in program.inputs], numbers))
            if len(outs) != len(self._shapes):
                raise PolygradError(f"the compiled step returned {len(outs)} arrays for {len(self._shapes)} outputs")
            for slot, array, shape in zip(program.outputs, outs, self._shapes):
                if tuple(be.shape(array)) != shape:
                    raise PolygradError(f"the compiled step returned shape {tuple(be.shape(array))} for slot "
                                        f"{slot}, the capture saw {shape}")
        except Exception as exc:  # noqa: BLE001 - reported; the kernels run one by one instead
            self.compiled = None
            report(be, exc)
            return False
        for slot, array in zip(program.outputs, outs):
            buf[slot] = array
        self.calls += 1
        return True

    def _run_kernels(self, buf: list, tables: dict, vjp_tables: dict, numbers: list) -> None:
        """The region kernel by kernel, with the host numbers already computed (a fault propagates:
        the call re-runs eagerly)."""
        meta = self.cap.meta
        calls = iter(numbers)
        for e in self.program.entries:
            be = e[1]
            if e[0] == _CALL:
                arrays = e.fn(*[buf[i] for i in e.inputs], *next(calls), **e.attrs)
                for slot, array in zip(e.outs, arrays):
                    if be.shape(array) != meta[slot][1]:
                        raise PolygradError(f"replayed call of {getattr(e.fn, '__qualname__', e.fn)} returned "
                                            f"shape {be.shape(array)}, the capture saw {meta[slot][1]}")
                    buf[slot] = array
            elif e[0] == _KERNEL:
                array = tables[be.name][e[2]](*[buf[i] for i in e[3]], **e[4])
                if be.shape(array) != e[6]:
                    raise PolygradError(f"replayed kernel for op '{e[2][0]}' returned shape {be.shape(array)}, "
                                        f"the capture saw {e[6]}")
                buf[e[5]] = array
            else:
                arrays = vjp_tables[be.name][e[2]](*[buf[i] for i in e[3]], **e[4])
                for slot, array in zip(e[5], arrays):
                    if slot >= 0:
                        if be.shape(array) != meta[slot][1]:
                            raise PolygradError(f"replayed fused backward of '{e[2][0]}' returned shape "
                                                f"{be.shape(array)}, the capture saw {meta[slot][1]}")
                        buf[slot] = array

    def _host_entries(self, entries: list, buf: list, flat: list) -> None:
        """The entries that are not kernels, as the executor's replay runs them."""
        meta = self.cap.meta
        for e in entries:
            kind = e[0]
            if kind == _LOAD:
                buf[e[1]] = e[2]._data
            elif kind == _ARG:
                buf[e[1]] = flat[e[2]]._data
            elif kind == _STATE:
                buf[e[1]] = e[2].state[e[3]][e[4]]
            elif kind == _SET_STATE:
                e[1].state[e[2]][e[3]] = buf[e[4]]
            elif kind == _GRAD:
                g = e[2].grad
                if g is None:
                    raise PolygradError("a gradient the capture accumulated into is gone")
                buf[e[1]] = g._data
            elif kind == _FRESH:
                buf[e[1]] = e[2]() if e[3] else e[2]()._data
            elif kind == _ASSERT_FINITE:
                if not _all_finite(buf[e[1]]):
                    raise _NotFinite()
            elif kind == _HOST:
                try:
                    e[1]()
                except Exception as exc:  # noqa: BLE001 - the optimizer's error is the user's
                    raise _HostFailed(exc) from exc
            elif kind == _SET_GRAD:
                t = flat[e[1]] if type(e[1]) is int else e[1]
                t.grad = self.rebuild(e[2], buf, meta)
            elif kind == _SET_DATA:
                t = flat[e[1]] if type(e[1]) is int else e[1]
                t._data = buf[e[2]]
            # BACKWARD only fires an event, and with a listener steps use the interpreter
