"""``Value``: polygrad's micrograd-compatible scalar autograd engine.

Code written for micrograd's ``engine.Value`` runs unchanged on this class and computes the same
numbers: every forward value and every local derivative is evaluated with the *same Python
expression* micrograd uses (``a / b`` is ``a * b**-1``, ``-x`` is ``x * -1``, ``relu`` returns the
int ``0`` for negative inputs, ``grad`` starts as the int ``0`` ...), so forward values are
bit-for-bit identical.  Gradients are identical up to the order in which contributions are
summed into a node that feeds several consumers: micrograd visits parents in ``set`` order
(effectively random), polygrad in a fixed order, so such sums can differ in the last bit.

polygrad's core also builds its scalar reference and its scalar fallback out of ``Value``s, which
is why this module adds ``x ** y`` with a ``Value`` exponent, ``reciprocal``, ``maximum``,
``tanh``/``exp``/``log``/``sigmoid``, the n-ary :meth:`Value.sum_of` and :func:`backward_many`.

Design
------
*No closures, no reference cycles.*  micrograd stores a ``_backward`` closure on every node; the
closure references the node itself, so every node sits in a reference cycle (node -> closure ->
cell -> node).  Such graphs are only freed by CPython's cyclic garbage collector, which then spends
most of the training time (77-90% of a micrograd MLP step) traversing ever-growing heaps.  Here a
node stores only an integer op code, its parents and at most one small constant (``_arg``: the
exponent of ``x ** 2``, the ``c`` of ``x * c`` ...).  :meth:`Value.backward` computes each local
derivative from the parents' ``.data``, the node's own ``.data`` and that constant.  Graphs are
plain DAGs that reference counting frees the moment the last reference to the output goes away.

*Parents in slots, in order.*  A unary or binary node keeps its parents in the slots ``_a`` and
``_b`` (no per-node tuple: half the allocations, and half the objects the cyclic GC has to scan);
n-ary nodes (:meth:`Value.sum_of`) keep an ordered tuple.  :attr:`Value._parents` returns the
parents as an ordered tuple, :attr:`Value._prev` as the ``set`` micrograd's ``draw_dot`` expects.
``__slots__`` keeps every node small and attribute access fast.

*Iterative, deterministic topological sort.*  micrograd's recursive ``build_topo`` raises
``RecursionError`` on graphs deeper than ~1000 nodes; here an explicit-stack depth-first search
orders the graph (a chain of 1,000,000 operations backpropagates fine).  Parents are visited in
their stored order, so the order -- and therefore every floating-point accumulation -- is the same
on every run.  Leaves are never pushed on the stack: they need no processing of their own.
"Visited" is a per-sort token written into the node's ``_mark`` slot instead of a ``set`` of
nodes (no hashing; see :func:`_toposort` for what that means for threads).

*Constants are folded into the node.*  ``x + 2`` does not allocate a ``Value(2)`` leaf as
micrograd does; the constant lives in ``_arg`` (or is not needed at all).  Numbers are unchanged;
only ``_prev`` differs (it lists ``Value`` parents only), which changes what ``draw_dot`` shows.

Numerical conventions
---------------------
* Where micrograd (plain Python arithmetic) would raise ``ZeroDivisionError``/``OverflowError``
  or return a ``complex`` number, ``Value`` returns the IEEE-754 / numpy float64 result instead:
  ``Value(0.0) ** -1`` is ``inf``, ``Value(-8.0) ** 0.5`` is ``nan``, ``Value(0.0).log()`` is
  ``-inf``, ``Value(-1.0).log()`` is ``nan``, ``Value(1000.0).exp()`` is ``inf``.  The same holds
  inside ``backward`` (e.g. the derivative of ``sqrt`` at 0 is ``inf``).
* Operands are Values and numbers (Python's and numpy's).  Anything else -- another engine's
  ``Value``, a tensor, a list -- raises :class:`~polygrad.errors.DTypeError` (a ``TypeError``)
  naming its type, where micrograd would silently nest it (``Value(data=Value(...))``).
* ``relu``: derivative 0 at 0 (micrograd's convention).
* ``maximum``: on a tie (``a == b``) the gradient is split 0.5 / 0.5 between both operands (the
  symmetric subgradient: the mean of the one-sided derivatives, which is also what a central
  difference measures).  When a NaN is involved the result is NaN and both operands get the
  whole gradient (PyTorch's convention).  So ``x.relu()`` and ``x.maximum(0)`` differ at exactly 0 (gradient 0 vs 0.5).
* ``x ** y`` with a ``Value`` exponent: ``d/dx = y * x**(y-1)``, ``d/dy = x**y * log(x)``.
  ``log(x)`` is only evaluated for ``x > 0``; for ``x == 0`` and ``y >= 0`` the y-derivative is
  the limit 0, for ``x == 0`` and ``y < 0`` it is ``x**y * log(0)`` (``-inf``), and for ``x < 0``
  it is undefined and ``NaN`` is added to ``y.grad`` -- and to whatever ``y`` was computed from.
  ``d/dx`` of ``x ** 0`` is 0 everywhere, 0 included (PyTorch's convention).  ``x.grad`` is never poisoned by
  it.  Use a plain number exponent (``x ** 2``) when the exponent needs no gradient: then no
  y-derivative is computed at all.
* Gradients accumulate (``+=``) exactly like micrograd: call ``zero_grad`` (or set ``.grad = 0``)
  between steps.  :meth:`Value.backward` *sets* the output's grad to 1 first (micrograd);
  :func:`backward_many` *adds* the given seeds to the outputs' grads.
"""
from __future__ import annotations

import math
from functools import partial
from numbers import Number
from typing import Any, Callable, Iterable

import numpy as np

from polygrad.engine import scalar_math as sm
from polygrad.ir.errors import DTypeError, ShapeError
from polygrad.engine.value_backward import _run, _toposort

__all__ = ["Value", "backward_many"]

_NAN = math.nan
_log = math.log
_tanh = math.tanh

# ---------------------------------------------------------------------------------------------
# Op codes.  Ranges matter: 0 leaf, 1..19 unary (parent in _a), 20..39 binary (_a, _b),
# 40.. n-ary (parents tuple in _arg; custom nodes keep [op, parents, backward_fn] in _arg).
# The numeric values are spelled out as literals in the hot loops below; keep them in sync.
# ---------------------------------------------------------------------------------------------
LEAF = 0
RELU = 1      # relu(x)
MULC = 2      # x * c            _arg = c
ADDC = 3      # x + c / x - c    (no constant needed for the derivative)
POWC = 4      # x ** c           _arg = c
NEG = 5       # -x
RSUBC = 6     # c - x
RDIVC = 7     # c / x            _arg = c
TANH = 8
EXP = 9
LOG = 10
SIGMOID = 11
RECIP = 12    # 1 / x
MAXC = 13     # maximum(x, c)    _arg = c
RPOWC = 14    # c ** x           _arg = c
UNARY_FN = 15  # a unary op added with unary()   _arg = (name, derivative)
ADD = 20
MUL = 21
SUB = 22
DIV = 23      # a / b            _arg = b ** -1
POW = 24      # a ** b (b a Value)
MAX = 25      # maximum(a, b)
SUM = 40      # n-ary add        _arg = parents tuple
CUSTOM = 41   # Value(data, children, op) built by user code; _arg = [op, parents, backward]

_BINARY = 20
_NARY = 40

_OPNAMES = {
    RELU: "ReLU", MULC: "*", ADDC: "+", NEG: "neg", RSUBC: "-", RDIVC: "/", TANH: "tanh",
    EXP: "exp", LOG: "log", SIGMOID: "sigmoid", RECIP: "reciprocal", MAXC: "max",
    RPOWC: "**", ADD: "+", MUL: "*", SUB: "-", DIV: "/", POW: "**", MAX: "max", SUM: "sum",
}


# IEEE-754 results where Python arithmetic raises or goes complex: one definition, in scalar_math.
_pow, _pow_special, _div = sm.pow, sm.pow_special, sm.div
_exp_ieee, _log_ieee, _sigmoid = sm.exp, sm.log, sm.sigmoid


_new = object.__new__

# The constants a Value computes with: Python and numpy numbers.  Anything else -- micrograd's own
# Value, a tensor, a list -- would end up *inside* ``.data`` (``Value(data=Value(...))``) and fail
# far away, so it is refused where it meets a Value.  The hot paths test ``x.__class__ is not
# float and x.__class__ is not int`` inline (two identity checks, ~5 ns) before calling this.


def _check_constant(x: Any, op: str) -> None:
    if isinstance(x, (Number, np.generic)):
        return
    raise DTypeError(f"polygrad Value ({op}): got a {type(x).__module__}.{type(x).__qualname__}; a Value computes "
                     "with polygrad Values and numbers only. Convert the other operand (float(x), or "
                     "Value(x.data) for another engine's Value) instead of nesting two autograd engines")


class Value:
    """A scalar in a define-by-run autograd graph (micrograd's ``Value``, without closures).

    ``Value(data, _children=(), _op='')`` creates a leaf.  Passing ``_children`` creates a custom
    node the way micrograd extensions do; assign its ``_backward`` (a zero-argument callable)
    to give it a derivative.
    """

    __slots__ = ("data", "grad", "_a", "_b", "_code", "_arg", "_mark", "__weakref__")

    data: Any
    grad: Any
    _a: "Value"  # first parent (unary and binary nodes); unset on leaves
    _b: "Value"  # second parent (binary nodes)
    _code: int  # the op code above
    _arg: Any  # per code: a constant, a parents tuple, (name, derivative), or [op, parents, backward]
    _mark: Any  # the token of the last topological sort that visited this node

    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "") -> None:
        if data.__class__ is not float and data.__class__ is not int:
            _check_constant(data, "Value()")
        self.data = data
        self.grad = 0
        self._mark = None
        if _children:
            self._code = CUSTOM
            self._arg = [_op, tuple(_children), None]
        else:
            self._code = LEAF
            self._arg = _op

    # -- introspection (micrograd compatibility) ----------------------------------------------
    @property
    def _op(self) -> str:
        """The op that produced this node (micrograd's tags: ``'+'``, ``'*'``, ``'**2'``, ``'ReLU'``)."""
        c = self._code
        if c == LEAF:
            return self._arg
        if c == CUSTOM:
            return self._arg[0]
        if c == POWC:
            return f"**{self._arg}"
        if c == UNARY_FN:
            return self._arg[0]
        return _OPNAMES[c]

    @property
    def _parents(self) -> tuple["Value", ...]:
        """The ``Value`` parents of this node, in order (duplicates kept: ``a * a`` -> ``(a, a)``)."""
        c = self._code
        if c == LEAF:
            return ()
        if c < _BINARY:
            return (self._a,)
        if c < _NARY:
            return (self._a, self._b)
        if c == SUM:
            return self._arg
        return self._arg[1]

    @property
    def _prev(self) -> set["Value"]:
        """The parents as a ``set`` (what micrograd stores, and what ``draw_dot`` walks)."""
        return set(self._parents)

    @property
    def _backward(self) -> Callable[[], None]:
        """A callable that applies this node's local chain rule once (micrograd's ``_backward``).

        Built on demand (nothing is stored, so no cycle).  Assigning a callable makes this node a
        custom node whose derivative is that callable (micrograd-extension style).
        """
        if self._code == CUSTOM:
            fn = self._arg[2]
            return fn if fn is not None else _noop
        return partial(_run, (self,))

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        if self._code != CUSTOM:
            parents = self._parents
            self._arg = [self._op, parents, None]
            self._code = CUSTOM
        self._arg[2] = fn

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"

    # -- binary arithmetic ---------------------------------------------------------------------
    def __add__(self, other: Any) -> "Value":
        out = _new(Value)
        if other.__class__ is Value or isinstance(other, Value):
            out.data = self.data + other.data
            out._b = other
            out._code = 20  # ADD
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "+")
            out.data = self.data + other
            out._code = 3  # ADDC
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    __radd__ = __add__

    def __mul__(self, other: Any) -> "Value":
        out = _new(Value)
        if other.__class__ is Value or isinstance(other, Value):
            out.data = self.data * other.data
            out._b = other
            out._code = 21  # MUL
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "*")
            out.data = self.data * other
            out._arg = other
            out._code = 2  # MULC
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    __rmul__ = __mul__

    def __sub__(self, other: Any) -> "Value":
        out = _new(Value)
        if other.__class__ is Value or isinstance(other, Value):
            out.data = self.data - other.data
            out._b = other
            out._code = 22  # SUB
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "-")
            out.data = self.data - other
            out._code = 3  # ADDC
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    def __rsub__(self, other: Any) -> "Value":
        if other.__class__ is not float and other.__class__ is not int:
            _check_constant(other, "-")
        out = _new(Value)
        out.data = other - self.data
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 6  # RSUBC
        return out

    def __truediv__(self, other: Any) -> "Value":
        out = _new(Value)
        if other.__class__ is Value or isinstance(other, Value):
            r = _pow(other.data, -1)
            out.data = self.data * r        # micrograd: self * other**-1
            out._b = other
            out._arg = r
            out._code = 23  # DIV
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "/")
            r = _pow(other, -1)
            out.data = self.data * r
            out._arg = r
            out._code = 2  # MULC
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    def __rtruediv__(self, other: Any) -> "Value":
        if other.__class__ is not float and other.__class__ is not int:
            _check_constant(other, "/")
        out = _new(Value)
        out.data = _pow(self.data, -1) * other  # micrograd: other * self**-1
        out.grad = 0
        out._mark = None
        out._a = self
        out._arg = other
        out._code = 7  # RDIVC
        return out

    def __pow__(self, other: Any) -> "Value":
        out = _new(Value)
        if other.__class__ is Value or isinstance(other, Value):
            out.data = _pow(self.data, other.data)
            out._b = other
            out._code = 24  # POW
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "**")
            try:
                out.data = self.data ** other
            except (ZeroDivisionError, OverflowError):
                out.data = _pow_special(self.data, other)
            else:
                if out.data.__class__ is complex:
                    out.data = _NAN
            out._arg = other
            out._code = 4  # POWC
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    def __rpow__(self, other: Any) -> "Value":
        if other.__class__ is not float and other.__class__ is not int:
            _check_constant(other, "**")
        out = _new(Value)
        out.data = _pow(other, self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._arg = other
        out._code = 14  # RPOWC
        return out

    def maximum(self, other: Any) -> "Value":
        """Elementwise max; on a tie the gradient is split 0.5 / 0.5 (see module docstring)."""
        out = _new(Value)
        a = self.data
        if other.__class__ is Value or isinstance(other, Value):
            b = other.data
            out._b = other
            out._code = 25  # MAX
        else:
            if other.__class__ is not float and other.__class__ is not int:
                _check_constant(other, "maximum")
            b = other
            out._arg = other
            out._code = 13  # MAXC
        if a > b or a == b:
            out.data = a
        elif b > a:
            out.data = b
        else:
            out.data = _NAN
        out.grad = 0
        out._mark = None
        out._a = self
        return out

    # -- unary ---------------------------------------------------------------------------------
    def __neg__(self) -> "Value":
        out = _new(Value)
        out.data = -self.data
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 5  # NEG
        return out

    def relu(self) -> "Value":
        out = _new(Value)
        d = self.data
        out.data = 0 if d < 0 else d
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 1  # RELU
        return out

    def tanh(self) -> "Value":
        out = _new(Value)
        out.data = _tanh(self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 8  # TANH
        return out

    def exp(self) -> "Value":
        out = _new(Value)
        out.data = _exp_ieee(self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 9  # EXP
        return out

    def log(self) -> "Value":
        """Natural log; ``-inf`` at 0 and ``nan`` for negative inputs (IEEE, like numpy)."""
        out = _new(Value)
        out.data = _log_ieee(self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 10  # LOG
        return out

    def sigmoid(self) -> "Value":
        """Logistic function, evaluated without overflow for large negative inputs."""
        out = _new(Value)
        out.data = _sigmoid(self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 11  # SIGMOID
        return out

    def reciprocal(self) -> "Value":
        """``1 / x`` (one node; ``inf`` at 0).  Derivative ``-1 / x**2`` = ``-out**2``."""
        out = _new(Value)
        out.data = _div(1.0, self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 12  # RECIP
        return out

    # -- n-ary ---------------------------------------------------------------------------------
    @staticmethod
    def sum_of(items: Iterable[Any]) -> "Value":
        """Sum of ``items`` (Values and/or numbers) as ONE n-ary add node.

        The data is accumulated left to right starting from ``0``, exactly like the builtin
        ``sum(items)`` over Values, so ``Value.sum_of(xs).data == sum(xs).data`` and the gradients
        agree; but the graph is one node deep instead of ``len(xs)`` nodes, so it builds and
        backpropagates several times faster.  With no ``Value`` among ``items`` the result is a
        leaf holding the plain sum.
        """
        parents: list[Value] = []
        push = parents.append
        total: Any = 0
        for v in items:
            if isinstance(v, Value):
                total = total + v.data
                push(v)
            else:
                if v.__class__ is not float and v.__class__ is not int:
                    _check_constant(v, "sum_of")
                total = total + v
        out = _new(Value)
        out.data = total
        out.grad = 0
        out._mark = None
        if parents:
            out._arg = tuple(parents)
            out._code = 40  # SUM
        else:
            out._arg = ""
            out._code = 0  # LEAF
        return out

    # -- autodiff ------------------------------------------------------------------------------
    def backward(self) -> None:
        """Backpropagate from this node: set ``self.grad = 1``, then accumulate into every
        ancestor's ``.grad`` (micrograd semantics: grads are *added*, never reset)."""
        order = _toposort((self,))
        self.grad = 1
        _run(order)


def _noop() -> None:
    return None


def unary(name: str, forward: Callable[[Any], Any], derivative: Callable[[Any, Any], Any]) -> None:
    """Give ``Value`` a new unary op in one place: ``x.<name>()`` is ``forward(x.data)``, and its
    backward adds ``derivative(x.data, out.data) * grad`` to ``x.grad``.

    This is how a new primitive op gets its scalar meaning (the reference, the scalar backend and
    the fallback then use it by name).  The ops above are spelled out by hand only because they
    are micrograd's hot path; a new op costs one dictionary-free branch in :func:`_run`.
    """
    if hasattr(Value, name):
        raise ValueError(f"Value already has an attribute {name!r}")
    arg = (name, derivative)

    def op(self: Value) -> Value:
        out = _new(Value)
        out.data = forward(self.data)
        out.grad = 0
        out._mark = None
        out._a = self
        out._code = 15  # UNARY_FN
        out._arg = arg
        return out

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}(x)`` (added with polygrad.engine.value.unary)."
    setattr(Value, name, op)


unary("expm1", sm.expm1, lambda x, out: sm.exp(x))


def backward_many(outputs: Iterable[Value], grads: Iterable[Any]) -> None:
    """Backpropagate several outputs at once.

    Each ``outputs[i].grad`` is increased by ``float(grads[i])`` (a seed, *added*: an output that
    is also an ancestor of another output gets both its seed and the flow from below), then the
    union graph is swept once in a deterministic reverse topological order, accumulating into
    every ancestor's ``.grad``.  Equivalent to -- but one pass instead of -- backpropagating
    ``sum(g_i * out_i)``.

    Raises :class:`~polygrad.errors.ShapeError` when the two sequences differ in length and
    :class:`~polygrad.errors.DTypeError` when an output is not a ``Value``.
    """
    outs = tuple(outputs)
    seeds = tuple(grads)
    if len(outs) != len(seeds):
        raise ShapeError(
            f"backward_many: got {len(outs)} outputs but {len(seeds)} gradients; "
            "expected one gradient per output"
        )
    for i, o in enumerate(outs):
        if not isinstance(o, Value):
            raise DTypeError(
                f"backward_many: outputs[{i}] is {type(o).__name__}, expected a polygrad Value"
            )
    order = _toposort(outs)
    for o, g in zip(outs, seeds):
        o.grad += float(g)
    _run(order)
