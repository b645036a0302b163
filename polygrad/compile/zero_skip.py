"""A program rewrite: an SpMM whose sparse values were just multiplied by a fresh random draw
(dropout on a sparse tensor's stored values) multiplies only the values that are not zero, in its
forward and in its fused backward's ``dX = Aᵀ dY``.

GCN's first layer is ``dropout(X) @ W`` with ``X`` sparse: dropout keeps ``X``'s pattern and
zeroes about half its values, and both products still walk every stored entry (Cora: 49k of
them, the two largest kernels of a compiled epoch).  Here the replay compacts the values once
per call (``values != 0``: a pattern of the kept entries, NaN kept) and both products use it.

Same bits, by the kernels' declaration: a backend SpMM kernel (or its fused backward, for ``dX``)
carrying ``polygrad_zero_terms = (kernel, dtypes)`` promises that for those result dtypes each
output element is a sequential sum starting at +0.0 in the pattern's order (numpy's scipy
kernels).  A dropped term is ``0 * x``, an exact zero when ``x`` is finite; adding an exact zero
leaves a sum unchanged, the accumulator never being -0.0 (it starts at +0.0, and a rounded sum is
-0.0 only when both addends are).  So where every element of the dense operand (``X W``'s ``W``,
the backward's ``dY``) is finite -- checked on each call -- the compacted product is the full one
bit for bit; where not (``0 * inf`` is NaN), or where the kernel called now is not the one that
declared it (a fault injector, another backend), the call runs the kernel on the full pattern,
exactly as the entry it replaces did.  Never a different number: the pass only chooses which of
two equal computations runs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from ..engine.dispatch import registry
from ..ir.ops import Op
from ..sparse.pattern import Pattern
from .program import CALL, FRESH, FUSED, KERNEL, Call, _dataflow
from .rewrite import _all_finite

_SPMM = (Op.SPMM, "csr")


def declared_dtypes(kernel: Any) -> frozenset:
    """The result dtypes for which ``kernel`` declares its rows sequential sums from +0.0 (empty
    when it declares nothing, or when the declaration was copied onto a wrapper)."""
    declared = getattr(kernel, "polygrad_zero_terms", None)
    if declared is None or declared[0] is not kernel:
        return frozenset()
    return frozenset(np.dtype(d) for d in declared[1])


class NonzeroEntries(NamedTuple):
    """The entries of a sparse matrix whose values are not zero: their pattern and values."""
    pattern: Pattern
    values: np.ndarray


def nonzero_entries(pattern: Pattern, values: np.ndarray) -> NonzeroEntries:
    """``values``' nonzero entries (NaN is not zero: it stays), rows and order kept."""
    kept = np.flatnonzero(values != 0)
    indptr = np.searchsorted(kept, pattern.indptr)  # kept entries before each row's first
    return NonzeroEntries(Pattern(pattern.shape, indptr, pattern.cols.take(kept), pattern.layout),
                          values.take(kept))


def _compact(values: Any, *, pattern: Pattern) -> tuple:
    """The compaction entry: ``(NonzeroEntries or None,)`` (None: not a host numpy vector)."""
    if type(values) is np.ndarray and values.ndim == 1 and values.shape[0] == pattern.nnz:
        return (nonzero_entries(pattern, values),)
    return (None,)


def _usable(sub: Any, kernel: Any, values: Any, dense: Any) -> bool:
    """Whether ``kernel`` on ``sub`` gives its bits on the full values: declared for the result
    dtype, and ``dense`` (what the values multiply) all finite."""
    return (sub is not None and type(dense) is np.ndarray
            and np.result_type(values.dtype, dense.dtype) in declared_dtypes(kernel) and _all_finite(dense))


@functools.lru_cache(maxsize=None)
def zero_skipping_spmm(backend_name: str) -> Callable[..., tuple]:
    """The call replacing backend ``backend_name``'s SpMM entry: ``(values, x, sub, *, pattern)
    -> (A @ x,)``; one function per backend name, so two captures of a step compare equal
    (``program._mismatch``)."""

    def spmm(values: Any, x: Any, sub: NonzeroEntries | None, *, pattern: Pattern) -> tuple:
        kernel = registry.tables[backend_name][_SPMM]  # what the replaced entry would call now
        if _usable(sub, kernel, values, x):
            assert sub is not None
            return (kernel(sub.values, x, pattern=sub.pattern),)
        return (kernel(values, x, pattern=pattern),)

    return spmm


@functools.lru_cache(maxsize=None)
def zero_skipping_spmm_dx(backend_name: str) -> Callable[..., tuple]:
    """The call replacing backend ``backend_name``'s fused SpMM backward when only ``dX`` is
    wanted: ``(g, values, x, sub, *, needs, pattern) -> (dX,)``."""

    def spmm_dx(g: Any, values: Any, x: Any, sub: NonzeroEntries | None, *, needs: tuple,
                pattern: Pattern) -> tuple:
        kernel = registry.vjp_tables[backend_name][_SPMM]
        if _usable(sub, kernel, values, g):
            assert sub is not None
            return (kernel(g, sub.values, x, needs=needs, pattern=sub.pattern)[1],)
        return (kernel(g, values, x, needs=needs, pattern=pattern)[1],)

    return spmm_dx


def _no_numbers() -> tuple:
    return ()


def skip_dropped_values(program: list, meta: list) -> tuple[list, list]:
    """``program`` (and ``meta``) with each SpMM whose values are a product with a fresh draw (a
    dropout mask) computed from the values' nonzero entries, compacted once per call, where its
    backend's kernel declares the result dtype (:func:`declared_dtypes`); likewise its fused
    backward where only ``dX`` is wanted and the backward kernel declares it too.  The compacted
    entries' slot has no fixed shape (``meta`` shape None: the executor checks none)."""
    _, producer = _dataflow(program)
    program, meta = list(program), list(meta)
    n = 0
    while n < len(program):
        e = program[n]
        n += 1
        if e[0] != KERNEL or e[2] != _SPMM:
            continue
        values, x = e[3]
        pattern, be = e[4].get("pattern"), e[1]
        dtype = np.result_type(meta[values][2], meta[x][2])
        if (not isinstance(pattern, Pattern) or meta[values][1] != (pattern.nnz,) or len(e[4]) != 1
                or dtype not in declared_dtypes(registry.tables.get(be.name, {}).get(_SPMM))):
            continue
        mul = producer.get(values)
        if mul is None or program[mul][0] != KERNEL or program[mul][2] != (Op.MUL, "dense"):
            continue
        if not any(program[producer[s]][0] == FRESH for s in program[mul][3] if s in producer):
            continue  # not a draw: zeros are not expected, the compaction would cost for nothing
        sub = len(meta)
        meta.append((be, None, None))
        program[n - 1] = Call(CALL, be, zero_skipping_spmm(be.name), {"pattern": pattern}, _no_numbers,
                              (values, x, sub), (e[5],))
        program.insert(n - 1, Call(CALL, be, _compact, {"pattern": pattern}, _no_numbers, (values,), (sub,)))
        n += 1
        vjp = registry.vjp_tables.get(be.name, {}).get(_SPMM)
        for m in range(n, len(program)):
            f = program[m]
            if (f[0] == FUSED and f[2] == _SPMM and f[3][1:] == (values, x) and f[4].get("pattern") is pattern
                    and set(f[4]) == {"needs", "pattern"} and tuple(f[4]["needs"]) == (False, True)
                    and f[5][0] < 0 and f[5][1] >= 0
                    and np.result_type(meta[values][2], meta[f[3][0]][2]) in declared_dtypes(vjp)):
                program[m] = Call(CALL, be, zero_skipping_spmm_dx(be.name), dict(f[4]), _no_numbers,
                                  (*f[3], sub), (f[5][1],))
        _, producer = _dataflow(program)
    return program, meta
