"""Specialized forward-plan entries: :meth:`Cursor.run <polygrad.compile.forward_plan.Cursor.run>`
and :meth:`Cursor._execute` for one entry, as one generated Python function.

The default ``pg.compile`` mode compares every op a call issues with its plan's next entry and
runs the entry's kernel when they are equal.  The generic matcher loops over the entry's input
specs (tuples unpacked per input, the node state decided by branches) and then calls the executor;
for a small step that Python is most of the op's cost.  The function generated here performs the
*same* comparisons in the same order of effect -- op, layout, grad mode, input count, attributes,
each input's shape, dtype, backend, ``requires_grad`` and node/data state, the kernel still being
the registry's -- with the entry's values as closure constants and the checks for this entry's
input states written out, then runs the kernel, checks its output against the entry's inference,
takes the same fallback on a fault, and builds the result tensor, its graph node and the node's
data-less stand-ins inline (what ``Tensor._make``, ``graph.stand_in`` and ``Node.__init__`` do).
At the first difference the op is handed to the generic matcher (``Cursor.generic``), so leaving
the plan -- and the leaves it numbers on the way -- is the generic matcher's by construction; a
match is the generated function's, and ``tests/unit/test_compile_forward_fast.py`` runs every op
through both and compares them.

One source per *template* (input count, each input's state and where it came from, whether there
are attributes, a node, which inputs are stand-ins) is compiled once and cached; an entry gets its
function by calling the template's factory with its constants (a few microseconds).
"""
from __future__ import annotations

import builtins
from typing import Any, Callable

from ..engine import graph
from ..engine.dispatch import EMPTY, KernelFault, _contradiction, _events, _grad_enabled, _tables, fallback
from ..engine.graph import Node
from ..ir.errors import PolygradError
from ..tensor import Tensor

#: entries with more inputs run through the generic matcher
MAX_INPUTS = 4
#: compiled templates kept (a program with ever new input patterns does not grow this without bound)
MAX_TEMPLATES = 512
_templates: dict[tuple, Callable] = {}

_ENV = {"_grad_get": _grad_enabled.get, "_tables": _tables, "EMPTY": EMPTY, "_graph": graph,
        "_contradiction": _contradiction, "KernelFault": KernelFault, "PolygradError": PolygradError,
        "fallback": fallback, "_events": _events, "_new_object": object.__new__, "TENSOR": Tensor, "NODE": Node}

#: the condition (Python source) under which input ``t{j}`` (node ``n{j}``) does NOT have the state
#: ``forward_plan.input_state`` gave it when the entry was recorded
_STATE_DIFFERS = {
    0: "n{j} is not None or t{j}._data is None",
    1: "t{j}._data is None or n{j} is None or n{j}.op not in _graph.reads_output",
    2: "t{j}._data is None or n{j} is None or n{j}.op in _graph.reads_output",
    3: "t{j}._data is not None",
}


def specialize(entry: Any, same_attrs: Callable[[dict, Any, dict], bool]) -> Callable | None:
    """``entry``'s generated matcher-and-executor, or None (it stays with the generic one):
    ``fast(cursor, pos, op, inputs, attrs, layout)`` returns the op's result when the op equals
    the entry; at the first difference it hands the op to the generic matcher
    (``Cursor.generic``), whose decision and side effects on leaving are then exactly its own.
    ``same_attrs(recorded, types, attrs)`` compares attributes as the generic matcher does.  The
    function holds the entry's values, not the entry (no reference cycle: a dropped plan is freed
    at once)."""
    n = entry.n
    if entry.slow or n == 0 or n > MAX_INPUTS:
        return None
    refs = entry.refs
    states = tuple(s[4] for s in entry.spec)
    kinds = tuple(None if refs is None or refs[j] is None else refs[j][0] for j in range(n))
    key = (n, states, refs is None, kinds, entry.bare, entry.node, entry.stand)
    factory = _templates.get(key)
    if factory is None:
        if len(_templates) >= MAX_TEMPLATES:
            return None
        factory = _templates[key] = _factory(*key)
    consts: list = [entry.op, entry.layout, entry.grad, entry.attrs, entry.types, same_attrs, entry.be_name, entry.key,
                    entry.kernel, entry.call, entry.be, entry.shape, entry.dtype]
    for j, (shape, dtype, be, rg, _, _) in enumerate(entry.spec):
        consts += [shape, dtype, be, rg, None if refs is None or refs[j] is None else refs[j][1]]
    return factory(*consts)


def _factory(n: int, states: tuple, no_refs: bool, kinds: tuple, bare: bool, node: bool, stand: tuple) -> Callable:
    names = ["OP", "LAYOUT", "GRAD", "ATTRS", "TYPES", "SAME_ATTRS", "BE_NAME", "KEY", "KERNEL", "CALL", "BE",
             "SHAPE", "DTYPE"]
    for j in range(n):
        names += [f"S{j}", f"D{j}", f"B{j}", f"RG{j}", f"R{j}"]
    ts = [f"t{j}" for j in range(n)]
    src = [f"def factory({', '.join(names)}):",
           "    def fast(cur, pos, op, inputs, attrs, layout):",
           f"        if op is not OP or layout != LAYOUT or _grad_get() is not GRAD or len(inputs) != {n}:",
           "            return cur.generic(pos, op, inputs, attrs, layout)",
           "        if attrs is not ATTRS and not SAME_ATTRS(ATTRS, TYPES, attrs):",
           "            return cur.generic(pos, op, inputs, attrs, layout)",
           f"        {', '.join(ts)}{',' if n == 1 else ''} = inputs"]
    differs = []
    for j in range(n):
        src.append(f"        n{j} = t{j}._node")
        differs.append(f"t{j}.shape != S{j} or (t{j}.dtype is not D{j} and t{j}.dtype != D{j}) or t{j}._be is not B{j}"
                       f" or t{j}.requires_grad != RG{j} or {_STATE_DIFFERS[states[j]].format(j=j)}")
    src.append(f"        if ({' or '.join(f'({d})' for d in differs)}):")
    src.append("            return cur.generic(pos, op, inputs, attrs, layout)")
    src.append("        if _tables.get(BE_NAME, EMPTY).get(KEY) is not KERNEL:  # the registry's kernel changed")
    src.append("            return cur.generic(pos, op, inputs, attrs, layout)")
    if no_refs:
        src.append("        cur.whole = False")
    elif any(k is not None for k in kinds):  # where each input that requires grad came from
        src.append("        if cur.whole:")
        for j, kind in enumerate(kinds):
            if kind is None:
                continue
            src.append("            if cur.whole:" if j else "            if True:")
            if kind == 0:
                src.append(f"                if n{j} is None or n{j}.made_by is not cur.token or n{j}.made_at != R{j}:")
                src.append("                    cur.whole = False")
            else:
                src += [f"                if n{j} is not None:",
                        "                    cur.whole = False",
                        "                else:",
                        f"                    m = cur.leaf_ids.get(id(t{j}))",
                        "                    if m is None:",
                        f"                        m = cur.leaf_ids[id(t{j})] = len(cur.leaves)",
                        f"                        cur.leaves.append(t{j})",
                        f"                    if m != R{j}:",
                        "                        cur.whole = False"]
    src.append("        cur.pos = pos + 1")
    args = ", ".join(f"t{j}._data" for j in range(n))
    src += ["        scalar = None",
            "        try:",
            f"            out = CALL({args}{'' if bare else ', **attrs'})",
            "            if BE.shape(out) != SHAPE or BE.dtype(out) != DTYPE:",
            "                raise _contradiction(BE, OP, layout, out, SHAPE, DTYPE)",
            "        except KernelFault as exc:",
            "            out, scalar = fallback(OP, inputs, attrs, layout, SHAPE, DTYPE, exc)",
            "        except PolygradError:",
            "            raise",
            "        except Exception as exc:  # noqa: BLE001 - as in apply",
            "            out, scalar = fallback(OP, inputs, attrs, layout, SHAPE, DTYPE, exc)",
            "        r = _new_object(TENSOR)  # Tensor._make, inlined",
            "        r._data = out",
            "        r._be = BE",
            "        r.shape = SHAPE",
            "        r.dtype = DTYPE",
            "        r.grad = None",
            "        r.name = None"]
    if node:
        kept = list(ts)
        for j in stand:  # graph.stand_in, inlined: same node, shape, dtype, backend and name, no data
            src += [f"        s{j} = _new_object(TENSOR)",
                    f"        s{j}._data = None",
                    f"        s{j}._be = t{j}._be",
                    f"        s{j}.shape = t{j}.shape",
                    f"        s{j}.dtype = t{j}.dtype",
                    f"        s{j}.requires_grad = True",
                    f"        s{j}.grad = None",
                    f"        s{j}._node = n{j}",
                    f"        s{j}.name = t{j}.name"]
            kept[j] = f"s{j}"
        src += ["        r.requires_grad = True",
                "        nd = _new_object(NODE)  # Node(OP, kept, attrs, layout, BE, scalar), inlined",
                "        nd.op = OP",
                f"        nd.inputs = {'inputs' if not stand else '(' + ', '.join(kept) + (',)' if n == 1 else ')')}",
                "        nd.attrs = attrs",
                "        nd.layout = layout",
                "        nd.backend = BE",
                "        nd.scalar = scalar",
                "        nd.made_by = cur.token",
                "        nd.made_at = cur.ops",
                "        r._node = nd"]
    else:
        src += ["        r.requires_grad = False",
                "        r._node = None"]
    src += ["        cur.ops += 1",
            "        ev = _events['polygrad_op_executed']",
            "        if ev is not None:",
            "            ev(op=OP.value, backend=BE.name, layout=layout, inputs=inputs, output=r)",
            "        return r",
            "    return fast"]
    env: dict[str, Any] = dict(_ENV)
    exec(builtins.compile("\n".join(src), f"<pg.compile forward entry {n}>", "exec"), env)
    return env["factory"]
