"""A program-to-program pass: a fused cross-entropy kernel replayed as its own primitive steps, with
eager's bits and without the backward's recomputation of the forward.

``Op.CROSS_ENTROPY``'s kernel and fused backward on the numpy backend are
:mod:`polygrad.engine.cross_entropy`'s steps run over the kernels dispatch runs
(``backends/cross_entropy_kernels.py``): about a dozen small kernel calls each, every one through
a Python method, a table lookup and the kernel's size check.  The backward also recomputes the
forward's ``x - max``, ``exp`` and row sums.  On Cora's ``[140, 7]`` training logits the two
kernels took ~120 us per step (a replay's largest cost after the sparse products), their steps'
kernels alone ~65 us.

Where a backend's kernel says it is those steps over the kernels dispatch runs (its
``polygrad_steps`` attribute: a ``Steps`` object whose ``follows_dispatch_of`` names the
backend), this pass writes the steps into the program as :class:`Kernel` entries: the executor
then calls each kernel directly (its small-output variant where it declares one), and a step the
backward repeats -- the same kernel on the same slots with the same attributes -- reads the
forward's slot instead of running again.

Why the bits are eager's: eager's fused kernel makes these kernel calls, in this order (and the
shared ones again), on arrays with the same values (each slot is written once; polygrad's kernels
are deterministic), and the kernels are looked up where dispatch looks them up
(``registry.tables``, read when a replay starts). Just before the first inlined steps a replay
checks that the cross-entropy kernels and every step's kernel in the tables are still the ones
inlined (a kernel replaced after the capture, or a fault injected into it, runs eagerly: a step the
backward shares with the forward is the same call only while its kernel is the stock, deterministic
one). Only entries before any non-idempotent host call (an optimizer step) are inlined: after it a
failing kernel is recomputed in place through the fallback chain, which must see the fused op.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..engine import cross_entropy
from ..engine.inference import infer
from ..ir.errors import PolygradError
from ..ir.ops import Op
from ..runtime.registry import registry
from ..tensor import Tensor
from .program import CALL, FUSED, HOST, KERNEL, LOAD, Call, Kernel, Load

CROSS_ENTROPY = (Op.CROSS_ENTROPY, "dense")


class _StaleKernel(PolygradError):
    """A kernel the inlined steps stand for is no longer the registry's (the replay is a fault)."""


class _DtypeOf:
    """What a ``Steps.const`` reads of its ``like`` argument: the dtype."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype


def _no_numbers() -> tuple:
    return ()


def _kernels_unchanged(*, expected: tuple) -> tuple:
    """Fault the replay (the call runs eagerly) unless every ``(vjp, backend, key, kernel)`` is
    still what the registry's tables hold: the inlined steps stand for that kernel only."""
    for vjp, name, key, kernel in expected:
        table = (registry.vjp_tables if vjp else registry.tables).get(name, {})
        if table.get(key) is not kernel:
            raise _StaleKernel(f"kernel {key[0].value} of backend {name!r} changed since the capture")
    return ()


def _steps_of(be: Any, vjp: bool) -> Any:
    """``(kernel, steps)``: the backend's cross-entropy kernel (``vjp``: its fused backward) and the
    ``Steps`` it runs, when it declares them (``kernel.polygrad_steps = (kernel, steps)``) and they
    call the kernels dispatch runs; else None (it stays one entry)."""
    table = (registry.vjp_tables if vjp else registry.tables).get(be.name, {})
    kernel = table.get(CROSS_ENTROPY)
    declared = getattr(kernel, "polygrad_steps", None)  # (the kernel itself, its steps)
    if (not isinstance(declared, tuple) or len(declared) != 2 or declared[0] is not kernel
            or getattr(declared[1], "follows_dispatch_of", None) != be.name):
        return None
    return declared


class _Ref(NamedTuple):
    """A step's array while the steps are written: its slot, and the shape and dtype they read."""
    slot: int
    shape: tuple
    dtype: np.dtype


class _Emitter:
    """:class:`polygrad.engine.cross_entropy.Steps` over slots: each step appends a :class:`Kernel`
    entry to ``out`` (shape and dtype from the op's inference), unless the same kernel already ran
    on the same slots with the same plain attributes (then its slot is the answer)."""

    def __init__(self, be: Any, meta: list, out: list, memo: dict, steps: Any, tables: dict) -> None:
        self.be, self.meta, self.out, self.memo, self.steps = be, meta, out, memo, steps
        self.tables = tables  # the backend's forward kernels: every step's key must be there

    def ref(self, slot: int) -> _Ref:
        return _Ref(slot, self.meta[slot][1], self.meta[slot][2])

    def _run(self, op: Op, *refs: _Ref, **attrs: Any) -> _Ref:
        key = (op, "dense")
        if key not in self.tables:
            raise LookupError(key)
        ins = tuple(r.slot for r in refs)
        sig = _signature(key, ins, attrs)
        if sig is not None and sig in self.memo:
            return self.ref(self.memo[sig])
        shape, dtype = infer(op, tuple(r.shape for r in refs), tuple(r.dtype for r in refs), attrs)
        slot = len(self.meta)
        self.meta.append((self.be, tuple(shape), np.dtype(dtype)))
        self.out.append(Kernel(KERNEL, self.be, key, ins, attrs, slot, tuple(shape)))
        if sig is not None:
            self.memo[sig] = slot
        return self.ref(slot)

    def neg(self, x: _Ref) -> _Ref: return self._run(Op.NEG, x)
    def add(self, a: _Ref, b: _Ref) -> _Ref: return self._run(Op.ADD, a, b)
    def mul(self, a: _Ref, b: _Ref) -> _Ref: return self._run(Op.MUL, a, b)
    def maximum(self, a: _Ref, b: _Ref) -> _Ref: return self._run(Op.MAXIMUM, a, b)
    def lt(self, a: _Ref, b: _Ref) -> _Ref: return self._run(Op.LT, a, b)
    def where(self, c: _Ref, a: _Ref, b: _Ref) -> _Ref: return self._run(Op.WHERE, c, a, b)
    def exp(self, x: _Ref) -> _Ref: return self._run(Op.EXP, x)
    def log(self, x: _Ref) -> _Ref: return self._run(Op.LOG, x)
    def reciprocal(self, x: _Ref) -> _Ref: return self._run(Op.RECIPROCAL, x)
    def sum(self, x: _Ref, axes: tuple, keepdims: bool) -> _Ref:
        return self._run(Op.SUM, x, axes=axes, keepdims=keepdims)
    def max(self, x: _Ref, axes: tuple, keepdims: bool) -> _Ref:
        return self._run(Op.MAX, x, axes=axes, keepdims=keepdims)
    def getitem(self, x: _Ref, index: tuple) -> _Ref: return self._run(Op.GETITEM, x, index=index)
    def index_add(self, x: _Ref, index: tuple, shape: tuple) -> _Ref:
        return self._run(Op.INDEX_ADD, x, index=index, shape=shape)
    def expand(self, x: _Ref, shape: tuple) -> _Ref: return self._run(Op.EXPAND, x, shape=shape)
    def reshape(self, x: _Ref, shape: tuple) -> _Ref: return self._run(Op.RESHAPE, x, shape=shape)
    def detached(self, x: _Ref) -> _Ref: return x

    def const(self, like: _Ref, value: float) -> _Ref:
        """The backend's own 0-d constant (the fused kernel's ``Steps.const``), loaded by the replay."""
        dtype = np.dtype(like.dtype)
        array = self.steps.const(_DtypeOf(dtype), value)
        slot = len(self.meta)
        self.meta.append((self.be, (), dtype))
        self.out.append(Load(LOAD, slot, Tensor._make(array, self.be, (), dtype)))
        return self.ref(slot)


def _signature(key: tuple, ins: tuple, attrs: dict) -> tuple | None:
    """A hashable identity of a kernel call whose attributes are plain values (None: not shared)."""
    items = tuple(sorted(attrs.items()))
    try:
        hash(items)
    except TypeError:
        return None
    if any(isinstance(v, np.ndarray) for _, v in items):
        return None
    return key, ins, items


def _inline(e: tuple, meta: list, memo: dict, tables: dict, steps: Any) -> list | None:
    """The entries that replace ``e`` (a cross-entropy kernel or fused backward), or None."""
    be = e[1]
    out: list = []
    emit = _Emitter(be, meta, out, memo, steps, tables)
    snapshot = dict(memo)
    try:
        if e[0] == KERNEL:
            target, reduction, dest = e[4]["target"], e[4]["reduction"], e[5]
            result = cross_entropy.loss(emit.ref(e[3][0]), target, reduction, emit).slot
        else:
            kw = e[4]
            if tuple(kw.get("needs", ())) != (True,) or len(e[5]) != 1 or e[5][0] < 0:
                return None
            target, reduction, dest = kw["target"], kw["reduction"], e[5][0]
            g, x = e[3]
            result = cross_entropy.logits_grad(emit.ref(g), emit.ref(x), target, reduction, emit).slot
    except Exception:  # noqa: BLE001 - a step this pass cannot write (inference refused, no kernel): keep the entry
        memo.clear()
        memo.update(snapshot)
        return None
    made = [n for n, f in enumerate(out) if f[0] == KERNEL and f[5] == result]
    if not made or meta[result][1:] != meta[dest][1:]:
        memo.clear()
        memo.update(snapshot)
        return None
    # the last step writes the entry's own slot, which later entries read
    out[made[0]] = out[made[0]]._replace(out=dest)
    for sig, slot in list(memo.items()):
        if slot == result:
            memo[sig] = dest
    return out


def _inline_cross_entropy(program: list, meta: list, spec: tuple) -> tuple[list, list]:
    """``program`` with each inlinable cross-entropy kernel and fused backward written as its steps
    (module docstring), or unchanged."""
    if not any(e[0] in (KERNEL, FUSED) and e[2] == CROSS_ENTROPY for e in program):
        return program, meta
    meta = list(meta)
    out: list = []
    memo: dict = {}
    expected: list[tuple] = []
    stepped = False
    backend: Any = None
    first = -1  # where the first inlined entry's steps start in ``out``
    for e in program:
        if e[0] == HOST and not e[2]:
            stepped = True
        if stepped or e[0] not in (KERNEL, FUSED) or e[2] != CROSS_ENTROPY:
            out.append(e)
            continue
        vjp = e[0] == FUSED
        found = _steps_of(e[1], vjp)
        replaced = None
        if found is not None:
            replaced = _inline(e, meta, memo, registry.tables.get(e[1].name, {}), found[1])
        if replaced is None:
            out.append(e)
            continue
        backend = e[1] if backend is None else backend
        first = len(out) if first < 0 else first
        if not any(x[:3] == (vjp, e[1].name, CROSS_ENTROPY) for x in expected):
            expected.append((vjp, e[1].name, CROSS_ENTROPY, found[0]))
        # and every step's kernel: the backward reads the forward's exp and sums where eager's
        # calls them again, the same only while the kernels are the stock, deterministic ones (a
        # fault injected into exp for one call hit eager's second call and the replay's none)
        table = registry.tables.get(e[1].name, {})
        for f in replaced:
            if f[0] == KERNEL and not any(x[:3] == (False, e[1].name, f[2]) for x in expected):
                expected.append((False, e[1].name, f[2], table.get(f[2])))
        out += replaced
    if not expected:
        return program, meta
    # the check sits just before the first inlined steps: inside the step's kernel region, which a
    # backend that compiles it (backend_compile.py) takes whole, and before any optimizer step
    guard = Call(CALL, backend, _kernels_unchanged, {"expected": tuple(expected)}, _no_numbers, (), ())
    return [*out[:first], guard, *out[first:]], meta
