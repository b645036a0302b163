"""Backward plans: what makes the default ``pg.compile`` mode fast without skipping any Python.

In the default mode the step's Python runs every call, so every branch, host read and side effect
happens as in eager.  What repeats from call to call is the work polygrad does *per op* in a
backward pass: ordering the graph, running each node's VJP rule (itself a dozen dispatched ops),
unbroadcasting, accumulating.  A backward plan is that work recorded once, as the kernel calls it
made, keyed by the *structure* of the graph being differentiated:

* for each node, in topological order: its op, layout, backend, attributes, output shape, dtype
  and ``requires_grad``, and where each input comes from (an earlier node, a leaf by identity
  class, or a constant operand: its shape, dtype and whether the node kept its data);
* for each leaf that requires grad: its shape, dtype, backend, and whether ``.grad`` is set.

When ``loss.backward()`` is called and a plan recorded for exactly this structure exists, its
kernels run over *this* call's arrays (each bound by its position in the graph: a node's output,
a node's input, a leaf's current ``.grad``), the leaves receive their gradients, and the nodes are
freed as eager frees them.  The kernels and their order are the ones eager runs for this
structure, so the numbers are eager's bit for bit -- changed only where the bits cannot change
(:func:`_without_expands`: an EXPAND read only by broadcasting elementwise kernels is left to their
broadcasting; a kernel's declared small-output variant, ``polygrad_small``, at call sites with
small outputs, as pure mode's replay; each leaf's last gradient delivered, the earlier ones being
inputs of the accumulation that made it).  Anything a plan cannot reproduce makes the
pass run eagerly instead: a structure seen for the first time (it is recorded), a graph with a
scalar-decomposed (fallen-back) node, a backward that read values on the host, drew random
numbers or delivered a gradient no kernel produced, ``retain_graph``/``create_graph``/an explicit
``grad``, validation mode, event listeners, and a kernel that raises during the plan (the plan is
dropped; the graph is intact until the plan finished, so the eager pass starts clean).

Finding the structure (ordering the graph, building its key) costs about as much as a third of the
plan's kernels.  A call whose forward walked its forward plan with the same identities
(``forward_plan.Cursor.whole``: every input from the same earlier op or leaf as when the plan was
recorded) made the graph the plan's entry for the root last saw; a :class:`Recipe` stored on that
entry finds the graph's tensors, nodes and leaves from the root by input slots, re-checks what the
forward plan does not fix (``requires_grad`` of every node input now, each leaf's ``.grad``, freed
or fallen-back nodes) and runs the plan; anything else takes the full path above.
"""
from __future__ import annotations

import builtins
import operator
import threading
from typing import Any, Callable

import numpy as np

from ..engine.autodiff import _accumulate_lock, _data_or_stand_in
from ..runtime.config import config
from ..engine.dispatch import _forward, _recording, registry
from ..engine.graph import toposort
from ..ir.ops import Op
from ..tensor import Tensor
from .program import (BACKWARD, FUSED, GRAD, KERNEL, LOAD, _call_source, _same, _shape_check_source,
                      _ShapeMismatch)
from .executor import _small
from .recorder import _Recorder

#: structures kept per compiled function (least recently recorded first out)
MAX_PLANS = 16


class _Plan:
    __slots__ = ("attrs", "bindings", "constants", "steps", "deliveries", "freed", "tables", "shapes", "run", "deep",
                 "bind", "key")

    def __init__(self, attrs: list, bindings: list, constants: list, steps: list, deliveries: list,
                 freed: list, tables: tuple, shapes: dict):
        self.shapes = shapes          # slot -> the shape recorded (fused kernels' outputs)
        self.attrs = attrs            # each node's attrs
        self.deep = {i for i, a in enumerate(attrs) if _has_array(a)}  # those compared with _same
        self.bindings = bindings      # (slot, positions): each ("out", i, 0) node i's output, ("in", i, j)
        #                               node i's input j, ("grad", n, 0) leaf n's .grad; several
        #                               positions held the same array when recorded: they must still
        self.constants = constants    # (slot, array) made by the rules themselves (seeds, zeros)
        self.steps = steps            # Kernel / Fused entries, in order
        self.deliveries = deliveries  # (leaf number, slot, backend, shape, dtype): leaf.grad = that
        self.freed = freed            # node positions eager frees
        self.tables = tables          # the fused-kernel tables the plan was recorded with
        self.run = _generate(self)    # (bound arrays, tables, vjp_tables) -> the delivered arrays
        self.bind = _binder(bindings)  # (order, nodes, leaves) -> the bound arrays, None: they differ
        self.key: Any = None  # the key object the cache holds it under (set by BackwardPlans._record)


def _structure(order: list) -> tuple[tuple, list, list, list]:
    """(hashable structure key, each node's attrs, the nodes, the leaves) of a toposorted graph."""
    position = {id(t._node): i for i, t in enumerate(order)}  # graph_key of a tensor with a node
    leaves: list = []
    leaf_no: dict[int, int] = {}
    parts: list = []
    attrs: list = []
    nodes: list = []
    for t in order:
        node = t._node
        inputs = node.inputs
        if inputs is None or node.scalar is not None:
            return (), [], [], []  # freed (eager raises) or fallen back: no plan
        refs: list = []
        for inp in inputs:
            inode = inp._node
            if not inp.requires_grad:
                refs.append(("const", inp.shape, inp.dtype, inp._be.name, inp._data is None, inode is not None))
            elif inode is not None:
                refs.append(position[id(inode)])
            else:
                n = leaf_no.get(id(inp))
                if n is None:
                    n = leaf_no[id(inp)] = len(leaves)
                    leaves.append(inp)
                g = inp.grad
                refs.append(("leaf", n, inp.shape, inp.dtype, inp._be.name, inp._data is None,
                             None if g is None else (type(g), g.shape, g.dtype, g._be.name)))
        parts.append((node.op, node.layout, node.backend.name, t.shape, t.dtype, tuple(refs), tuple(node.attrs)))
        attrs.append(node.attrs)
        nodes.append(node)
    return tuple(parts), attrs, nodes, leaves


def _attrs_match(plan: _Plan, attrs: list) -> bool:
    """Each node's attributes equal the plan's: plain ones (ints, tuples: most) by ``==``, those
    holding arrays or other objects by ``_same`` (elementwise, dtypes included)."""
    deep = plan.deep
    for i, (a, b) in enumerate(zip(plan.attrs, attrs)):
        if a is b:
            continue
        if i in deep:
            if not _same(a, b):
                return False
            continue
        try:
            if not a == b:
                return False
        except Exception:  # noqa: BLE001 - the call's attribute holds an array where the plan's did not
            return False
    return True


def _has_array(attrs: dict) -> bool:
    for v in attrs.values():
        if not isinstance(v, (int, float, str, bool, type(None))) and not (
                isinstance(v, tuple) and all(isinstance(x, (int, float, str, bool, type(None))) for x in v)):
            return True
    return False


def _tables() -> tuple:
    vt = registry.vjp_tables
    return tuple((name, id(t), len(t)) for name, t in vt.items())


class BackwardPlans:
    """The backward plans of one compiled function (thread-safe: one lock around the cache)."""

    def __init__(self) -> None:
        self._plans: dict[_Key, list[_Plan]] = {}
        self._lock = threading.Lock()
        self.stats = {"planned": 0, "recorded": 0, "eager": 0, "shortcut": 0}

    def backward(self, root: Tensor, eager: Callable[[], None]) -> None:
        """``root.backward()`` through a plan when one fits, else ``eager()`` (recording a plan)."""
        if (_recording.get() is not None or config.validate or registry.events["polygrad_op_executed"] is not None
                or registry.events["polygrad_backward_finished"] is not None):
            eager()
            return
        tables = _tables()
        cursor = _forward.get()
        entry: Any = None
        if cursor is not None and cursor.whole and root._node is not None:
            k = cursor.made(root._node)
            if k >= 0:
                entry = cursor.entry_at(k)  # the graph is this call's, made as the plan's was
                for recipe in tuple(entry.recipes):  # another thread may store one
                    if self._shortcut(recipe, root, tables):
                        self.stats["planned"] += 1
                        self.stats["shortcut"] += 1
                        return
        order = toposort([root])
        structure, attrs, nodes, leaves = _structure(order)
        if not structure:
            self.stats["eager"] += 1
            eager()
            return
        key = _Key((structure, root.shape, root.dtype))
        with self._lock:
            candidates = list(self._plans.get(key, ()))
        for plan in candidates:
            if plan.tables == tables and _attrs_match(plan, attrs):
                # the recipe keeps the cache's own key object: its lookups then compare by identity
                recipe = _recipe(plan.key, plan, order, nodes, leaves) if entry is not None else None
                if self._run(plan, order, nodes, leaves):
                    self.stats["planned"] += 1
                    if recipe is not None and entry is not None:
                        entry.recipes.insert(0, recipe)
                        del entry.recipes[2:]
                    return
                with self._lock:  # a kernel failed: forget the plan, run (and record) eagerly
                    kept = self._plans.get(key, [])
                    if plan in kept:
                        kept.remove(plan)
                break
        self._record(key, order, attrs, nodes, leaves, tables, eager)

    def _record(self, key: "_Key", order: list, attrs: list, nodes: list, leaves: list, tables: tuple,
                eager: Callable[[], None]) -> None:
        where: dict[int, list] = {}  # id(array) -> the positions in the graph that hold it
        for i, t in enumerate(order):
            if t._data is not None:
                where.setdefault(id(t._data), []).append(("out", i, 0))
        for i, node in enumerate(nodes):
            for j, inp in enumerate(node.inputs):
                if inp._data is not None:
                    where.setdefault(id(inp._data), []).append(("in", i, j))
        leaf_no = {id(leaf): n for n, leaf in enumerate(leaves)}
        for n, leaf in enumerate(leaves):
            if leaf.grad is not None:
                where.setdefault(id(leaf.grad._data), []).append(("grad", n, 0))
        # every array above stays alive while the pass frees the graph: an array released mid-pass
        # could give its id to a constant a rule makes, which would then be bound to that position
        held = [t._data for t in order] + [inp._data for node in nodes for inp in node.inputs] + [
            leaf.grad._data for leaf in leaves if leaf.grad is not None]
        rec = _Recorder([], [])
        token = _recording.set(rec)
        try:
            eager()
        finally:
            _recording.reset(token)
        self.stats["eager"] += 1
        plan = _plan_of(rec, where, leaf_no, attrs, nodes, tables)
        del held
        if plan is not None:
            with self._lock:
                # re-inserted under this key object, which every plan of the list then holds (a
                # recipe's lookup with it compares by identity, not the nested tuples)
                plans = self._plans.pop(key, [])
                self._plans[key] = plans
                plans.append(plan)
                del plans[:-2]  # two plans per structure at most (e.g. a grad set or not is in the key)
                for kept in plans:
                    kept.key = key
                while len(self._plans) > MAX_PLANS:
                    self._plans.pop(next(iter(self._plans)))
            self.stats["recorded"] += 1

    def _shortcut(self, recipe: "Recipe", root: Tensor, tables: tuple) -> bool:
        """Run ``recipe``'s plan over ``root``'s graph without ordering it, when it still applies."""
        plan = recipe.plan
        if plan.tables != tables or plan not in self._plans.get(recipe.key, ()):
            return False
        got = recipe.materialize(root)
        if got is None:
            return False
        order, nodes, leaves = got
        # the forward plan matches an entry whose attributes hold arrays (a getitem's index, the
        # cross-entropy's classes) by op alone, so their contents may differ from the plan's:
        # compare them as the full path's _attrs_match does (a stale index gave a wrong gradient)
        for i in plan.deep:
            a, b = plan.attrs[i], nodes[i].attrs
            if a is not b and not _same(a, b):
                return False
        if self._run(plan, order, nodes, leaves):
            return True
        return False  # the caller's full path finds the plan again, runs it eagerly and drops it

    @staticmethod
    def _run(plan: _Plan, order: list, nodes: list, leaves: list) -> bool:
        bound = plan.bind(order, nodes, leaves)
        if bound is None:
            return False
        try:
            grads = plan.run(bound, registry.tables, registry.vjp_tables)
        except Exception:  # noqa: BLE001 - a kernel fault: the caller runs the pass eagerly
            return False
        with _accumulate_lock:
            for (n, _, be, shape, dtype, shared), array in zip(plan.deliveries, grads):
                leaves[n].grad = Tensor._make(array.copy() if shared else array, be, shape, dtype)
        for i in plan.freed:
            node = nodes[i]
            node.inputs = node.scalar = None  # Node.free, inlined (a call per node otherwise)
        return True


class Recipe:
    """How a graph made by a default-mode call that walked its forward plan with the same identities
    (``forward_plan.Cursor.whole``) is ordered, without ``toposort`` and the structure key: each
    tensor of the order as the input slot ``(c, j)`` of a later node (the root last), each leaf
    likewise, and what the structure key read that the forward plan does not fix -- which inputs
    require grad now, which leaves have a ``.grad`` -- to be checked again.

    A recipe used a second time gets its walk as one generated function (:func:`_materializer`:
    the same reads and checks, unrolled, with the recorded values as constants); the first use
    walks generically, so a graph seen once costs no code generation."""

    __slots__ = ("key", "plan", "slots", "leaf_slots", "rgs", "grads", "uses", "fast")

    def __init__(self, key: Any, plan: _Plan, slots: list, leaf_slots: list, rgs: list, grads: tuple):
        self.key = key
        self.plan = plan
        self.slots = slots
        self.leaf_slots = leaf_slots
        self.rgs = rgs
        self.grads = grads
        self.uses = 0
        self.fast: Callable[[Tensor], tuple[list, list, list] | None] | None = None

    def materialize(self, root: Tensor) -> tuple[list, list, list] | None:
        """(order, nodes, leaves) of ``root``'s graph as ``_structure`` would give them, or None when
        the graph differs from the recorded one in what the forward plan did not fix."""
        fast = self.fast
        if fast is None:
            self.uses += 1
            if self.uses < 2:
                return self.walk(root)
            fast = self.fast = _materializer(self)
        return fast(root)

    def walk(self, root: Tensor) -> tuple[list, list, list] | None:
        """:meth:`materialize`, generically (what the generated function does, as a loop)."""
        n = len(self.slots) + 1
        order: list = [None] * n
        nodes: list = [None] * n
        order[-1] = root
        nodes[-1] = node = root._node
        rgs = self.rgs
        slots = self.slots
        rg = _requires_grad
        if node is None or node.inputs is None or node.scalar is not None or tuple(map(rg, node.inputs)) != rgs[-1]:
            return None
        for i in range(n - 2, -1, -1):
            c, j = slots[i]
            t = nodes[c].inputs[j]
            node = t._node
            if node is None or node.inputs is None or node.scalar is not None or tuple(map(rg, node.inputs)) != rgs[i]:
                return None
            order[i] = t
            nodes[i] = node
        leaves = [nodes[c].inputs[j] for c, j in self.leaf_slots]
        if _grads(leaves) != self.grads:
            return None
        return order, nodes, leaves


def _materializer(recipe: Recipe) -> Callable[[Tensor], tuple[list, list, list] | None]:
    """:meth:`Recipe.walk` unrolled for ``recipe``: each tensor read from its slot, each node checked
    (there, not freed, not fallen back, its inputs' ``requires_grad`` as recorded), each leaf's
    ``.grad`` compared with what was recorded (None, or its type, shape, dtype and backend name)."""
    env: dict[str, Any] = {}

    def const(value: Any) -> str:
        if type(value) is bool or value is None:
            return repr(value)
        name = f"C{len(env)}"
        env[name] = value
        return name

    last = len(recipe.slots)
    src = ["def materialize(root):", f"    t{last} = root"]

    def node_lines(i: int) -> list[str]:
        rgs = recipe.rgs[i]
        checks = [f"i{i} is None", f"n{i}.scalar is not None", f"len(i{i}) != {len(rgs)}"]
        checks += [f"i{i}[{k}].requires_grad != {const(flag)}" for k, flag in enumerate(rgs)]
        return [f"    n{i} = t{i}._node", f"    if n{i} is None: return None", f"    i{i} = n{i}.inputs",
                f"    if {' or '.join(checks)}: return None"]

    src += node_lines(last)
    for i in range(last - 1, -1, -1):
        c, j = recipe.slots[i]
        src.append(f"    t{i} = i{c}[{j}]")
        src += node_lines(i)
    for k, (c, j) in enumerate(recipe.leaf_slots):
        src.append(f"    l{k} = i{c}[{j}]")
        want = recipe.grads[k]
        if want is None:
            src.append(f"    if l{k}.grad is not None: return None")
        else:
            kind, shape, dtype, be = want
            src += [f"    g = l{k}.grad",
                    f"    if g is None or type(g) != {const(kind)} or g.shape != {const(shape)} or g.dtype != "
                    f"{const(dtype)} or g._be.name != {const(be)}: return None"]
    listed = ", ".join(f"t{i}" for i in range(last + 1))
    src.append(f"    return [{listed}], [{', '.join(f'n{i}' for i in range(last + 1))}], "
               f"[{', '.join(f'l{k}' for k in range(len(recipe.leaf_slots)))}]")
    exec(builtins.compile("\n".join(src), "<pg.compile backward recipe>", "exec"), env)
    return env["materialize"]


class _Key:
    """A structure key with its hash computed once: a recipe finds its plan list with it every
    backward pass, and hashing the nested tuple again would cost microseconds each time."""

    __slots__ = ("parts", "hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self.hash = hash(parts)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Key and self.hash == other.hash and self.parts == other.parts)


_requires_grad = operator.attrgetter("requires_grad")


def _rgs(node: Any) -> tuple:
    return tuple(map(_requires_grad, node.inputs))


def _grads(leaves: list) -> tuple:
    return tuple([None if (g := leaf.grad) is None else (type(g), g.shape, g.dtype, g._be.name) for leaf in leaves])


def _recipe(key: "_Key", plan: _Plan, order: list, nodes: list, leaves: list) -> Recipe | None:
    """The recipe of a graph ``_structure`` ordered (before a plan frees it), or None."""
    last = len(order) - 1
    position = {id(t): i for i, t in enumerate(order)}
    slots: list = [None] * last
    leaf_at = {id(leaf): n for n, leaf in enumerate(leaves)}
    leaf_slots: list = [None] * len(leaves)
    for c in range(last, -1, -1):
        for j, inp in enumerate(nodes[c].inputs):
            i = position.get(id(inp))
            if i is not None and i < c and slots[i] is None:
                slots[i] = (c, j)
            n = leaf_at.get(id(inp))
            if n is not None and leaf_slots[n] is None:
                leaf_slots[n] = (c, j)
    if any(s is None for s in slots) or any(s is None for s in leaf_slots):
        return None
    return Recipe(key, plan, slots, leaf_slots, [_rgs(node) for node in nodes], _grads(leaves))


def _binder(bindings: list) -> Callable[[list, list, list], list | None]:
    """The plan's bindings as one generated function: each bound array read from its first position
    in the graph, every other position checked to hold that very array (as when recorded), a missing
    one (a freed node's, a stand-in's, an unset ``.grad``) making it return None."""

    def at(position: tuple) -> str:
        kind, i, j = position
        if kind == "out":
            return f"order[{i}]._data"
        if kind == "in":
            return f"nodes[{i}].inputs[{j}]._data"
        return f"(None if (g := leaves[{i}].grad) is None else g._data)"

    src = ["def bind(order, nodes, leaves):"]
    names = []
    for k, (_, positions) in enumerate(bindings):
        src.append(f"    a{k} = {at(positions[0])}")
        src.append(f"    if a{k} is None: return None")
        for other in positions[1:]:  # positions that shared an array when recorded still do
            src.append(f"    if {at(other)} is not a{k}: return None")
        names.append(f"a{k}")
    src.append(f"    return [{', '.join(names)}]")
    env: dict[str, Any] = {}
    exec(builtins.compile("\n".join(src), "<pg.compile backward bindings>", "exec"), env)
    return env["bind"]


def _copy(array: Any) -> Any:
    copy = getattr(array, "copy", None)
    return copy() if callable(copy) else array


def _aliases(a: Any, b: Any) -> bool:
    """Whether arrays ``a`` and ``b`` may share memory (numpy: exactly; other arrays: identity or a
    common base, conservatively)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    return getattr(a, "base", None) is not None and getattr(a, "base", None) is getattr(b, "base", b)


def _plan_of(rec: _Recorder, where: dict, leaf_no: dict, attrs: list, nodes: list, tables: tuple) -> _Plan | None:
    """The plan of a recorded eager backward pass, or None when it cannot be replayed exactly."""
    if rec.problem is not None or rec.host_guards or rec.items or rec.array_guard:
        return None
    bindings: list = []
    constants: list = []
    steps: list = []
    deliveries: list = []
    made: set[int] = set()  # slots the kernels write
    originals: list = []  # the constants as recorded (the plan keeps copies)
    for e in rec.program:
        kind = e[0]
        if kind == KERNEL or kind == FUSED:
            steps.append(e)
            made.update([e.out] if kind == KERNEL else [s for s in e.outs if s >= 0])
        elif kind == LOAD:
            if e.tensor._data is None:  # a data-less stand-in: what eager hands a fused kernel instead
                constants.append((e.slot, _data_or_stand_in(e.tensor)))
                continue
            positions = where.get(id(e.tensor._data))
            if positions is None:
                if e.tensor.requires_grad:
                    return None  # a tensor outside the graph that requires grad: not a rule's constant
                # a copy: the recorded array may be handed to the user (a leaf's gradient) and written
                constants.append((e.slot, _copy(e.tensor._data)))
                originals.append(e.tensor._data)
            else:
                bindings.append((e.slot, tuple(positions)))
        elif kind == GRAD:
            n = leaf_no.get(id(e.owner))
            if n is None:
                return None
            bindings.append((e.slot, (("grad", n, 0),)))
        elif kind == BACKWARD:  # where the gradients went
            for ref, value in e.grads:
                n = leaf_no.get(id(ref))
                if n is None or value[0] != 1 or value[1] not in made:
                    return None  # a gradient no kernel made (a seed delivered as it is), or to a non-leaf
                be, shape, dtype = rec.meta[value[1]]
                # a gradient that shares memory with a constant the plan keeps (a rule's seed or
                # zeros, or a view of one) is copied when delivered: eager's is fresh every call,
                # and a later in-place write into it must not reach the next call's constant
                array = rec.slot_arrays[value[1]]
                shared = any(_aliases(array, c) for c in originals)
                deliveries.append((n, value[1], be, shape, dtype, shared))
        else:
            return None  # random draws, host calls, anything else: the pass stays eager
    freed = [i for i, node in enumerate(nodes) if node.inputs is None]
    shapes = {slot: rec.meta[slot][1] for e in steps if e[0] == FUSED for slot in e.outs if slot >= 0}
    last: dict[int, int] = {}  # a leaf's last delivery is its .grad after the pass: the others are not made
    for k, d in enumerate(deliveries):
        last[d[0]] = k
    deliveries = [d for k, d in enumerate(deliveries) if last[d[0]] == k]
    steps = _without_expands(steps, rec.meta, {d[1] for d in deliveries})
    return _Plan(attrs, bindings, constants, steps, deliveries, freed, tables, shapes)


#: elementwise ops whose kernels broadcast their operands (the ops' inference does): an operand
#: expanded to the output's shape gives the same elements as the operand itself
_BROADCASTING = frozenset({Op.ADD, Op.MUL, Op.WHERE, Op.MAXIMUM, Op.POW, Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})


def _without_expands(steps: list, meta: list, delivered: set) -> list:
    """``steps`` without the EXPAND kernels (a sum's gradient spread over its input's shape) whose
    every reader is a broadcasting elementwise kernel of the same backend that broadcasts the
    unexpanded operand to the same output shape, with the dtypes of its other value operands (so
    the kernel promotes nothing differently): those readers read the unexpanded buffer instead.
    Each output element is the same operation on the same values, so the same bits."""
    readers: dict[int, list] = {}
    for n, e in enumerate(steps):
        for slot in e.inputs:
            readers.setdefault(slot, []).append(n)
    replace: dict[int, int] = {}  # expanded slot -> the slot it expanded
    for e in steps:
        if e[0] != KERNEL or e.key != (Op.EXPAND, "dense") or e.out in delivered:
            continue
        src = e.inputs[0]
        ok = bool(readers.get(e.out))
        for n in readers.get(e.out, ()):
            r = steps[n]
            if r[0] != KERNEL or r.key[1] != "dense" or r.key[0] not in _BROADCASTING or r.backend is not e.backend:
                ok = False
                break
            values = r.inputs[1:] if r.key[0] == Op.WHERE else r.inputs
            shapes = [meta[src][1] if i == e.out else meta[replace.get(i, i)][1] for i in r.inputs]
            if (any(meta[i][2] != meta[src][2] for i in values)
                    or tuple(np.broadcast_shapes(*shapes)) != tuple(r.shape)):
                ok = False
                break
        if ok:
            replace[e.out] = src
    if not replace:
        return steps
    out = []
    for e in steps:
        if e[0] == KERNEL and e.out in replace:
            continue
        if any(i in replace for i in e.inputs):
            e = e._replace(inputs=tuple(replace.get(i, i) for i in e.inputs))
        out.append(e)
    return out


def _generate(plan: _Plan) -> Callable[[list, dict, dict], tuple]:
    """The plan as one Python function: its kernels as straight-line calls over local buffers, each
    deleted after its last use (what makes a plan cheaper than the rules it replaces)."""
    env: dict[str, Any] = {"Mismatch": _ShapeMismatch, "SMALL": _small}
    kernels: dict[tuple, str] = {}

    def const(value: Any) -> str:
        name = f"C{len(env)}"
        env[name] = value
        return name

    def kernel(fused: bool, be: Any, key: tuple) -> str:
        return kernels.setdefault((fused, be.name, key), f"k{len(kernels)}")

    small: dict[str, int] = {}  # local name of a kernel -> the output size its small variant serves

    def small_kernel(be: Any, key: tuple, shape: tuple) -> str:
        """The kernel's variant for this call site's (small) output where it declares one (as the
        pure mode's executor does, checked again against the table's kernel when the plan runs)."""
        name = kernel(False, be, key)
        declared = getattr(registry.tables.get(be.name, {}).get(key), "polygrad_small", None)
        if declared is None or int(np.prod(shape, dtype=np.int64)) >= declared[2]:
            return name
        small[name] = declared[2]
        return f"{name}s"

    def call(ins: tuple, kwargs: dict) -> str:
        return _call_source(ins, kwargs, const)

    def check(var: str, be: Any, shape: tuple) -> str:
        return _shape_check_source(var, be, shape, const)

    delivered = [d[1] for d in plan.deliveries]
    body: list[tuple[list[str], tuple]] = []
    for e in plan.steps:
        if e[0] == KERNEL:
            body.append(([f"b{e.out} = {small_kernel(e.backend, e.key, e.shape)}({call(e.inputs, e.attrs)})",
                          check(f"b{e.out}", e.backend, e.shape)], e.inputs))
        else:
            lines = [f"r = {kernel(True, e.backend, e.key)}({call(e.inputs, e.kwargs)})"]
            for i, slot in enumerate(e.outs):
                if slot >= 0:
                    lines += [f"b{slot} = r[{i}]", check(f"b{slot}", e.backend, plan.shapes[slot])]
            body.append((lines, e.inputs))
    last: dict[int, int] = {}
    for n, (_, ins) in enumerate(body):
        for slot in ins:
            last[slot] = n
    src = ["def run(bound, tables, vjp_tables):"]
    src += [f"    b{slot} = bound[{k}]" for k, (slot, _) in enumerate(plan.bindings)]
    src += [f"    b{slot} = {const(array)}" for slot, array in plan.constants]
    for (fused, name, key), local in kernels.items():
        src.append(f"    {local} = {'vjp_tables' if fused else 'tables'}[{name!r}][{const(key)}]")
        if local in small:
            src.append(f"    {local}s = SMALL({local}, {small[local]})")
    for n, (lines, _) in enumerate(body):
        src += [f"    {line}" for line in lines]
        dead = sorted({s for s, at in last.items() if at == n and s not in delivered})
        if dead:
            src.append(f"    del {', '.join(f'b{s}' for s in dead)}")
    src.append(f"    return ({''.join(f'b{slot}, ' for slot in delivered)})")
    exec(builtins.compile("\n".join(src), "<pg.compile backward plan>", "exec"), env)
    return env["run"]
