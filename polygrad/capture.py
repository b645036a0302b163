"""``pg.compile``: capture a step's kernel sequence once, then replay the kernels directly.

Eager polygrad pays, per op, for inference, validation, graph recording and Python dispatch:
about 2 us against well under 1 us for the numpy call itself, which is most of a small model's
step.  A compiled step pays it only while it is captured::

    @pg.compile
    def train_step(x, y):
        opt.zero_grad()
        loss = nn.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

The first call for a given guard key runs eagerly (a warm-up: optimizer state and layer caches
get built); the next two run eagerly too, each with a recorder that notes every kernel dispatch
runs (forward, VJP rules, fused backward kernels), the optimizer calls, the random draws and where
gradients and results end up.  The two recordings must agree (same kernels, attributes and
constants: a learning rate computed in Python and multiplied in as a number would differ, and is
refused rather than frozen); later calls run the *program*, generated as one Python function: the
kernel calls in order over local buffers, with no inference, validation, Node or Tensor between
them (an interpreter of the same program serves validation mode and event listeners).

What a replay reads afresh, every call: the tensors passed as arguments, the current storage of
every other tensor the step reads (parameters, optimizer-written values), the kernels themselves
(looked up in the registry's table, so ``inject_fault`` reaches them), the random generator
(dropout masks are drawn anew, in eager order, from ``pg.manual_seed``'s generator), and the
optimizer, whose ``zero_grad()`` / ``step()`` calls run as they are (learning-rate schedules and
Adam's step counter stay right).  What is frozen at capture: Python control flow, Python numbers
and host (numpy) data the step turns into tensors itself -- pass data that changes as arguments.
The tensors a replay returns carry no autodiff graph: call ``backward()`` inside the step.

Rewrites: a capture's program may be changed where the result is bit for bit the same.  Rows
gathered from an SpMM's output (``logits[train_mask]`` after ``A @ (H W) + b``) are computed
alone, forward and in the fused backward (:func:`_push_row_gathers`: on Cora 140 of 2708 rows); and
a kernel that declares a small-output variant (``polygrad_small``) is called through it at call
sites whose output is small.

Guards (any change captures again, a bounded LRU cache of captures per function): argument
structure, shapes, dtypes, layouts, sparsity patterns (by identity), backends and
``requires_grad`` flags; Python scalars among the arguments (by value); grad mode; the default
backend; ``pg.config`` (fallback policy and chain, validation, layout policy); the train/eval
mode of the modules the function reaches; which event hooks are implemented; and whether each
gradient the step accumulates into was set.

Memory budget (``pg.config.memory_fraction``): a replay skips dispatch, so its kernels are not
checked one by one; it is budgeted once, at capture, where dispatch checked every output a replay
will allocate -- shapes, dtypes and the fraction are guards, so a replay allocates exactly the
sizes the capture approved.  Memory that becomes short between calls is not re-measured per replay
(that per-kernel check is part of the overhead a replay removes); a kernel that then fails (a
``MemoryError``) is a replay fault like any other: the call re-runs eagerly, where dispatch's check
refuses the op with a clear ``MemoryBudgetError``.  Learning-rate schedulers: an optimizer reads
its groups' ``lr`` when it steps, so a scheduler stepped between calls is seen by the next replay;
``LRScheduler.step()`` inside the compiled function is a host call every replay repeats, and
``ReduceLROnPlateau.step(metric)`` there (a host value) makes the capture refuse.

Safety: a kernel that raises (or returns a shape the capture did not see) during a replay drops
the capture and the call re-runs eagerly, through the usual fallback.  Once ``optimizer.step()``
has run in that replay a re-run would step twice, so a failing forward kernel after it is
recomputed in place through the fallback chain instead (a failing fused backward kernel there,
which no step written as zero_grad/forward/backward/step has, raises its error).  Errors raised by
the optimizer itself (a bad learning-rate schedule) are the user's and propagate unchanged.  A
step that falls back while being captured is never replayed.  ``POLYGRAD_VALIDATE=1`` shadow-checks every replayed
kernel against the scalar reference, and ``polygrad_op_executed`` / ``polygrad_backward_finished``
fire for replayed kernels and backward passes as they would eagerly (``polygrad_layout_chosen``
does not: layouts are part of the capture).  A backend opts out with ``supports_replay = False``.
"""
from __future__ import annotations

import builtins
import keyword
import threading
import time
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from .config import config
from .dispatch import _recording, fallback, is_grad_enabled, registry, validate_against_reference
from .errors import PolygradError
from .ops import Op, kernel_key
from .backend import Backend
from .registry import get_backend
from .pattern import Pattern
from .sparse import SparseTensor
from .tensor import Tensor, rng

__all__ = ["compile", "Compiled", "CompileError", "fresh", "host_call"]

_default_shape = Backend.shape
#: longest program replayed through a generated function (longer ones use the interpreter)
MAX_GENERATED = 20_000

# program entries: tuples whose first item says what to do
_LOAD, _ARG, _GRAD, _KERNEL, _FUSED, _FRESH, _HOST, _SET_GRAD, _SET_DATA, _BACKWARD, _ASSERT_FINITE = range(11)


class CompileError(PolygradError, TypeError):
    """A compiled function was called with an argument it cannot guard."""


class _Refused(Exception):
    """Internal: what was seen while capturing cannot be replayed (the reason is the message)."""


class _ReplayFault(Exception):
    """Internal: a kernel failed during a replay; ``after_step`` when a non-idempotent host call ran."""

    def __init__(self, exc: BaseException, after_step: bool):
        super().__init__(str(exc))
        self.exc = exc
        self.after_step = after_step


# -- hooks the rest of polygrad calls while a capture runs ----------------------------------------

def fresh(make: Callable[[], Tensor], raw: Callable[[], Any] | None = None) -> Tensor:
    """``make()``, a tensor drawn from a random generator; a capture records it so that every replay
    calls ``make()`` again (fresh dropout masks, drawn in eager order from the same generator).
    ``raw``, when given, draws the same values as the backend array itself (no Tensor built): a
    replay calls it instead of ``make``, which is what a replay needs and saves a wrap per draw."""
    t = make()
    rec = _recording.get()
    if rec is not None:
        rec.fresh(raw if raw is not None else make, t, raw is not None)
    return t


def host_call(method: Callable[..., Any], idempotent: bool, replayable: bool = True) -> None:
    """Note that host code with effects polygrad's kernels do not see (an optimizer's ``step``) is
    about to run; a replay calls ``method()`` at the same point.  ``replayable=False`` makes the
    capture refuse (e.g. ``step(closure)``, which runs a forward pass of its own)."""
    rec = _recording.get()
    if rec is not None:
        if replayable:
            rec.host(method, idempotent)
        else:
            rec.refuse(f"{getattr(method, '__qualname__', method)} cannot be replayed here")


# -- the recorder -------------------------------------------------------------------------------------

class _Recorder:
    """Turns one eager run into a program.  Buffers ("slots") are identified by array identity, so
    views that share storage (``detach``, ``.data``) resolve to the kernel that produced them."""

    def __init__(self, flat: list, state: list):
        self.program: list[tuple] = []
        self.meta: list[tuple] = []          # slot -> (backend, shape, dtype)
        self.slot_of: dict[int, int] = {}    # id(array) -> slot
        self.keep: list[Any] = []            # everything whose id is a key above stays alive
        self.arg_index = {id(t): i for i, t in enumerate(flat)}
        self.watched: list[tuple[Tensor, Any]] = []   # (tensor, ref: arg index or the tensor)
        self.baseline: dict[int, list] = {}  # id(tensor) -> [grad, storage] at the last sync
        self.grad_owner: dict[int, Tensor] = {}       # id(a gradient tensor) -> the tensor it is .grad of
        self.grad_guard: list[tuple[Any, bool]] = []  # (ref, had a grad when the call started)
        self.items: dict[int, tuple[int, Any]] = {}   # id(Python number from .item()) -> (slot, number)
        # whether each tensor the step can reach had a gradient when the call started (the step may
        # clear it with p.grad = None before the recorder first sees p)
        self.had_grad = {id(t): t.grad is not None for t in (*state, *flat)}
        self.host_pending = False
        self.hosts = 0
        self.problem: str | None = None
        self.computed: set[int] = set()      # id(array) of everything the step's kernels produced
        self.host_guards: list[tuple[Any, np.ndarray]] = []  # (ref, values read on the host)
        self.host_seen: set[int] = set()

    def refuse(self, reason: str) -> None:
        if self.problem is None:
            self.problem = reason

    # slots
    def _produce(self, array: Any, be, shape: tuple, dtype) -> int:
        slot = len(self.meta)
        self.meta.append((be, shape, dtype))
        self.slot_of[id(array)] = slot
        self.keep.append(array)
        return slot

    def _input(self, t: Tensor) -> int:
        array = t._data
        slot = self.slot_of.get(id(array))
        if slot is not None:
            return slot
        slot = self._produce(array, t._be, t.shape, t.dtype)
        index = self.arg_index.get(id(t))
        owner = self.grad_owner.get(id(t))
        if index is not None:
            self.program.append((_ARG, slot, index))
            self._watch(t, index)
        elif owner is not None and owner.grad is t:  # gradient accumulation: read the live .grad
            self.program.append((_GRAD, slot, owner))
        else:
            self.program.append((_LOAD, slot, t))
            self._watch(t, t)
        return slot

    def _watch(self, t: Tensor, ref: Any) -> None:
        if id(t) in self.baseline:
            return
        self.keep.append(t)
        self.watched.append((t, ref))
        self.baseline[id(t)] = [t.grad, t._data]
        if t.grad is not None:
            self.grad_owner[id(t.grad)] = t
            self.keep.append(t.grad)
        had = self.had_grad.get(id(t))
        if had is None and self.hosts == 0:
            had = t.grad is not None
        if had is not None:  # the state at the start of the call: a replay must find the same
            self.grad_guard.append((ref, had))

    def _settle(self) -> None:
        """After a host call: what it changed (new storage, cleared grads) is the new baseline."""
        if self.host_pending:
            self.host_pending = False
            for t, _ in self.watched:
                self.baseline[id(t)] = [t.grad, t._data]

    def _value(self, g: Any) -> tuple:
        """How a replay rebuilds tensor ``g`` (a gradient, a result)."""
        if g is None:
            return (0, None)
        if isinstance(g, SparseTensor):
            return (3, g.pattern, self._value(g._values))
        slot = self.slot_of.get(id(g._data))
        if slot is None:
            return (2, g)  # made outside the kernels (a constant): the same tensor every call
        return (1, slot)

    def _sync(self) -> None:
        """Record where gradients and storage of the watched tensors changed since the last sync."""
        for t, ref in self.watched:
            base = self.baseline[id(t)]
            g = t.grad
            if g is not base[0]:
                self.program.append((_SET_GRAD, ref, self._value(g)))
                base[0] = g
            d = t._data
            if d is not base[1]:
                slot = self.slot_of.get(id(d))
                if slot is None:
                    self.refuse("host code replaced a tensor's storage outside the optimizer")
                    return
                self.program.append((_SET_DATA, ref, slot))
                base[1] = d

    # what dispatch, autodiff, the optimizer and dropout report
    def kernel(self, op, layout: str, be, inputs: tuple, attrs: dict, result: Tensor) -> None:
        if self.problem is not None:
            return
        self._settle()
        if not getattr(be, "supports_replay", True):
            self.refuse(f"backend {be.name!r} does not support replay")
            return
        key = kernel_key(op, layout)  # dispatch's rule: both layouts share the canonical storage
        ins = tuple(self._input(t) for t in inputs)
        out = self._produce(result._data, be, result.shape, result.dtype)
        self.computed.add(id(result._data))
        self.program.append((_KERNEL, be, key, ins, dict(attrs), out, result.shape))

    def fused(self, be, key: tuple, inputs: tuple, kwargs: dict, grads: list) -> None:
        if self.problem is not None:
            return
        self._settle()
        ins = tuple(self._input(t) for t in inputs)
        outs = tuple(-1 if g is None else self._produce(g._data, be, g.shape, g.dtype) for g in grads)
        self.computed.update(id(g._data) for g in grads if g is not None)
        self.program.append((_FUSED, be, key, ins, kwargs, outs))

    def fresh(self, make: Callable[[], Any], t: Tensor, raw: bool) -> None:
        self._settle()
        slot = self._produce(t._data, t._be, t.shape, t.dtype)
        self.computed.add(id(t._data))
        self.program.append((_FRESH, slot, make, raw))

    def host(self, method: Callable[[], Any], idempotent: bool) -> None:
        self._settle()
        self._sync()
        self.program.append((_HOST, method, idempotent))
        self.hosts += 1
        self.host_pending = True

    def host_read(self, t: Tensor) -> None:
        """``t``'s values were read on the host (indices, class targets, a graph's edges): what the
        step then did with them is frozen into the program, so a replay is valid only while they
        are the same -- a guard compares them on every call.  Values the step computed itself are
        left to the two-capture comparison (they differ from call to call, or are constants)."""
        if self.problem is not None or id(t._data) in self.computed or id(t) in self.host_seen:
            return
        self.host_seen.add(id(t))
        self.keep.append(t)
        self.host_guards.append((self._ref(t), np.array(t._be.to_numpy(t._data))))

    def item(self, t: Tensor, value: Any) -> None:
        if isinstance(t, SparseTensor) or self.problem is not None:
            return
        self._settle()
        self.items[id(value)] = (self._input(t), value)

    def backward_finished(self, num_nodes: int, produced: list) -> None:
        self._settle()
        grads = tuple((self._ref(leaf), self._value(g)) for leaf, g in produced)
        self.program.append((_BACKWARD, num_nodes, grads))

    def _ref(self, t: Tensor) -> Any:
        index = self.arg_index.get(id(t))
        return t if index is None else index

    def _output(self, x: Any) -> tuple:
        if isinstance(x, Tensor):
            if id(x) in self.baseline:  # a tensor the step read, not made: eager returns the object
                ref = self._ref(x)
                return ("arg", ref) if type(ref) is int else ("const", x)
            return ("tensor", self._value(x), x.requires_grad)
        if x is None or isinstance(x, str):
            return ("const", x)
        if isinstance(x, (bool, int, float, np.number)):
            hit = self.items.get(id(x))
            if hit is None:
                raise _Refused(f"it returned a Python number ({x!r}) not read from a tensor with .item(); "
                               "return the tensor instead")
            return ("item", hit[0])
        if isinstance(x, (tuple, list)):
            return (type(x).__name__, tuple(self._output(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, self._output(v)) for k, v in x.items()))
        raise _Refused(f"it returned a {type(x).__name__}, which a replay cannot rebuild")

    def finish(self, out: Any) -> "_Capture":
        self._settle()
        self._sync()
        spec = self._output(out)
        if self.problem is not None:
            raise _Refused(self.problem)
        fresh_draws = any(e[0] == _FRESH for e in self.program)
        return _Capture(self.program, self.meta, spec, self.grad_guard, fresh_draws, self.host_guards)


class _Capture:
    """A recorded step: the program, each slot's (backend, shape, dtype), the result's layout."""

    def __init__(self, program: list, meta: list, spec: tuple, grad_guard: list, fresh_draws: bool,
                 host_guards: list):
        # listeners of polygrad_op_executed see the ops eager runs: no rewrite while one listens
        # (whether one does is part of the guard key)
        rewrite = registry.events["polygrad_op_executed"] is None
        self.program, self.meta = _push_row_gathers(program, meta, spec) if rewrite else (program, meta)
        self.spec = spec
        self.grad_guard = grad_guard
        self.fresh_draws = fresh_draws
        self.kernels = sum(1 for e in program if e[0] in (_KERNEL, _FUSED))
        self.fast = _generate(self)
        self.host_guards: list[tuple[Any, np.ndarray]] = host_guards  # (ref, values read on the host)

    def still_valid(self, flat: list) -> bool:
        for ref, had in self.grad_guard:
            t = flat[ref] if type(ref) is int else ref
            if (t.grad is not None) != had:
                return False
        for ref, seen in self.host_guards:  # values the capture read on the host: unchanged?
            t = flat[ref] if type(ref) is int else ref
            now = t._be.to_numpy(t._data)
            if now.shape != seen.shape or now.dtype != seen.dtype or not np.array_equal(
                    now, seen, equal_nan=seen.dtype.kind in "fc"):
                return False
        return True


def _same(u: Any, v: Any) -> bool:
    """Equality of recorded attrs/arguments that tolerates arrays (elementwise) and odd objects."""
    if u is v:
        return True
    if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
        return isinstance(u, np.ndarray) and isinstance(v, np.ndarray) and u.dtype == v.dtype \
            and np.array_equal(u, v)
    if isinstance(u, (tuple, list)):
        return type(u) is type(v) and len(u) == len(v) and all(_same(a, b) for a, b in zip(u, v))
    if isinstance(u, dict):
        return isinstance(v, dict) and u.keys() == v.keys() and all(_same(u[k], v[k]) for k in u)
    if isinstance(u, Pattern):  # a sparsity pattern rebuilt every call: the same one is fine to keep
        return isinstance(v, Pattern) and u.same_as(v)
    try:
        return bool(u == v)
    except Exception:  # noqa: BLE001 - objects whose == is not a plain truth value
        return False


def _constant_changed(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a._be is not b._be:
        return True
    return not np.array_equal(a._be.to_numpy(a._data), b._be.to_numpy(b._data), equal_nan=True)


def _mismatch(a: _Capture, b: _Capture) -> str | None:
    """Why two captures of the same guard key differ (None: they agree, replay is safe).

    Two captures differ when the step's Python code decides something the guards do not see: a
    learning rate or counter computed in Python and turned into a tensor (a constant the replay
    would freeze), or control flow that depends on values."""
    if len(a.program) != len(b.program) or a.spec[0] != b.spec[0]:
        return "the step ran a different sequence of ops when captured twice (control flow on values?)"
    for x, y in zip(a.program, b.program):
        if x[0] != y[0]:
            return "the step ran a different sequence of ops when captured twice (control flow on values?)"
        if x[0] == _LOAD:
            if x[2] is not y[2] and _constant_changed(x[2], y[2]):
                return ("a value the step makes from Python numbers or host data (a learning rate? a "
                        "counter?) changed between calls; pass it as a tensor argument")
        elif x[0] in (_KERNEL, _FUSED):
            if x[1] is not y[1] or x[2] != y[2] or x[3] != y[3] or not _same(x[4], y[4]) or x[5] != y[5]:
                return f"op '{x[2][0]}' ran with different operands or attributes when captured twice"
        elif x[0] == _HOST:
            if getattr(x[1], "__self__", x[1]) is not getattr(y[1], "__self__", y[1]):
                return "the step called a different optimizer when captured twice"
        elif x[0] in (_SET_GRAD, _SET_DATA, _GRAD) and x[1] is not y[1] and x[1] != y[1]:
            return "the step wrote gradients or storage of different tensors when captured twice"
    return None


# -- rewrites ----------------------------------------------------------------------------------------

def _value_slots(value: tuple, out: list) -> None:
    if value[0] == 1:
        out.append(value[1])
    elif value[0] == 3:
        _value_slots(value[2], out)


def _reads(e: tuple) -> list[int]:
    """The slots a program entry reads."""
    kind = e[0]
    if kind in (_KERNEL, _FUSED):
        return list(e[3])
    if kind in (_SET_DATA,):
        return [e[2]]
    if kind == _ASSERT_FINITE:
        return [e[1]]
    out: list[int] = []
    if kind == _SET_GRAD:
        _value_slots(e[2], out)
    elif kind == _BACKWARD:
        for _, value in e[2]:
            _value_slots(value, out)
    return out


def _dataflow(program: list) -> tuple[dict[int, list[int]], dict[int, int]]:
    """(slot -> the entries reading it, slot -> the entry producing it)."""
    readers: dict[int, list[int]] = {}
    producer: dict[int, int] = {}
    for n, e in enumerate(program):
        for slot in _reads(e):
            readers.setdefault(slot, []).append(n)
        if e[0] == _KERNEL:
            producer[e[5]] = n
        elif e[0] == _FUSED:
            for slot in e[5]:
                if slot >= 0:
                    producer[slot] = n
        elif e[0] in (_LOAD, _ARG, _GRAD, _FRESH):
            producer[e[1]] = n
    return readers, producer


def _push_row_gathers(program: list, meta: list, spec: tuple) -> tuple[list, list]:
    """Compute only the rows a step reads of an SpMM's output.

    Semi-supervised node classification computes ``A @ (H W) + b`` for every node and then reads
    the rows of its training nodes (``logits[mask]``): on Cora 140 of 2708.  Where a captured step
    does exactly that -- an SpMM, optionally a row-vector add, then a gather of sorted, distinct
    rows, with no other use of the intermediates -- the replay multiplies only those rows of ``A``
    (``Pattern.take_rows``, cached per graph and rows) and, in the fused backward, ``dX = Aᵀ dY``
    from those rows' gradients alone instead of the scattered full one (which is zero elsewhere).
    The numbers are bit for bit the eager ones: each kept row is summed in the same order, and the
    skipped terms of the backward are exact zeros (``x + 0.0 == x`` for the accumulators, which
    start at +0.0), unless ``A`` holds an infinity or NaN (``inf * 0``): a check of ``A``'s values
    each replay makes such a replay a fault, and the call runs eagerly.
    """
    results = _result_slots(spec)
    program, meta = list(program), list(meta)
    done: set[int] = set()
    while True:
        readers, producer = _dataflow(program)
        for n, e in enumerate(program):
            if n in done or e[0] != _KERNEL or e[2] != (Op.GETITEM, "dense"):
                continue
            plan = _row_gather_plan(program, meta, readers, producer, results, n)
            if plan is not None:
                program, meta, done = _apply_row_gather(program, meta, plan, done)
                break
        else:
            return program, meta


def _row_gather_plan(program: list, meta: list, readers: dict, producer: dict, results: set,
                     n: int) -> dict | None:
    e = program[n]
    index = e[4].get("index")
    if not (isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], np.ndarray)):
        return None
    rows = index[0]
    a = e[3][0]
    be, shape, dtype = meta[a]
    if len(shape) != 2 or rows.ndim != 1 or rows.dtype.kind not in "iu" or not 0 < 2 * rows.shape[0] <= shape[0]:
        return None
    if not (rows[0] >= 0 and rows[-1] < shape[0] and bool((rows[1:] > rows[:-1]).all())):
        return None  # sorted and distinct: each kept row, and the backward, keep eager's order
    if readers.get(a) != [n] or a in results:
        return None
    add = producer.get(a)
    s = a
    if add is not None and program[add][0] == _KERNEL and program[add][2] == (Op.ADD, "dense"):
        s, bias = program[add][3]
        if meta[bias][1] != (shape[1],) or meta[s][1] != shape or readers.get(s) != [add] or s in results:
            return None
    else:
        add = None
    mm = producer.get(s)
    if mm is None or program[mm][0] != _KERNEL or program[mm][2] != (Op.SPMM, "csr"):
        return None
    pattern = program[mm][4].get("pattern")
    if not isinstance(pattern, Pattern) or pattern.shape[0] != shape[0] or meta[s][1] != shape:
        return None
    values, x = program[mm][3]
    # after an optimizer step a replay cannot re-run eagerly, so the finiteness check the backward
    # rewrite needs could not fall back: there only the forward rows (which need no check) change
    stepped = any(p[0] == _HOST and not p[2] for p in program[:mm])
    vjp = None if stepped else _scattered_spmm_backward(program, readers, index, shape, values, x, pattern)
    return {"getitem": n, "add": add, "spmm": mm, "rows": rows, "pattern": pattern, "values": values,
            "x": x, "s": s, "a": a, "vjp": vjp}


def _scattered_spmm_backward(program: list, readers: dict, index: tuple, shape: tuple, values: int, x: int,
                             pattern: Pattern) -> tuple[int, int] | None:
    """(entry, slot of the gathered rows' gradient) of the fused SpMM backward that reads the
    gradient ``index_add`` scatters back from the gather, when there is one (and dA is not asked)."""
    found = None
    for f in program:
        if (f[0] == _KERNEL and f[2] == (Op.INDEX_ADD, "dense") and f[4].get("shape") == shape
                and _same(f[4].get("index"), index)):
            for r in readers.get(f[5], []):
                g = program[r]
                if (g[0] == _FUSED and g[2] == (Op.SPMM, "csr") and g[3] == (f[5], values, x)
                        and g[4].get("pattern") is pattern and not g[4].get("needs", (True,))[0]):
                    found = (r, f[3][0])
    return found


def _apply_row_gather(program: list, meta: list, plan: dict, done: set) -> tuple[list, list, set]:
    sub, positions = plan["pattern"].take_rows(plan["rows"])
    k, width = plan["rows"].shape[0], meta[plan["a"]][1][1]
    vbe, _, vdtype = meta[plan["values"]]
    sub_values = len(meta)
    meta.append((vbe, (positions.shape[0],), vdtype))
    mm = program[plan["spmm"]]
    be, _, dtype = meta[plan["s"]]
    meta[plan["s"]] = (be, (k, width), dtype)
    program[plan["spmm"]] = (_KERNEL, mm[1], mm[2], (sub_values, plan["x"]), {**mm[4], "pattern": sub},
                             plan["s"], (k, width))
    if plan["add"] is not None:
        add = program[plan["add"]]
        abe, _, adtype = meta[plan["a"]]  # the sum's own dtype (a float64 bias promotes)
        meta[plan["a"]] = (abe, (k, width), adtype)
        program[plan["add"]] = (*add[:6], (k, width))
    g = program[plan["getitem"]]  # the gather is now the identity: a view, for the slot's readers
    program[plan["getitem"]] = (_KERNEL, g[1], (Op.RESHAPE, "dense"), (plan["a"],), {"shape": (k, width)},
                                g[5], (k, width))
    before: list[tuple] = [(_KERNEL, vbe, (Op.GETITEM, "dense"), (plan["values"],), {"index": (positions,)},
                            sub_values, (positions.shape[0],))]
    if plan["vjp"] is not None:
        r, grad_rows = plan["vjp"]
        f = program[r]
        program[r] = (_FUSED, f[1], f[2], (grad_rows, sub_values, plan["x"]), {**f[4], "pattern": sub}, f[5])
        before.insert(0, (_ASSERT_FINITE, plan["values"]))  # inf * 0 in the skipped terms: eager's NaN
    at = plan["spmm"]
    program = program[:at] + before + program[at:]
    shifted = {i + len(before) if i >= at else i for i in done}
    return program, meta, shifted | {plan["getitem"] + len(before)}


class _NotFinite(Exception):
    def __init__(self) -> None:
        super().__init__("a rewritten replay met a non-finite sparse value (the eager step gives NaN there)")


def _all_finite(array: Any) -> bool:
    if isinstance(array, np.ndarray) or hasattr(array, "__array_namespace__"):
        xp = array.__array_namespace__() if hasattr(array, "__array_namespace__") else np
        return bool(xp.isfinite(array).all())
    return bool(((array - array) == 0).all())  # any array type: x - x is 0 exactly when x is finite


# -- replay -------------------------------------------------------------------------------------------

def _make(buf: list, meta: list, slot: int) -> Tensor:
    be, shape, dtype = meta[slot]
    return Tensor._make(buf[slot], be, shape, dtype)


def _rebuild(value: tuple, buf: list, meta: list) -> Any:
    kind = value[0]
    if kind == 1:
        return _make(buf, meta, value[1])
    if kind == 0:
        return None
    if kind == 2:
        return value[1]
    return SparseTensor._wrap(value[1], _rebuild(value[2], buf, meta))


def _result(spec: tuple, buf: list, meta: list, flat: list) -> Any:
    kind, payload = spec[0], spec[1]
    if kind == "tensor":
        return _rebuild(payload, buf, meta)
    if kind == "const":
        return payload
    if kind == "item":
        be = meta[payload][0]
        return be.to_numpy(buf[payload]).reshape(()).item()
    if kind == "dict":
        return {k: _result(v, buf, meta, flat) for k, v in payload}
    if kind == "arg":
        return flat[payload]
    items = [_result(v, buf, meta, flat) for v in payload]
    return items if kind == "list" else tuple(items)


class _HostFailed(Exception):
    """Internal: host code (an optimizer call) raised during a replay; its error is the user's."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


def _small(kernel: Callable, size: int) -> Callable:
    """``kernel``'s variant for outputs of fewer than ``size`` elements, if it declares one.

    A kernel may carry ``polygrad_small = (kernel, small, max_elements)``: for outputs of fewer
    than ``max_elements`` elements ``small(*args)`` returns what ``kernel(*args)`` does, without
    its checks for large outputs (the numpy backend's pooled ufuncs: the raw ufunc).  Honoured only
    when the tuple names ``kernel`` itself, so a wrapper that copied the attribute along with the
    function's ``__dict__`` (``functools.wraps``), e.g. an injected fault, is called as it is.
    """
    declared = getattr(kernel, "polygrad_small", None)
    if declared is not None and declared[0] is kernel and declared[2] >= size:
        return declared[1]
    return kernel


def _generate(cap: _Capture) -> Callable[[list, dict, dict], Any] | None:
    """The program as one Python function: a line per entry, buffers as local variables that are
    deleted after their last use.  This is what makes a replay cheap (no loop, no dispatch on the
    entry kind, no argument lists built per call).  None when the program has kernels after a
    non-idempotent host call: a fault there must be handled in place, which the interpreter does;
    and for programs longer than ``MAX_GENERATED`` entries, whose source would take longer to compile
    than the interpreter loses on them.
    """
    if len(cap.program) > MAX_GENERATED:
        return None
    stepped = False
    for e in cap.program:
        if e[0] == _HOST and not e[2]:
            stepped = True
        elif stepped and e[0] in (_KERNEL, _FUSED):
            return None
    env: dict[str, Any] = {"MAKE": Tensor._make, "WRAP": SparseTensor._wrap, "HostFailed": _HostFailed, "SMALL": _small,
                           "FINITE": _all_finite, "NotFinite": _NotFinite,
                           "RESULT": _result, "SPEC": cap.spec, "META": cap.meta, "Mismatch": _ShapeMismatch}
    body: list[list[str]] = []      # the lines of each entry
    reads: list[list[int]] = []     # the slots each entry reads
    tables: dict[tuple, str] = {}   # (vjp?, backend name, key) -> local name of the kernel
    small: dict[str, int] = {}      # local name of a kernel -> the output size its small variant serves

    def const(value: Any) -> str:
        name = f"C{len(env)}"
        env[name] = value
        return name

    def kernel(fused: bool, be, key: tuple) -> str:
        ident = (fused, be.name, key)
        if ident not in tables:
            tables[ident] = f"k{len(tables)}"
        return tables[ident]

    def small_kernel(be, key: tuple, shape: tuple) -> str:
        """The kernel's small-output variant for a call site whose output has fewer elements than
        the kernel declares (``polygrad_small``, see :func:`_small`), else the kernel itself."""
        name = kernel(False, be, key)
        declared = getattr(registry.tables.get(be.name, {}).get(key), "polygrad_small", None)
        if declared is None or int(np.prod(shape, dtype=np.int64)) >= declared[2]:
            return name
        small[name] = declared[2]
        return f"{name}s"

    def shape_check(var: str, be, shape: tuple) -> str:
        default = type(be).shape is _default_shape
        got = f"{var}.shape" if default else f"{const(be.shape)}({var})"
        return f"if {got} != {const(shape)}: raise Mismatch({const(shape)}, {got})"

    def target(ref: Any) -> str:
        return f"flat[{ref}]" if type(ref) is int else const(ref)

    def rebuild(value: tuple) -> str:
        if value[0] == 1:
            be, shape, dtype = cap.meta[value[1]]
            return f"MAKE(b{value[1]}, {const(be)}, {const(shape)}, {const(dtype)})"
        if value[0] == 0:
            return "None"
        if value[0] == 2:
            return const(value[1])
        return f"WRAP({const(value[1])}, {rebuild(value[2])})"

    def call_args(ins: tuple, kwargs: dict) -> str:
        args = [f"b{i}" for i in ins]
        if all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in kwargs):
            args += [f"{k}={const(v)}" for k, v in kwargs.items()]
        elif kwargs:
            args.append(f"**{const(kwargs)}")
        return ", ".join(args)

    for e in cap.program:
        kind = e[0]
        lines: list[str] = []
        if kind == _KERNEL:
            _, be, key, ins, attrs, out, shape = e
            lines = [f"b{out} = {small_kernel(be, key, shape)}({call_args(ins, attrs)})",
                     shape_check(f"b{out}", be, shape)]
        elif kind == _FUSED:
            _, be, key, ins, kwargs, outs = e
            lines = [f"r = {kernel(True, be, key)}({call_args(ins, kwargs)})"]
            for i, slot in enumerate(outs):
                if slot >= 0:
                    lines += [f"b{slot} = r[{i}]", shape_check(f"b{slot}", be, cap.meta[slot][1])]
        elif kind == _LOAD:
            lines = [f"b{e[1]} = {const(e[2])}._data"]
        elif kind == _ARG:
            lines = [f"b{e[1]} = flat[{e[2]}]._data"]
        elif kind == _GRAD:
            lines = [f"b{e[1]} = {const(e[2])}.grad._data"]
        elif kind == _FRESH:
            lines = [f"b{e[1]} = {const(e[2])}(){'' if e[3] else '._data'}"]
        elif kind == _HOST:
            lines = ["try:", f"    {const(e[1])}()", "except Exception as exc:", "    raise HostFailed(exc)"]
        elif kind == _SET_GRAD:
            lines = [f"{target(e[1])}.grad = {rebuild(e[2])}"]
        elif kind == _SET_DATA:
            lines = [f"{target(e[1])}._data = b{e[2]}"]
        elif kind == _ASSERT_FINITE:
            lines = [f"if not FINITE(b{e[1]}): raise NotFinite()"]
        # _BACKWARD only fires an event: the generated path runs only while no one listens
        body.append(lines)
        reads.append(_reads(e))
    result_slots = sorted(_result_slots(cap.spec))
    last: dict[int, int] = {}
    for n, used in enumerate(reads):
        for slot in used:
            last[slot] = n
    dies: dict[int, list[int]] = {}  # entry -> the slots nothing reads after it
    for slot, n in last.items():
        if slot not in result_slots:
            dies.setdefault(n, []).append(slot)
    src = ["def replay(flat, tables, vjp_tables):"]
    for (fused, name, key), local in tables.items():
        src.append(f"    {local} = {'vjp_tables' if fused else 'tables'}[{name!r}][{const(key)}]")
        if local in small:
            src.append(f"    {local}s = SMALL({local}, {small[local]})")
    for n, lines in enumerate(body):
        src += [f"    {line}" for line in lines]
        if n in dies:
            src.append(f"    del {', '.join(f'b{s}' for s in sorted(dies[n]))}")
    src.append(f"    return RESULT(SPEC, {{{', '.join(f'{s}: b{s}' for s in result_slots)}}}, META, flat)")
    exec(builtins.compile("\n".join(src), "<pg.compile replay>", "exec"), env)
    return env["replay"]


def _result_slots(spec: tuple) -> set[int]:
    kind, payload = spec[0], spec[1]
    if kind == "tensor":
        value = payload
        while value[0] == 3:
            value = value[2]
        return {value[1]} if value[0] == 1 else set()
    if kind == "item":
        return {payload}
    if kind in ("const", "arg"):
        return set()
    if kind == "dict":
        return set().union(*[_result_slots(v) for _, v in payload])
    return set().union(*[_result_slots(v) for v in payload])


class _ShapeMismatch(Exception):
    def __init__(self, want: tuple, got: tuple):
        super().__init__(f"a replayed kernel returned shape {got}, the capture saw {want}")


def _replay(cap: _Capture, flat: list) -> Any:
    """Run ``cap``'s program; a failing kernel raises _ReplayFault."""
    buf: list = [None] * len(cap.meta)
    tables = registry.tables
    events = registry.events
    checked = config.validate or events["polygrad_op_executed"] is not None
    after_step = False
    started = time.perf_counter()
    for e in cap.program:
        kind = e[0]
        if kind == _KERNEL:
            _, be, key, ins, attrs, out, shape = e
            try:
                array = tables[be.name][key](*[buf[i] for i in ins], **attrs)
                if be.shape(array) != shape:
                    raise PolygradError(f"replayed kernel for op '{key[0]}' on backend {be.name!r} returned "
                                        f"shape {be.shape(array)}, the capture saw {shape}")
            except Exception as exc:  # noqa: BLE001 - any fault: the caller re-runs the step eagerly
                if not after_step:
                    raise _ReplayFault(exc, after_step) from exc
                array = _fallback_in_place(e, buf, cap.meta, exc)
            buf[out] = array
            if checked:
                _check(e, buf, cap.meta, events)
        elif kind == _LOAD:
            buf[e[1]] = e[2]._data
        elif kind == _ASSERT_FINITE:
            if not _all_finite(buf[e[1]]):
                raise _ReplayFault(_NotFinite(), after_step)
        elif kind == _ARG:
            buf[e[1]] = flat[e[2]]._data
        elif kind == _FUSED:
            _, be, key, ins, kwargs, outs = e
            try:
                arrays = registry.vjp_tables[be.name][key](*[buf[i] for i in ins], **kwargs)
                for slot, array in zip(outs, arrays):
                    if slot >= 0:
                        if be.shape(array) != cap.meta[slot][1]:
                            raise PolygradError(f"replayed fused backward of '{key[0]}' returned shape "
                                                f"{be.shape(array)}, the capture saw {cap.meta[slot][1]}")
                        buf[slot] = array
            except Exception as exc:  # noqa: BLE001
                raise _ReplayFault(exc, after_step) from exc
        elif kind == _GRAD:
            g = e[2].grad
            if g is None:
                raise _ReplayFault(PolygradError("a gradient the capture accumulated into is gone"), after_step)
            buf[e[1]] = g._data
        elif kind == _FRESH:
            buf[e[1]] = e[2]() if e[3] else e[2]()._data
        elif kind == _HOST:
            e[1]()
            after_step = after_step or not e[2]
        elif kind == _SET_GRAD:
            t = flat[e[1]] if type(e[1]) is int else e[1]
            t.grad = _rebuild(e[2], buf, cap.meta)
        elif kind == _SET_DATA:
            t = flat[e[1]] if type(e[1]) is int else e[1]
            t._data = buf[e[2]]
        elif kind == _BACKWARD:
            ev = events["polygrad_backward_finished"]
            if ev is not None:
                grads = []
                for ref, value in e[2]:
                    leaf = flat[ref] if type(ref) is int else ref
                    grads.append((leaf, _rebuild(value, buf, cap.meta)))
                ev(num_nodes=e[1], seconds=time.perf_counter() - started, grads=grads)
    return _result(cap.spec, buf, cap.meta, flat)


def _inputs(e: tuple, buf: list, meta: list) -> tuple:
    return tuple(_make(buf, meta, i) for i in e[3])


def _check(e: tuple, buf: list, meta: list, events) -> None:
    """POLYGRAD_VALIDATE shadow check and the op-executed event, for one replayed kernel."""
    _, be, key, _ins, attrs, out, _shape = e
    inputs = _inputs(e, buf, meta)
    if config.validate:
        validate_against_reference(key[0], inputs, attrs, key[1], buf[out])
    ev = events["polygrad_op_executed"]
    if ev is not None:
        ev(op=key[0].value, backend=be.name, layout=key[1], inputs=inputs, output=_make(buf, meta, out))


def _fallback_in_place(e: tuple, buf: list, meta: list, exc: BaseException) -> Any:
    """A kernel failed after the optimizer stepped (re-running the call would step twice): recompute
    just this kernel through the usual fallback chain."""
    _, be, key, _ins, attrs, out, shape = e
    array, _ = fallback(key[0], _inputs(e, buf, meta), attrs, key[1], shape, meta[out][2], exc)
    return array


# -- guards ---------------------------------------------------------------------------------------------

def _flatten(x: Any, flat: list, key: list) -> None:
    """Append ``x``'s tensors to ``flat`` and what the guard compares to ``key``."""
    if isinstance(x, Tensor):
        if isinstance(x, SparseTensor):
            key.append(("sparse", x.pattern, x.dtype, x._be.name, x.requires_grad))
            flat.append(x._values)
        else:
            key.append(("tensor", x.shape, x.dtype, x._be.name, x.requires_grad))
            flat.append(x)
    elif x is None or isinstance(x, (bool, int, float, str, np.number)):
        key.append((type(x), x))
    elif isinstance(x, (tuple, list)):
        key.append((type(x), len(x)))
        for v in x:
            _flatten(v, flat, key)
    elif isinstance(x, dict):
        key.append((dict, tuple(x)))
        for v in x.values():
            _flatten(v, flat, key)
    elif isinstance(x, np.ndarray):
        raise CompileError(f"pg.compile: a numpy array argument {x.shape} would be frozen into the capture; "
                           "pass pg.tensor(array) instead")
    elif hasattr(x, "training") and callable(getattr(x, "modules", None)):  # a module (e.g. self)
        key.append(("module", x, tuple(m.training for m in x.modules())))
    else:  # optimizers, callables, other objects: by identity (their tensors are read live)
        key.append(("object", x))


def _modules_of(fn: Callable, found: dict, tensors: dict, depth: int = 0) -> None:
    """Modules ``fn`` reaches through its closure, its ``self`` and the globals it names (train/eval
    mode is a guard), and tensors it reaches there: directly, in a list or tuple, as parameters of
    those modules or of an optimizer (whether they have a gradient when a call starts is a guard).
    Duck-typed: a module has ``modules()`` and a ``training`` flag, an optimizer ``param_groups``."""
    if depth > 3:
        return
    candidates: list = []
    if isinstance(fn, types.MethodType):
        candidates.append(fn.__self__)
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if code is None:
        candidates.append(fn)
    else:
        candidates.extend(c.cell_contents for c in (fn.__closure__ or ()) if _filled(c))
        g = getattr(fn, "__globals__", {})
        candidates.extend(g[n] for n in code.co_names if n in g)
    for obj in candidates:
        if hasattr(obj, "training") and callable(getattr(obj, "modules", None)):
            for m in obj.modules():
                found[id(m)] = m
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            _modules_of(obj, found, tensors, depth + 1)
        elif isinstance(obj, Tensor):
            tensors[id(obj)] = obj
        elif isinstance(obj, (list, tuple)) and len(obj) <= 10_000:
            tensors.update((id(t), t) for t in obj if isinstance(t, Tensor))
        elif isinstance(getattr(obj, "param_groups", None), list):
            tensors.update((id(p), p) for g in obj.param_groups for p in g.get("params", ()))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return False
    return True


# -- the compiled function ---------------------------------------------------------------------------

class _Entry:
    __slots__ = ("capture", "candidate", "eager_calls", "failures", "reason")

    def __init__(self) -> None:
        self.capture: _Capture | None = None
        self.candidate: _Capture | None = None  # a first capture awaiting its check
        self.eager_calls = 0
        self.failures = 0
        self.reason = ""


class Compiled:
    """``fn`` with capture and replay (see :func:`compile`).  ``stats`` counts eager calls,
    captures, replays, re-captures, dropped captures and refusals; ``reason`` says why the last
    refused capture was refused."""

    def __init__(self, fn: Callable, cache_size: int = 8, warmup: int = 1, modules: Any = None,
                 enabled: bool = True):
        if cache_size < 1 or warmup < 0:
            raise ValueError(f"pg.compile: cache_size must be >= 1 and warmup >= 0, got {cache_size}, {warmup}")
        self.fn = fn
        self.cache_size = cache_size
        self.warmup = warmup
        self.enabled = enabled
        found: dict = {}
        tensors: dict = {}
        _modules_of(fn, found, tensors)
        if modules is not None:
            found = {}
            for m in (modules if isinstance(modules, (list, tuple)) else [modules]):
                for sub in m.modules():
                    found[id(sub)] = sub
        self._modules = list(found.values())
        self._tensors = list(tensors.values())
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"eager": 0, "captures": 0, "replays": 0, "recaptures": 0, "dropped": 0, "refused": 0}
        self.reason = ""
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = getattr(fn, "__name__", "compiled")

    def _key(self, args: tuple, kwargs: dict) -> tuple[list, tuple]:
        flat: list = []
        parts: list = []
        _flatten(args, flat, parts)
        if kwargs:
            _flatten(kwargs, flat, parts)
        events = registry.events
        parts.append((is_grad_enabled(), get_backend(), config.fallback, config.validate,
                      repr(config.fallback_chain), config.sparse_threshold, config.sparse_min_elements,
                      config.memory_fraction, tuple(m.training for m in self._modules),
                      events["polygrad_op_executed"] is not None,
                      events["polygrad_backward_finished"] is not None))
        return flat, tuple(parts)

    def _entry(self, key: tuple) -> _Entry:
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = _Entry()
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            return entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled or _recording.get() is not None:  # nested in a capture: part of it
            return self.fn(*args, **kwargs)
        flat, key = self._key(args, kwargs)
        entry = self._entry(key)
        cap = entry.capture
        if cap is not None:
            if cap.still_valid(flat):
                state = rng().bit_generator.state if cap.fresh_draws else None
                try:
                    out = self._run(cap, flat)
                except _ReplayFault as fault:
                    entry.capture = None
                    self.stats["dropped"] += 1
                    if fault.after_step:  # a step already ran: re-running the call would repeat it
                        raise fault.exc
                    if state is not None:  # the eager re-run draws the same dropout masks
                        rng().bit_generator.state = state
                    self.stats["eager"] += 1
                    return self.fn(*args, **kwargs)
                self.stats["replays"] += 1
                return out
            entry.capture = None
            self.stats["recaptures"] += 1
        if entry.eager_calls < self.warmup or entry.failures >= 2:
            entry.eager_calls += 1
            self.stats["eager"] += 1
            return self.fn(*args, **kwargs)
        return self._capture(entry, flat, args, kwargs)

    @staticmethod
    def _run(cap: _Capture, flat: list) -> Any:
        events = registry.events
        if (cap.fast is None or config.validate or events["polygrad_op_executed"] is not None
                or events["polygrad_backward_finished"] is not None):
            return _replay(cap, flat)  # the interpreter: validation and events per kernel
        try:
            return cap.fast(flat, registry.tables, registry.vjp_tables)
        except _HostFailed as failed:
            raise failed.exc from None
        except Exception as exc:  # noqa: BLE001 - a kernel fault: the caller re-runs eagerly
            raise _ReplayFault(exc, False) from exc

    def _capture(self, entry: _Entry, flat: list, args: tuple, kwargs: dict) -> Any:
        state = [t._values if isinstance(t, SparseTensor) else t for t in self._tensors]
        arg_modules = [x for x in args if hasattr(x, "training") and callable(getattr(x, "modules", None))]
        for m in (*self._modules, *arg_modules):  # at capture time only: parameter lists walked once
            state += [p._values if isinstance(p, SparseTensor) else p for p in m.parameters()]
        rec = _Recorder(flat, state)
        token = _recording.set(rec)
        try:
            out = self.fn(*args, **kwargs)
        finally:
            _recording.reset(token)
        try:
            cap = rec.finish(out)
            self.stats["captures"] += 1
            if entry.candidate is None:  # the first capture is checked against a second one
                entry.candidate = cap
                return out
            why = _mismatch(entry.candidate, cap)
            entry.candidate = None
            if why is not None:
                raise _Refused(why)
            entry.capture = cap
        except _Refused as why:
            entry.failures += 1
            entry.reason = self.reason = str(why)
            self.stats["refused"] += 1
            if entry.failures == 2:
                warnings.warn(f"pg.compile({self.__name__}): runs eagerly: {why}", RuntimeWarning, stacklevel=3)
        return out

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """``@pg.compile`` on a method: ``obj.step(x)`` calls the compiled function with ``obj``
        first (an argument like the others: a module's train/eval mode is part of the guard)."""
        return self if obj is None else types.MethodType(self, obj)

    def clear(self) -> None:
        """Forget every capture (the next calls warm up and capture again)."""
        with self._lock:
            self._cache.clear()


def compile(fn: Callable | None = None, *, cache_size: int = 8, warmup: int = 1, modules: Any = None,
            enabled: bool = True) -> Any:  # noqa: A001 - pg.compile, like torch.compile
    """Capture ``fn`` (a training or inference step) once and replay its kernels afterwards.

    Use as ``step = pg.compile(fn)`` or as a decorator (``@pg.compile`` or
    ``@pg.compile(cache_size=4)``).  ``warmup`` eager calls precede the capture; ``cache_size``
    captures (one per guard key) are kept, least recently used first out; ``modules`` names the
    modules whose train/eval mode is a guard (default: those ``fn`` reaches); ``enabled=False``
    always runs ``fn`` eagerly.  See the module docstring for what is replayed and guarded.
    """
    if fn is None:
        return lambda f: Compiled(f, cache_size, warmup, modules, enabled)
    return Compiled(fn, cache_size, warmup, modules, enabled)
