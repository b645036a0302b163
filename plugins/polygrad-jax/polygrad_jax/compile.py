"""The ``polygrad_compile_kernels`` hook for the jax backend: a captured step's kernels as one
``jax.jit`` function (see ``polygrad/compile/backend_compile.py`` for what polygrad keeps)."""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

import polygrad as pg
from polygrad.compile import Call, Fused, Kernel
from polygrad.ir.ops import Op
from polygrad.sparse.pattern import Pattern

from .backend import X64
from .kernels import pattern_arrays, spmm_transposed

try:  # JAX's conversion that gives a traced value the weak type a Python number passed to jax.jit has
    from jax._src.lax.lax import _convert_element_type as _weak_convert
except ImportError:  # pragma: no cover - a JAX without it: the host numbers go in one by one
    _weak_convert = None

#: the host numbers of a call, packed: one float64 and one int64 array (JAX narrows both to 32
#: bits without its 64-bit mode, as it does the Python numbers themselves)
_INT_RANGE = (-2 ** 63, 2 ** 63) if X64 else (-2 ** 31, 2 ** 31)


def compile_kernels(program: Any, backend: Any) -> Callable:
    """``jax.jit`` of the program's entries called in order (the kernels as the registry has them
    now, plugin overrides included; ``Call`` entries -- the optimizer's updates, dropout draws --
    traced with their host numbers as arguments, so a new learning rate or key is no new trace).

    The host numbers (dozens per step: each parameter's update has nine) go in packed into two
    arrays, one transfer each, instead of one scalar argument each (one transfer each per call:
    about a tenth of a compiled Cora GCN step); unpacked in the trace with the weak type JAX gives
    a Python number, so every operation on them has the dtype it has on the numbers themselves."""
    forward = pg.kernel_table(backend.name)
    fused = pg.kernel_table(backend.name, kind="vjp")
    transposed = _transposed_products(program.entries, forward)
    for e in program.entries:   # device index arrays made now, never cached as tracers
        for value in (e.kwargs if isinstance(e, Fused) else e.attrs).values():
            if isinstance(value, Pattern):
                pattern_arrays(value)
    for values, pattern in transposed.values():
        pattern_arrays(pattern)

    def run(arrays: Any, numbers: Any) -> list:
        calls = iter(numbers)
        buf = dict(zip(program.inputs, arrays))
        for n, e in enumerate(program.entries):
            if n in transposed:
                values, pattern = transposed[n]
                buf[e.out] = spmm_transposed(buf[values], buf[e.inputs[1]], pattern=pattern)
            elif isinstance(e, Kernel):
                buf[e.out] = forward[e.key](*[buf[i] for i in e.inputs], **e.attrs)
            elif isinstance(e, Call):
                buf.update(zip(e.outs, e.fn(*[buf[i] for i in e.inputs], *next(calls), **e.attrs)))
            else:
                grads = fused[e.key](*[buf[i] for i in e.inputs], **e.kwargs)
                for slot, g in zip(e.outs, grads):
                    if slot >= 0:
                        buf[slot] = g
        return [buf[s] for s in program.outputs]

    return PackedStep(run)


def _transposed_products(entries: tuple, forward: dict) -> dict[int, tuple[int, Pattern]]:
    """The SpMMs to run as a product with the transpose of a pattern: entry index -> (the slot of
    the pattern's own values, the pattern).

    A backward pass multiplies by ``A^T`` as ``getitem(values, perm)`` (the values in the
    transpose's order) then an SpMM over ``A.transpose()``: a gather of every value, then rows
    gathered in the transpose's (scattered) order.  When both are the registry's own jax kernels
    and ``perm`` is the pattern's transposition itself, the step computes the same product from
    ``A``'s values and pattern directly (``kernels.spmm_transposed``: rows read in order, summed
    into their columns): about a third less time for Cora's feature matrix on a CPU.  The gather
    stays in the program for any other reader (XLA drops it when there is none)."""
    made = {e.out: e for e in entries if isinstance(e, Kernel)}
    spmm, getitem = forward.get((Op.SPMM, "csr")), forward.get((Op.GETITEM, "dense"))
    from . import kernels
    if spmm is not kernels.spmm or getitem is not kernels.getitem:   # a plugin override: leave it alone
        return {}
    found: dict[int, tuple[int, Pattern]] = {}
    for n, e in enumerate(entries):
        if not isinstance(e, Kernel) or e.key != (Op.SPMM, "csr") or len(e.inputs) != 2:
            continue
        back = getattr(e.attrs.get("pattern"), "_transpose", None)
        gather = made.get(e.inputs[0])
        if back is None or back[1] is not None or gather is None or gather.key != (Op.GETITEM, "dense"):
            continue
        pattern = back[0]   # e's pattern is pattern.transpose(); is the gather pattern's permutation?
        index, forth = gather.attrs.get("index"), getattr(pattern, "_transpose", None)
        if (isinstance(index, tuple) and len(index) == 1 and forth is not None and forth[0] is e.attrs["pattern"]
                and forth[1] is not None and index[0] is forth[1]):
            found[n] = (gather.inputs[0], pattern)
    return found


class PackedStep:
    """``fn(*arrays, numbers)``: the jitted step, its host numbers packed by type (one compiled
    function per layout: which numbers are ints, how many each ``Call`` has; a layout it cannot
    pack -- a number neither float nor int, an int out of range -- goes in number by number)."""

    def __init__(self, run: Callable[[Any, Any], list]):
        self.run = run
        self.unpacked = jax.jit(run)
        self.packed: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> list:
        *arrays, numbers = args
        flat = [v for call in numbers for v in call]
        kinds = (tuple(map(len, numbers)), tuple(map(type, flat)))
        fn = self.packed.get(kinds)
        if fn is None:
            fn = self.packed[kinds] = self._packing(*kinds)
        if fn is self.unpacked:
            return fn(arrays, numbers)
        ints = [v for v, t in zip(flat, kinds[1]) if t is int]
        if ints and not _INT_RANGE[0] <= min(ints) <= max(ints) < _INT_RANGE[1]:
            return self.unpacked(arrays, numbers)
        floats = np.array([v for v, t in zip(flat, kinds[1]) if t is float], np.float64)
        return fn(arrays, floats, np.array(ints, np.int64))

    def _packing(self, lengths: tuple, types: tuple) -> Callable:
        """The jitted step for one layout of host numbers."""
        if _weak_convert is None or any(t is not float and t is not int for t in types):
            return self.unpacked
        where, counts = [], {float: 0, int: 0}
        for t in types:   # each number's (is it an int, its index in its array)
            where.append((t is int, counts[t]))
            counts[t] += 1
        run = self.run

        def packed(arrays: Any, floats: Any, ints: Any) -> list:
            flat = [_weak_convert(ints[i] if is_int else floats[i], None, weak_type=True) for is_int, i in where]
            numbers, start = [], 0
            for n in lengths:
                numbers.append(tuple(flat[start:start + n]))
                start += n
            return run(arrays, numbers)

        return jax.jit(packed)
