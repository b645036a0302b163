"""The backward pass over ``Value`` graphs: a topological order, then every node's local chain
rule, children before parents.

Kept apart from the :class:`~polygrad.engine.value.Value` class (which calls it from
``Value.backward`` and :func:`~polygrad.engine.value.backward_many`): a node stores only an integer
op code, its parents and at most one constant, and this loop turns the code back into its local
derivative, micrograd's expression for each op (see the value module's docstring).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from . import scalar_math as sm

if TYPE_CHECKING:
    from .value import Value

_NAN = math.nan
_log = math.log
_pow, _pow_special, _div = sm.pow, sm.pow_special, sm.div


def _dy_of_pow(x: Any, out: Any, y: Any) -> float:
    """d(x**y)/dy = x**y * log(x), defined for x > 0 (and as the limit 0 for x == 0, y >= 0)."""
    if x > 0:
        return out * _log(x)
    if x == 0:  # PyTorch: 0 for y >= 0 (the limit), out * log(0) = +-inf for y < 0
        return 0.0 if y >= 0 else out * -math.inf
    return _NAN


def _toposort(roots: Sequence[Value]) -> list[Value]:
    """Non-leaf nodes reachable from ``roots``, parents before children (iterative DFS).

    Post-order depth-first search with an explicit stack: a ``None`` pushed above a node means
    "this node's parents are done, emit it"; a node whose parents are all leaves or already
    visited is emitted at once, without the marker.  Parents are pushed in stored order, so the
    order is deterministic.  Leaves are never pushed (they have nothing to do in backward).

    "Visited" is a per-call token written into the ``_mark`` slot (cheaper than a ``set``:
    one attribute compare instead of hashing).  A node's mark only matters during this sort,
    so concurrent sorts of *disjoint* graphs, or of graphs sharing only leaves (parameters),
    are independent.  Two threads sorting through the same non-leaf node at the same time are
    not supported (their gradient accumulation would race anyway, as in micrograd).
    """
    order: list[Value] = []
    emit = order.append
    tok = object()
    stack: list[Any] = []
    push = stack.append
    pop = stack.pop
    for root in roots:
        if not root._code or root._mark is tok:
            continue
        push(root)
        while stack:
            v = pop()
            if v is None:
                emit(pop())
                continue
            if v._mark is tok:
                continue
            v._mark = tok
            c = v._code
            if c < 20:  # unary
                a = v._a
                if a._code and a._mark is not tok:
                    push(v)
                    push(None)
                    push(a)
                else:
                    emit(v)
            elif c < 40:  # binary
                a = v._a
                b = v._b
                if a._code and a._mark is not tok:
                    push(v)
                    push(None)
                    push(a)
                    if b._code and b._mark is not tok:
                        push(b)
                elif b._code and b._mark is not tok:
                    push(v)
                    push(None)
                    push(b)
                else:
                    emit(v)
            else:  # n-ary / custom
                push(v)
                push(None)
                for a in (v._arg if c == 40 else v._arg[1]):
                    if a._code and a._mark is not tok:
                        push(a)
    return order


def _run(order: Sequence[Value]) -> None:
    """Apply every node's local chain rule, children before parents (``order`` reversed)."""
    for v in reversed(order):
        c = v._code
        g = v.grad
        if c == 20:  # ADD
            v._a.grad += g
            v._b.grad += g
        elif c == 21:  # MUL
            a = v._a
            b = v._b
            a.grad += b.data * g
            b.grad += a.data * g
        elif c == 1:  # RELU: 0 at and below 0, 1 above -- and at NaN (PyTorch)
            v._a.grad += (not v.data <= 0) * g
        elif c == 40:  # SUM
            for a in v._arg:
                a.grad += g
        elif c == 2:  # MULC
            v._a.grad += v._arg * g
        elif c == 3:  # ADDC
            v._a.grad += g
        elif c == 4:  # POWC (micrograd: (c * x**(c-1)) * g)
            a = v._a
            k = v._arg
            if k == 0:  # x ** 0 is the constant 1: derivative 0, even at x == 0 (PyTorch)
                continue
            try:
                d = a.data ** (k - 1)
            except (ZeroDivisionError, OverflowError):
                d = _pow_special(a.data, k - 1)
            else:
                if d.__class__ is complex:
                    d = _NAN
            a.grad += (k * d) * g
        elif c == 22:  # SUB
            v._a.grad += g
            v._b.grad += -g
        elif c == 23:  # DIV: a * r with r = b**-1 (micrograd's graph, fused)
            a = v._a
            b = v._b
            a.grad += v._arg * g
            b.grad += (-1 * _pow(b.data, -2)) * (a.data * g)
        elif c == 5 or c == 6:  # NEG, RSUBC
            v._a.grad += -g
        elif c == 7:  # RDIVC: c * x**-1
            a = v._a
            a.grad += (-1 * _pow(a.data, -2)) * (v._arg * g)
        elif c == 8:  # TANH
            t = v.data
            v._a.grad += (1 - t * t) * g
        elif c == 9:  # EXP
            v._a.grad += v.data * g
        elif c == 10:  # LOG
            v._a.grad += _div(g, v._a.data)
        elif c == 11:  # SIGMOID
            s = v.data
            v._a.grad += (s * (1.0 - s)) * g
        elif c == 12:  # RECIP: d(1/x) = -(1/x)**2
            r = v.data
            v._a.grad += -(r * r) * g
        elif c == 24:  # POW with a Value exponent
            a = v._a
            b = v._b
            x = a.data
            y = b.data
            if y != 0:  # x ** 0 is the constant 1: derivative 0, even at x == 0 (PyTorch)
                a.grad += (y * _pow(x, y - 1)) * g
            b.grad += _dy_of_pow(x, v.data, y) * g
        elif c == 25:  # MAX
            a = v._a
            b = v._b
            x = a.data
            y = b.data
            if x > y:
                a.grad += g
            elif y > x:
                b.grad += g
            elif x == y:  # tie: split
                h = 0.5 * g
                a.grad += h
                b.grad += h
            else:  # a NaN: both get all of it (PyTorch)
                a.grad += g
                b.grad += g
        elif c == 13:  # MAXC
            a = v._a
            x = a.data
            y = v._arg
            if x > y:
                a.grad += g
            elif x == y:  # tie
                a.grad += 0.5 * g
            elif not y > x:  # a NaN (PyTorch: the whole gradient)
                a.grad += g
        elif c == 14:  # RPOWC: c ** x
            v._a.grad += _dy_of_pow(v._arg, v.data, v._a.data) * g
        elif c == 15:  # UNARY_FN: a unary op added with unary()
            v._a.grad += v._arg[1](v._a.data, v.data) * g
        elif c == 41:  # CUSTOM
            fn = v._arg[2]
            if fn is not None:
                fn()
