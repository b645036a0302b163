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
  (checked still to be the registry's) over this call's arrays and records the graph node with
  the entry's saved-input layout (``dispatch._run_planned``); a kernel fault is handled exactly
  as eagerly (the same fallback policy);
* the first op that differs leaves the plan for the rest of the call: it and every later op run
  through the full eager ``apply`` and are recorded, and the plan becomes what this call issued.

The kernels, their arguments and their order are eager's by construction, so the numbers are
eager's bit for bit.  Ops issued while a pass is being captured (``_recording`` set: pure mode, or a
backward plan being recorded) are neither matched nor recorded.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..engine import graph
from ..runtime import memory
from ..ir.ops import Op, kernel_key

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
    try:
        if attrs != e.attrs:
            return False
    except Exception:  # noqa: BLE001 - an array attribute where the plan's is plain
        return False
    return attr_types(attrs) == e.types


class Entry:
    """One op of a forward plan: what it was applied to and the decisions ``apply`` made for it."""

    __slots__ = ("op", "layout", "attrs", "types", "ins", "grad", "kernel", "key", "be", "shape", "dtype",
                 "node", "keep", "slow", "refs", "recipes")

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
        self.ins = tuple((t.shape, t.dtype, t._be, t.requires_grad, input_state(t)) for t in inputs)
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
        # replayed only through the full apply: attributes it cannot compare, no table kernel, an
        # output the memory budget checks, a kernel that fell back
        self.slow = (self.types is None or kernel is None or scalar is not None
                     or memory.nbytes(self.shape, self.dtype) >= memory.CHECK_FLOOR)


class Cursor:
    """One default-mode call's walk along its function's forward plan.

    ``pos`` is the next entry to match, or -1 once the call has left the plan; ``fresh`` is then
    the plan this call issues (the matched prefix, then every op recorded as it ran)."""

    __slots__ = ("plan", "pos", "fresh", "left_at", "made", "index", "leaves", "leaf_ids", "whole")

    def __init__(self, plan: list) -> None:
        self.plan = plan
        self.pos = 0
        self.fresh: list | None = None
        self.left_at = -1  # the position the call left the plan at (-1: it did not)
        # the graph this call made, for the backward shortcut (backward_plan): each op's node
        # (weakly: a graph the step drops is freed as eagerly), by position and by id, the leaves
        # that require grad in the order the ops used them, and whether every op's inputs came
        # from the same positions and leaves as when its entry was recorded
        self.made: list = []
        self.index: dict[int, int] = {}
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
            else:
                k = self.index.get(id(node))
                if k is None or self.made[k]() is not node:  # (an id of a node since freed)
                    out = None  # the leaves after it are still numbered, for the next entries
                elif out is not None:
                    out += ((0, k),)
        return out

    def _same_refs(self, inputs: tuple, refs: tuple | None) -> bool:
        """Whether :meth:`refs` of ``inputs`` would equal ``refs`` (new leaves are numbered)."""
        if refs is None:
            return False
        for t, r in zip(inputs, refs):
            if r is None:  # no grad (requires_grad was matched)
                continue
            node = t._node
            if node is None:
                n = self.leaf_ids.get(id(t))
                if n is None:
                    n = self.leaf_ids[id(t)] = len(self.leaves)
                    self.leaves.append(t)
                if r[0] != 1 or r[1] != n:
                    return False
            elif r[0] != 0 or (made := self.made[r[1]]) is None or made() is not node:
                return False
        return True

    def produced(self, node: Any) -> None:
        """The node (or None) the op at the current position made."""
        if node is None:
            self.made.append(None)
        else:
            self.index[id(node)] = len(self.made)
            self.made.append(weakref.ref(node))

    def entry_at(self, k: int) -> Entry:
        """The entry of this call's ``k``-th op (on the plan or recorded)."""
        return self.plan[k] if self.pos >= 0 else self.fresh[k]  # type: ignore[index]

    @property
    def matched(self) -> int:
        """Entries this call walked along the plan (slow ones included) before leaving it."""
        return self.pos if self.pos >= 0 else self.left_at

    def match(self, op: Op, inputs: tuple, attrs: dict, layout: str, grad: bool) -> Entry | None:
        """The plan's next entry when this op equals it (the caller runs it fast), else None (the
        caller runs the full ``apply`` and calls :meth:`record`).  Called for every op of a
        default-mode call: comparisons are inlined, identity first."""
        pos = self.pos
        if pos < 0:
            return None
        plan = self.plan
        if pos < len(plan):
            e = plan[pos]
            if e.op is op and e.layout == layout and e.grad is grad and len(e.ins) == len(inputs):
                if e.slow:
                    self.pos = pos + 1  # the same op, run through the full apply: still on the plan
                    return None
                same = attrs is e.attrs or _same_attrs(e, attrs)
                if same:
                    for t, (shape, dtype, be, rg, state) in zip(inputs, e.ins):
                        td = t.dtype
                        if (t.shape != shape or (td is not dtype and td != dtype) or t._be is not be
                                or t.requires_grad != rg):
                            same = False
                            break
                        if state:
                            if input_state(t) != state:
                                same = False
                                break
                        elif t._node is not None or t._data is None:
                            same = False
                            break
                if same:
                    self.pos = pos + 1
                    if self.whole:  # Cursor.refs(inputs) == e.refs, inlined (once not whole: not needed)
                        self.whole = self._same_refs(inputs, e.refs)
                    return e
        self.fresh = plan[:pos]
        self.left_at, self.pos = pos, -1
        return None

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

    def leave(self) -> None:
        """Leave the plan at the entry just matched (its op then runs, and is recorded, eagerly)."""
        self.fresh = self.plan[:self.pos - 1]
        self.left_at, self.pos = self.pos - 1, -1

    def finished(self) -> list | None:
        """The plan the next call should match (None: keep the current one)."""
        if self.pos < 0:
            return self.fresh
        if self.pos < len(self.plan):
            return self.plan[:self.pos]
        return None
