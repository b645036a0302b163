"""The recorder: the hooks the rest of polygrad calls while a capture runs (dispatch, autodiff, the
optimizer, dropout, host reads), all in one place, and the recorder that turns one eager run into
a program."""
from __future__ import annotations

from itertools import chain
from typing import Any, Callable, NamedTuple

import numpy as np

from ..engine.dispatch import _recording
from ..ir.ops import kernel_key
from ..sparse import SparseTensor
from ..tensor import Tensor
from .guards import StateGuards, hyperparameters, param_lists
from .program import (ARG, BACKWARD, CALL, FRESH, FUSED, GRAD, HOST, KERNEL, LOAD, SET_DATA, SET_GRAD, SET_STATE,
                      STATE, Arg, Backward, Call, Capture, Fresh, Fused, Grad, Host, Kernel, Load, SetData, SetGrad,
                      SetState, State, _Refused)


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


class _Tupled(NamedTuple):
    """``fn`` returning its one array as a tuple of one, as a :class:`Call`'s function returns its
    results; equal to another wrapping an equal ``fn`` (two captures of one draw compare equal)."""
    fn: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        return (self.fn(*args, **kwargs),)


def _checked(*numbers: Any) -> tuple:
    """The function of a :meth:`_Recorder.check` Call: nothing (its ``numbers`` is the check)."""
    return ()


def _crossable(e: tuple, owner: Any) -> bool:
    """Whether a check of optimizer ``owner`` may run before entry ``e``: not a host call, or one
    that changes nothing it reads (idempotent: ``zero_grad``; another optimizer's counters:
    a host whose ``counters_only`` is set)."""
    return (e[0] != HOST or e[2]
            or (getattr(e[1], "counters_only", False) and getattr(e[1], "__self__", None) is not owner))


def _draws_nothing(method: Any) -> bool:
    """A host call known not to draw random numbers: an optimizer's ``zero_grad`` or step counters."""
    return bool(getattr(method, "counters_only", False)) or (
        getattr(method, "__name__", None) == "zero_grad" and hasattr(getattr(method, "__self__", None), "param_groups"))


def keyed_call(be: Any, fn: Callable[..., Any], attrs: dict, numbers: Callable[[], tuple]) -> Any:
    """``fn(*numbers(), **attrs)``: an array made on backend ``be`` from host numbers alone (a random
    draw from a key: ``numbers`` draws the key).  A capture records it as a :class:`Call`, so every
    replay calls ``numbers()`` again (a new key, in eager order) and a backend that compiles the step
    traces ``fn`` itself (the draw happens on the device)."""
    drawn = numbers()
    array = fn(*drawn, **attrs)
    rec = _recording.get()
    if rec is not None:
        rec.call(be, _Tupled(fn), attrs, numbers, (), (array,))
    return array


def update_recorder() -> "_Recorder | None":
    """The capture running now, if any: an optimizer whose update rules are pure array functions
    reports each parameter's update to it (:meth:`_Recorder.update`) instead of stepping as host
    code, so the update becomes part of the program a backend may compile."""
    return _recording.get()


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


def note_module(module: Any) -> None:
    """``Module.__call__`` reports each module that runs: a capture guards its train/eval mode."""
    rec = _recording.get()
    if rec is not None:
        rec.module(module)


def note_group_write(key: str, frame: Any) -> None:
    """An optimizer's parameter group is written from ``frame``: while a capture runs, a write from
    outside ``polygrad.optim`` (whose optimizers and schedulers are replayed host calls) is the
    step's Python setting a hyper-parameter, which a replay would not repeat."""
    rec = _recording.get()
    if rec is not None and not str(frame.f_globals.get("__name__", "")).startswith("polygrad.optim"):
        rec.refuse(f"the step sets an optimizer's {key!r} in Python (a warm-up?); a replay would not "
                   "(a scheduler's step() is replayed: use one)")


def _state_of(optimizer: Any, key: int, name: str) -> Any:
    return optimizer.state.get(key, {}).get(name)


# -- the recorder -------------------------------------------------------------------------------------

class _Recorder:
    """Turns one eager run into a program.  Buffers ("slots") are identified by array identity, so
    views that share storage (``detach``, ``.data``) resolve to the kernel that produced them."""

    def __init__(self, flat: list, state: list, optimizers: Any = ()):
        self.program: list[Any] = []  # Entry named tuples
        self.meta: list[tuple] = []          # slot -> (backend, shape, dtype)
        self.slot_of: dict[int, int] = {}    # id(array) -> slot
        self.keep: list[Any] = []            # everything whose id is a key above stays alive
        self.slot_arrays: list[Any] = []     # slot -> the array it held in this run
        self.arg_index = {id(t): i for i, t in enumerate(flat)}
        self.watched: list[tuple[Tensor, Any]] = []   # (tensor, ref: arg index or the tensor)
        self.baseline: dict[int, list] = {}  # id(tensor) -> [grad, storage] at the last sync
        self.grad_owner: dict[int, Tensor] = {}       # id(a gradient tensor) -> the tensor it is .grad of
        self.grad_guard: list[tuple[Any, bool]] = []  # (ref, had a grad when the call started)
        self.items: dict[int, tuple[int, Any]] = {}   # id(Python number from .item()) -> (slot, number)
        # whether each tensor the step can reach had a gradient when the call started (the step may
        # clear it with p.grad = None before the recorder first sees p)
        self.had_grad = {id(t): t.grad is not None for t in (*state, *flat)}
        for opt in optimizers:  # and each known optimizer's parameters: its step skips those without one
            for p in chain.from_iterable(param_lists(opt)):
                self.had_grad.setdefault(id(p), p.grad is not None)
        self.host_pending = False
        self.hosts = 0
        self.problem: str | None = None
        self.computed: set[int] = set()      # id(array) of everything the step's kernels produced
        self.host_guards: list[tuple[Any, np.ndarray]] = []  # (ref, values read on the host)
        self.host_seen: set[int] = set()
        # what else a replay must find unchanged (see Capture.still_valid)
        self.requires_grad_guard: list[tuple[Any, bool]] = []  # (ref, requires_grad) of each tensor read
        self.module_guard: dict[int, tuple[Any, bool]] = {}    # id(module) -> (module, training)
        self.optimizer_guard: dict[int, tuple[Any, tuple]] = {}  # id(optimizer) -> (it, its param lists)
        self.array_guard: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(array) -> (it, a copy)
        # optimizer state arrays an update read or wrote: (optimizer, key, name) -> [the array at the last sync]
        self.state_cells: dict[tuple[int, int, str], list] = {}
        # each optimizer's hyperparameters (lr...) as host calls left them: a change between two
        # host calls is Python setting them, which a replay would not repeat
        self.hyper: dict[int, tuple[Any, tuple]] = {id(o): (o, hyperparameters(o)) for o in optimizers}

    def refuse(self, reason: str) -> None:
        if self.problem is None:
            self.problem = reason

    # slots
    def _produce(self, array: Any, be, shape: tuple, dtype) -> int:
        slot = len(self.meta)
        self.meta.append((be, shape, dtype))
        self.slot_of[id(array)] = slot
        self.keep.append(array)
        self.slot_arrays.append(array)
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
            self.program.append(Arg(ARG, slot, index))
            self._watch(t, index)
        elif owner is not None and owner.grad is t:  # gradient accumulation: read the live .grad
            self.program.append(Grad(GRAD, slot, owner))
        else:
            self.program.append(Load(LOAD, slot, t))
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
        self.requires_grad_guard.append((ref, bool(t.requires_grad)))
        had = self.had_grad.get(id(t))
        if had is None and self.hosts == 0:
            had = t.grad is not None
        if had is not None:  # the state at the start of the call: a replay must find the same
            self.grad_guard.append((ref, had))

    def _check_hyper(self) -> None:
        for opt, seen in self.hyper.values():
            if hyperparameters(opt) != seen:
                self.refuse("the step sets an optimizer's hyperparameters (a learning rate?) in Python; "
                            "a replay would not (a scheduler's step() is replayed: use one)")

    def _settle(self) -> None:
        """After a host call: what it changed (new storage, cleared grads) is the new baseline."""
        if self.host_pending:
            self.host_pending = False
            for key, (opt, _) in self.hyper.items():  # a host call (a scheduler) may set them
                self.hyper[key] = (opt, hyperparameters(opt))
            for t, _ in self.watched:
                self.baseline[id(t)] = [t.grad, t._data]
            for cell in self.state_cells.values():
                cell[3] = _state_of(cell[0], cell[1], cell[2])

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
                self.program.append(SetGrad(SET_GRAD, ref, self._value(g)))
                base[0] = g
            d = t._data
            if d is not base[1]:
                slot = self.slot_of.get(id(d))
                if slot is None:
                    self.refuse("host code replaced a tensor's storage outside the optimizer")
                    return
                self.program.append(SetData(SET_DATA, ref, slot))
                base[1] = d
        for cell in self.state_cells.values():
            opt, key, name, seen = cell
            now = _state_of(opt, key, name)
            if now is not seen:
                slot = self.slot_of.get(id(now))
                if slot is None:
                    self.refuse("an optimizer's state was replaced outside its recorded update")
                    return
                self.program.append(SetState(SET_STATE, opt, key, name, slot))
                cell[3] = now

    def _recordable(self, be: Any) -> bool:
        """Whether results computed by ``be`` can be recorded now: no earlier problem, pending work
        settled, and a backend that supports replay (else the capture is refused, saying why)."""
        if self.problem is not None:
            return False
        self._settle()
        if not getattr(be, "supports_replay", True):
            self.refuse(f"backend {be.name!r} does not support replay")
            return False
        return True

    # what dispatch, autodiff, the optimizer and dropout report
    def kernel(self, op, layout: str, be, inputs: tuple, attrs: dict, result: Tensor) -> None:
        if not self._recordable(be):
            return
        key = kernel_key(op, layout)  # dispatch's rule: both layouts share the canonical storage
        ins = tuple(self._input(t) for t in inputs)
        out = self._produce(result._data, be, result.shape, result.dtype)
        self.computed.add(id(result._data))
        self.program.append(Kernel(KERNEL, be, key, ins, dict(attrs), out, result.shape))

    def fused(self, be, key: tuple, inputs: tuple, kwargs: dict, grads: list) -> None:
        if self.problem is not None:
            return
        self._settle()
        ins = tuple(self._input(t) for t in inputs)
        outs = tuple(-1 if g is None else self._produce(g._data, be, g.shape, g.dtype) for g in grads)
        self.computed.update(id(g._data) for g in grads if g is not None)
        self.program.append(Fused(FUSED, be, key, ins, kwargs, outs))

    def fresh(self, make: Callable[[], Any], t: Tensor, raw: bool) -> None:
        self._settle()
        slot = self._produce(t._data, t._be, t.shape, t.dtype)
        self.computed.add(id(t._data))
        self.program.append(Fresh(FRESH, slot, make, raw))

    def call(self, be: Any, fn: Callable[..., Any], attrs: dict, numbers: Callable[[], tuple], inputs: tuple,
             outs: tuple) -> None:
        """A :class:`Call` of ``fn`` on ``inputs`` (slots) that returned the arrays ``outs``."""
        if not self._recordable(be):
            return
        slots = tuple(self._produce(a, be, tuple(be.shape(a)), be.dtype(a)) for a in outs)
        self.computed.update(id(a) for a in outs)
        self.program.append(Call(CALL, be, fn, dict(attrs), numbers, inputs, slots))

    def mark(self) -> int:
        """Where the program's next entry goes (after pending work is settled): a later
        :meth:`check` is inserted there."""
        self._settle()
        return len(self.program)

    def check(self, be: Any, numbers: Callable[[], tuple], at: int, owner: Any, always: bool) -> None:
        """A :class:`Call` of nothing whose ``numbers()`` raises :class:`StaleCapture` when what
        the capture assumed about ``owner`` (an optimizer: how it groups its updates) no longer
        holds, placed before the entries recorded after ``at`` (a :meth:`mark`) -- and earlier,
        before host calls that cannot change what it checks (``zero_grad``, another optimizer's
        step counters), so that it fails before a step rather than after one, where the call could
        not run eagerly any more.  ``always``: recorded even where it moved before no step (else
        only where it did: the update calls' own numbers check in time otherwise)."""
        if not self._recordable(be):
            return
        # no further back than needed: before the earliest step it may cross and the writes of
        # that step's results just before it (the check stays inside a backend's kernel region
        # where no step is crossed)
        pos, target = at, at
        while pos > 0 and _crossable(self.program[pos - 1], owner):
            pos -= 1
            if self.program[pos][0] == HOST and not self.program[pos][2]:
                target = pos
                while target > 0 and self.program[target - 1][0] in (SET_DATA, SET_STATE, SET_GRAD):
                    target -= 1
        if any(e[0] == HOST and not e[2] for e in self.program[:target]):
            # a host call that cannot be repeated (a scheduler's step before the optimizer's) runs
            # before this point: a fault here could not run the call eagerly and would stop the
            # user's training with StaleCapture.  The replay keeps the captured grouping instead:
            # the same finite values; only NaN payload and sign bits may then differ from eager's
            return
        if always or target != at:
            self.program.insert(target, Call(CALL, be, _checked, {}, numbers, (), ()))

    def update(self, optimizer: Any, key: int, fn: Callable[..., Any], attrs: dict, numbers: Callable[[], tuple],
               leaf: Tensor, grad: Tensor, reads: tuple, before: tuple, writes: tuple, outs: tuple) -> None:
        """``optimizer`` updated parameter ``leaf`` (``optimizer.state[key]`` its state): ``outs =
        fn(leaf, grad, *before, *numbers(), **attrs)``, ``before`` the state arrays named ``reads``;
        ``outs[0]`` becomes the parameter's storage and ``outs[1:]`` the state named ``writes``
        (recorded at the next sync, as :class:`SetData` and :class:`SetState`)."""
        self.update_many(optimizer, [(key, leaf, grad, before)], fn, attrs, numbers, reads, writes, outs)

    def update_many(self, optimizer: Any, members: list, fn: Callable[..., Any], attrs: dict,
                    numbers: Callable[[], tuple], reads: tuple, writes: tuple, outs: tuple) -> None:
        """One call ``outs = fn(*arrays, *numbers(), **attrs)`` updated several parameters (each
        ``(key, leaf, grad, before)``; ``arrays`` is each member's leaf, gradient and state arrays
        ``before`` named ``reads`` in turn, ``outs`` each member's new storage and state named
        ``writes`` in turn): an optimizer's update of small parameters as one concatenation, which
        a replay must repeat as one call to give eager's bits."""
        if self.problem is not None:
            return
        self._settle()
        ins = []
        for key, leaf, grad, before in members:
            ins += [self._input(leaf), self._input(grad)]
            for name, array in zip(reads, before):
                slot = self.slot_of.get(id(array))
                if slot is None:
                    slot = self._produce(array, leaf._be, tuple(leaf._be.shape(array)), leaf._be.dtype(array))
                    self.program.append(State(STATE, slot, optimizer, key, name))
                ins.append(slot)
            for name in writes:
                cell = (id(optimizer), key, name)
                if cell not in self.state_cells:
                    self.keep.append(optimizer)
                    self.state_cells[cell] = [optimizer, key, name, _state_of(optimizer, key, name)]
        self.call(members[0][1]._be, fn, attrs, numbers, tuple(ins), outs)

    def module(self, m: Any) -> None:
        if id(m) not in self.module_guard:
            self.module_guard[id(m)] = (m, bool(m.training))

    def host_array(self, array: np.ndarray) -> None:
        if id(array) not in self.array_guard:
            self.array_guard[id(array)] = (array, array.copy())

    def host(self, method: Callable[[], Any], idempotent: bool) -> None:
        owner = getattr(method, "__self__", None)
        groups = getattr(owner, "param_groups", None)
        if isinstance(groups, list) and id(owner) not in self.optimizer_guard:  # an optimizer's lists
            self.optimizer_guard[id(owner)] = (owner, param_lists(owner))
            self.hyper.setdefault(id(owner), (owner, hyperparameters(owner)))
        self._settle()
        self._check_hyper()
        self._sync()
        self.program.append(Host(HOST, method, idempotent))
        self.hosts += 1
        self.host_pending = True

    def host_read(self, t: Tensor) -> None:
        """``t``'s values were read on the host (indices, class targets, a graph's edges): what the
        step then did with them is frozen into the program, so a replay is valid only while they
        are the same -- a guard compares them on every call.  Values the step computed itself are
        left to the two-capture comparison (they differ from call to call, or are constants)."""
        if self.problem is not None or id(t) in self.host_seen:
            return
        if id(t._data) in self.computed:
            self.refuse("the step read a value it computed on the host (.item(), float(), bool(), "
                        ".numpy()): a replay without Python would freeze what the step did with it")
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
        self.program.append(Backward(BACKWARD, num_nodes, grads))

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

    def _optimizer_grad_guard(self) -> list[tuple[Any, bool]]:
        """Whether each parameter of an optimizer the step ran had a gradient, for the parameters the
        step itself never read: an optimizer updates exactly the parameters with a gradient, so one
        given a ``.grad`` outside the step after capture (an auxiliary loss backpropagated apart)
        would be skipped by a replay but updated by eager.  The state at the call's start where it
        is known; otherwise at its end, which can only make a replay recapture (a step that cleared
        the gradient), never run one eager would not."""
        seen = {id(t) for t, _ in self.watched}  # every tensor the step read has its own grad guard
        guard = []
        for _, lists in self.optimizer_guard.values():  # the lists the optimizer guard holds unchanged
            for p in chain.from_iterable(lists):
                if id(p) not in seen:
                    seen.add(id(p))
                    had = self.had_grad.get(id(p))
                    guard.append((p, p.grad is not None if had is None else had))
        return guard

    def finish(self, out: Any) -> "Capture":
        self._settle()
        self._check_hyper()
        self._sync()
        if self.problem is not None:
            raise _Refused(self.problem)
        spec = self._output(out)
        if self.problem is not None:
            raise _Refused(self.problem)
        # a keyed Call draws a key (keyed_call), and so may a user's host call (host_call of a
        # function that draws); an optimizer's update Call, zero_grad and step counters do not: a
        # replay saves the generator's state (for an eager re-run after a fault) only where one may
        fresh_draws = any(e[0] == FRESH or (e[0] == CALL and type(e[2]) is _Tupled)
                          or (e[0] == HOST and not _draws_nothing(e[1])) for e in self.program)
        guards = StateGuards(self.grad_guard + self._optimizer_grad_guard(), self.host_guards, self.requires_grad_guard,
                             list(self.module_guard.values()), list(self.optimizer_guard.values()),
                             list(self.array_guard.values()))
        return Capture(self.program, self.meta, spec, fresh_draws, guards)
