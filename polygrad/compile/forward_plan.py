"""Forward plans: the default ``pg.compile`` mode's op-by-op matcher.

In the default mode the step's Python runs every call and issues its ops through
:func:`polygrad.engine.dispatch.apply` as eagerly.  Most of what ``apply`` does per op is a pure function of
what the op is applied to -- the inference (output shape and dtype), the memory check, the kernel
lookup, whether a graph node is recorded and which inputs it keeps whole -- so it is recorded
once, as one :class:`Entry` per op in the order the call issued them (the *forward plan*), and each
later call's ops are matched against it:

* an op equal to the plan's next entry in everything those decisions read -- op, layout,
  attributes (with their types), each input's shape, dtype, backend, ``requires_grad`` and
  node/data state (which decides what the node keeps), and grad mode -- runs the entry's kernel
  (checked still to be the registry's; its small-output variant where it declares one, as pure
  mode's replay calls it) over this call's arrays and records the graph node with the entry's
  saved-input layout (:meth:`Cursor.run`, which ``apply`` asks first: before its own checks when
  no dtype promotion can apply, after the promotion otherwise); a kernel fault is handled exactly
  as eagerly (the same fallback policy);
* the first op that differs leaves the plan for the rest of the call: it and every later op run
  through the full eager ``apply`` and are recorded, and the plan becomes what this call issued.

Each entry's match-and-run is also generated as one Python function with the entry's values as
constants (:mod:`polygrad.compile.forward_fast`): the same comparisons and execution without the
generic loop; ``apply`` calls it directly, and it hands any op that differs to the generic matcher
(:meth:`Cursor.generic`).

The kernels, their arguments and their order are eager's by construction, so the numbers are
eager's bit for bit.  Ops issued while a pass is being captured (``_recording`` set: pure mode, or a
backward plan being recorded) are neither matched nor recorded.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from ..engine import graph
from ..engine.dispatch import EMPTY, KernelFault, _contradiction, _events, _grad_enabled, _tables, fallback
from ..engine.graph import Node, stand_in
from ..ir.errors import PolygradError
from ..ir.ops import Op, kernel_key
from ..runtime import memory
from ..tensor import Tensor
from .executor import _small
from .forward_fast import specialize

_data = operator.attrgetter("_data")
_make = Tensor._make

#: attribute value types an entry compares by ``==`` plus type (anything else -- an index array --
#: makes the entry a *slow* one: matched by op only, run through the full eager ``apply``)
_PLAIN = (int, float, str, bool, type(None), np.dtype)


def attr_types(attrs: dict) -> tuple | None:
    """The types of ``attrs``' values (a tuple's with its items' types), or None when one is not
    plain (1, 1.0 and True compare equal but a kernel may treat them differently)."""
    out: tuple = ()
    for v in attrs.values():
        tv = type(v)
        if tv is tuple:
            items = tuple(map(type, v))
            for ti in items:
                if not issubclass(ti, _PLAIN):
                    return None
            out += (tv, items)
        elif issubclass(tv, _PLAIN) or isinstance(v, np.dtype):
            out += (tv,)
        else:
            return None
    return out


def input_state(t: Any) -> int:
    """What ``graph.saved_inputs`` reads of an input besides the op: 3 its data is gone, 0 a leaf,
    1 a result whose op's gradient reads its output, 2 another result."""
    if t._data is None:
        return 3
    node = t._node
    if node is None:
        return 0
    return 1 if node.op in graph.reads_output else 2


def _same_attrs(e: Entry, attrs: dict) -> bool:
    """``attrs`` equal the entry's, value by value and type by type."""
    return attrs_equal(e.attrs, e.types, attrs)


def attrs_equal(recorded: dict, types: tuple | None, attrs: dict) -> bool:
    """``attrs`` equal ``recorded`` (whose :func:`attr_types` are ``types``), value by value and
    type by type."""
    try:
        if attrs != recorded:
            return False
    except Exception:  # noqa: BLE001 - an array attribute where the plan's is plain
        return False
    return attr_types(attrs) == types


class Entry:
    """One op of a forward plan: what it was applied to and the decisions ``apply`` made for it."""

    __slots__ = ("op", "layout", "attrs", "types", "grad", "kernel", "key", "be", "shape", "dtype",
                 "node", "keep", "slow", "refs", "recipes", "spec", "n", "be_name", "call", "bare", "stand",
                 "fast")

    def __init__(self, op: Op, layout: str, attrs: dict, inputs: tuple, grad: bool, kernel: Any,
                 result: Any, scalar: Any, refs: tuple | None) -> None:
        self.op = op
        #: where each input that requires grad came from in the call (Cursor.refs); None: from outside
        self.refs = refs
        #: the backward shortcuts of the graph ending at this entry's output (backward_plan.Recipe),
        #: by the leaves' state when backward was called
        self.recipes: list = []
        self.layout = layout
        self.attrs = attrs
        self.types = attr_types(attrs)
        #: per input, what Cursor.run compares: shape, dtype, backend, requires_grad, node/data state
        #: (input_state), and where it came from (its item of refs; None: no grad, or refs is None)
        self.spec = tuple((t.shape, t.dtype, t._be, t.requires_grad, input_state(t),
                           None if refs is None else refs[j]) for j, t in enumerate(inputs))
        self.n = len(inputs)
        self.be_name = result._be.name
        #: what run() calls: the kernel's small-output variant where it declares one for this
        #: output size (the same numbers: see compile.executor._small), without attrs when none
        self.call: Any = _small(kernel, math.prod(result.shape)) if kernel is not None else None
        self.bare = not attrs
        self.grad = grad
        self.kernel = kernel
        self.key = kernel_key(op, layout)
        self.be = result._be
        self.shape = result.shape
        self.dtype = result.dtype
        node = result._node
        self.node = node is not None
        #: per input: kept whole (True) or as a data-less stand-in; None: all whole
        self.keep = None if node is None else tuple(a is b for a, b in zip(node.inputs, inputs))
        if self.keep is not None and all(self.keep):
            self.keep = None
        #: the inputs the node keeps as stand-ins, by position
        self.stand = () if self.keep is None else tuple(j for j, k in enumerate(self.keep) if not k)
        # replayed only through the full apply: attributes it cannot compare, no table kernel, an
        # output the memory budget checks, a kernel that fell back
        self.slow = (self.types is None or kernel is None or scalar is not None
                     or memory.nbytes(self.shape, self.dtype) >= memory.CHECK_FLOOR)
        #: run() for this entry as one generated function (forward_fast), or None: the generic one
        self.fast = specialize(self, attrs_equal)


class Cursor:
    """One default-mode call's walk along its function's forward plan.

    ``pos`` is the next entry to match, or -1 once the call has left the plan; ``fresh`` is then
    the plan this call issues (the matched prefix, then every op recorded as it ran)."""

    __slots__ = ("plan", "pos", "fresh", "left_at", "token", "ops", "leaves", "leaf_ids", "whole")

    def __init__(self, plan: list) -> None:
        self.plan = plan
        self.pos = 0
        self.fresh: list | None = None
        self.left_at = -1  # the position the call left the plan at (-1: it did not)
        # the graph this call made, for the backward shortcut (backward_plan): each node an op of
        # this call made carries ``token`` and the op's position (Node.made_by, Node.made_at: no
        # reference from here, so a graph the step drops is freed as eagerly), ``ops`` counts the
        # ops so far, the leaves that require grad in the order the ops used them, and whether
        # every op's inputs came from the same positions and leaves as when its entry was recorded
        self.token = object()
        self.ops = 0
        self.leaves: list = []
        self.leaf_ids: dict[int, int] = {}
        self.whole = True

    def refs(self, inputs: tuple) -> tuple | None:
        """Where each input that requires grad comes from: ``(0, k)`` the output of this call's op
        ``k``, ``(1, n)`` its ``n``-th leaf; None when one comes from outside (another call's graph,
        an op run while a pass was captured)."""
        out: tuple | None = ()
        for t in inputs:
            if not t.requires_grad:
                if out is not None:
                    out += (None,)
                continue
            node = t._node
            if node is None:
                n = self.leaf_ids.get(id(t))
                if n is None:
                    n = self.leaf_ids[id(t)] = len(self.leaves)
                    self.leaves.append(t)
                if out is not None:
                    out += ((1, n),)
            elif node.made_by is not self.token:
                out = None  # the leaves after it are still numbered, for the next entries
            elif out is not None:
                out += ((0, node.made_at),)
        return out

    def produced(self, node: Any) -> None:
        """The node (or None) the op at the current position made."""
        if node is not None:
            node.made_by = self.token
            node.made_at = self.ops
        self.ops += 1

    def made(self, node: Any) -> int:
        """The position of the op of this call that made ``node`` (-1: none did)."""
        return node.made_at if node.made_by is self.token else -1

    def entry_at(self, k: int) -> Entry:
        """The entry of this call's ``k``-th op (on the plan or recorded)."""
        return self.plan[k] if self.pos >= 0 else self.fresh[k]  # type: ignore[index]

    @property
    def matched(self) -> int:
        """Entries this call walked along the plan (slow ones included) before leaving it."""
        return self.pos if self.pos >= 0 else self.left_at

    def run(self, op: Op, inputs: tuple, attrs: dict, layout: str) -> Any:
        """The result of this op run with the plan's next entry's decisions when the op equals it,
        else None: the call left the plan here, or the entry is a slow one (still on the plan); the
        caller runs the full ``apply``, which :meth:`record` s the op.  Called for every op of a
        default-mode call: the comparisons are inlined, the cheapest first."""
        pos = self.pos
        plan = self.plan
        if pos >= len(plan):
            return self._leave(pos)
        e = plan[pos]
        fast = e.fast
        if fast is not None:  # the same comparisons and execution, generated for this entry
            return fast(self, pos, op, inputs, attrs, layout)
        return self.generic(pos, op, inputs, attrs, layout)

    def generic(self, pos: int, op: Op, inputs: tuple, attrs: dict, layout: str) -> Any:
        """:meth:`run` for the entry at ``pos`` (< len(plan)) by the generic matcher: for entries
        without a generated function, and for those whose generated function found a difference
        (the decision to leave, and its side effects -- the leaves numbered on the way -- are then
        this matcher's)."""
        e = self.plan[pos]
        if e.op is not op or e.layout != layout or e.grad is not _grad_enabled.get() or e.n != len(inputs):
            return self._leave(pos)
        if e.slow:
            self.pos = pos + 1  # the same op, run through the full apply: still on the plan
            return None
        if attrs is not e.attrs and not _same_attrs(e, attrs):
            return self._leave(pos)
        whole = self.whole and e.refs is not None
        for t, (shape, dtype, be, rg, state, ref) in zip(inputs, e.spec):
            td = t.dtype
            if t.shape != shape or (td is not dtype and td != dtype) or t._be is not be or t.requires_grad != rg:
                break
            node = t._node
            if state:
                if t._data is None:
                    if state != 3:
                        break
                elif node is None:
                    break
                elif state != (1 if node.op in graph.reads_output else 2):
                    break
            elif node is not None or t._data is None:
                break
            if whole and ref is not None:
                if node is None:
                    n = self.leaf_ids.get(id(t))
                    if n is None:
                        n = self.leaf_ids[id(t)] = len(self.leaves)
                        self.leaves.append(t)
                    if ref[0] != 1 or ref[1] != n:
                        whole = False
                elif ref[0] != 0 or node.made_by is not self.token or node.made_at != ref[1]:
                    whole = False
        else:  # every input equal (no break)
            if _tables.get(e.be_name, EMPTY).get(e.key) is e.kernel:
                self.pos = pos + 1
                self.whole = whole
                return self._execute(e, op, inputs, attrs, layout)
            # the registry's kernel changed since the plan was recorded: leave (below)
        return self._leave(pos)

    def _leave(self, pos: int) -> None:
        """Leave the plan at entry ``pos``: this op and the rest of the call run the full ``apply``."""
        self.fresh = self.plan[:pos]
        self.left_at, self.pos = pos, -1

    def _execute(self, entry: Entry, op: Op, inputs: tuple, attrs: dict, layout: str) -> Any:
        """``apply`` for an op equal to its entry: the entry's inference, kernel and node layout,
        everything else as ``apply`` does it (a kernel fault takes the same fallback)."""
        first = inputs[0]
        be = first._be
        shape, dtype = entry.shape, entry.dtype
        scalar = None
        try:
            out = entry.call(*map(_data, inputs)) if entry.bare else entry.call(*map(_data, inputs), **attrs)
            if be.shape(out) != shape or be.dtype(out) != dtype:
                raise _contradiction(be, op, layout, out, shape, dtype)
        except KernelFault as exc:
            out, scalar = fallback(op, inputs, attrs, layout, shape, dtype, exc)
        except PolygradError:
            raise
        except Exception as exc:  # noqa: BLE001 - as in apply
            out, scalar = fallback(op, inputs, attrs, layout, shape, dtype, exc)
        result = _make(out, be, shape, dtype)
        if entry.node:
            result.requires_grad = True
            if entry.stand:
                listed = list(inputs)
                for j in entry.stand:
                    listed[j] = stand_in(listed[j])
                kept = tuple(listed)
            else:
                kept = inputs
            result._node = node = Node(op, kept, attrs, layout, be, scalar)
            node.made_by = self.token  # self.produced(node), inlined
            node.made_at = self.ops
        self.ops += 1
        ev = _events["polygrad_op_executed"]
        if ev is not None:
            ev(op=op.value, backend=be.name, layout=layout, inputs=inputs, output=result)
        return result

    def record(self, op: Op, layout: str, attrs: dict, inputs: tuple, grad: bool, kernel: Any,
               result: Any, scalar: Any) -> None:
        """An op the full ``apply`` ran: part of the plan this call issues once off the plan."""
        refs = self.refs(inputs)
        if refs is None:
            self.whole = False
        if self.pos < 0:
            assert self.fresh is not None
            self.fresh.append(Entry(op, layout, attrs, inputs, grad, kernel, result, scalar, refs))
        elif self.plan[self.pos - 1].refs != refs:  # a slow entry of the plan
            self.whole = False
        self.produced(result._node)

    def finished(self) -> list | None:
        """The plan the next call should match (None: keep the current one)."""
        if self.pos < 0:
            return self.fresh
        if self.pos < len(self.plan):
            return self.plan[:self.pos]
        return None
