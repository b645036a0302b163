"""``pg.compile`` and the compiled function (see the package docstring)."""
from __future__ import annotations

import operator
import threading
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable

from ..runtime.config import config
from ..engine.dispatch import _forward, _inference_memo, _recording, is_grad_enabled, registry
from ..runtime.registry import get_backend
from ..sparse import SparseTensor
from ..tensor import rng
from ..engine.autodiff import backward_plans
from .backward_plan import BackwardPlans
from .executor import _HostFailed, prepare, run
from .forward_plan import Cursor
from .guards import _modules_of, flatten_call, contents, python_changed, python_state
from .program import Capture, CompileError, _mismatch, _Refused, _ReplayFault
from .recorder import _Recorder


_TRAINING = operator.attrgetter("training")


class _Entry:
    __slots__ = ("capture", "candidate", "eager_calls", "failures", "reason", "faults", "backoff")

    def __init__(self) -> None:
        self.capture: Capture | None = None
        self.candidate: Capture | None = None  # a first capture awaiting its check
        self.eager_calls = 0
        self.failures = 0
        self.reason = ""
        self.faults = 0  # replays that faulted in a row (a successful replay resets it)
        self.backoff = 0  # eager calls to run before capturing again after repeated faults


class Compiled:
    """``fn`` compiled (see :func:`compile`): ``pure`` says which mode.  ``stats`` counts eager
    calls (every default-mode call is one), captures, replays, re-captures, dropped captures,
    refusals, the default mode's ops matched against its forward plan (``forward_matched``) and
    its calls that left the plan (``forward_left``); ``reason`` says why the last refused capture
    was refused; ``plans.stats`` counts the default mode's backward passes run through a plan,
    recorded and run eagerly."""

    def __init__(self, fn: Callable, cache_size: int = 8, warmup: int = 1, modules: Any = None,
                 enabled: bool = True, pure: bool = False):
        if not callable(fn):
            raise CompileError(f"pg.compile expects a function (or another callable) to compile, got "
                               f"{type(fn).__name__} {fn!r}")
        if cache_size < 1 or warmup < 0:
            raise ValueError(f"pg.compile: cache_size must be >= 1 and warmup >= 0, got {cache_size}, {warmup}")
        self.fn = fn
        self.pure = bool(pure)
        self.cache_size = cache_size
        self.warmup = warmup
        self.enabled = enabled
        found: dict = {}
        tensors: dict = {}
        optimizers: dict = {}
        _modules_of(fn, found, tensors, optimizers=optimizers)
        self._optimizers = list(optimizers.values())
        if modules is not None:
            found = {}
            for m in (modules if isinstance(modules, (list, tuple)) else [modules]):
                for sub in m.modules():
                    found[id(sub)] = sub
        self._modules = list(found.values())
        self._tensors = list(tensors.values())
        self._cache: OrderedDict = OrderedDict()
        self.plans = BackwardPlans()  # the default mode's backward plans
        self._inferred: dict = {}  # and its memo of inference results (see dispatch._memo_infer)
        self._forward_plan: list = []  # and the ops its last call issued (see forward_plan)
        self._lock = threading.Lock()
        self.stats = {"eager": 0, "captures": 0, "replays": 0, "recaptures": 0, "dropped": 0, "refused": 0,
                      "forward_matched": 0, "forward_left": 0}
        self.reason = ""
        self.__wrapped__ = fn
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = getattr(fn, "__name__", "compiled")

    def _key(self, args: tuple, kwargs: dict) -> tuple[list, tuple]:
        flat: list = []
        parts: list = []
        flatten_call(self.fn, args, kwargs, flat, parts)
        events = registry.events
        chain = config.fallback_chain  # a dict the user may edit in place: its repr, unless empty
        parts.append((is_grad_enabled(), get_backend(), config.fallback, config.validate,
                      "{}" if type(chain) is dict and not chain else repr(chain),
                      config.sparse_threshold, config.sparse_min_elements,
                      config.memory_fraction, tuple(map(_TRAINING, self._modules)),
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
        if not self.pure:  # the default mode: the user's Python runs every call, as eager
            flatten_call(self.fn, args, kwargs, [], [])  # the same arguments as pure mode accepts
            self.stats["eager"] += 1
            token = backward_plans.set(self.plans)  # its backward passes run through plans
            memo = _inference_memo.set(self._inferred)  # and its ops' inference is remembered
            cursor = Cursor(self._forward_plan)
            walk = _forward.set(cursor)  # its ops are matched against the last call's
            try:
                out = self.fn(*args, **kwargs)
            finally:
                _forward.reset(walk)
                _inference_memo.reset(memo)
                backward_plans.reset(token)
            self.stats["forward_matched"] += cursor.matched
            self.stats["forward_left"] += cursor.pos < 0
            plan = cursor.finished()
            if plan is not None:  # the call left the plan (or issued fewer ops): its ops are the next
                self._forward_plan = plan
            return out
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
                    # a replay's check that keeps failing (inputs that stay non-finite, or beyond a
                    # rewrite's bound) would cost a capture and a wasted replay every other call:
                    # after the second fault in a row, run eagerly 1, 3, 7, ... 63 calls first
                    entry.faults += 1
                    entry.backoff = min(2 ** (entry.faults - 1) - 1, 63)
                    if fault.after_step:  # a step already ran: re-running the call would repeat it
                        raise fault.exc
                    if state is not None:  # the eager re-run draws the same dropout masks
                        rng().bit_generator.state = state
                    self.stats["eager"] += 1
                    return self.fn(*args, **kwargs)
                entry.faults = 0
                self.stats["replays"] += 1
                return out
            entry.capture = None
            self.stats["recaptures"] += 1
        if entry.backoff > 0:
            entry.backoff -= 1
            self.stats["eager"] += 1
            return self.fn(*args, **kwargs)
        if entry.eager_calls < self.warmup or entry.failures >= 2:
            entry.eager_calls += 1
            self.stats["eager"] += 1
            return self.fn(*args, **kwargs)
        return self._capture(entry, flat, args, kwargs)

    @staticmethod
    def _run(cap: Capture, flat: list) -> Any:
        try:
            return run(cap, flat)
        except _HostFailed as failed:
            raise failed.exc from None

    def _capture(self, entry: _Entry, flat: list, args: tuple, kwargs: dict) -> Any:
        state = [t._values if isinstance(t, SparseTensor) else t for t in self._tensors]
        arg_modules = [x for x in args if hasattr(x, "training") and callable(getattr(x, "modules", None))]
        for m in (*self._modules, *arg_modules):  # at capture time only: parameter lists walked once
            state += [p._values if isinstance(p, SparseTensor) else p for p in m.parameters()]
        rec = _Recorder(flat, state, self._optimizers)
        python = python_state(self.fn)
        before = contents(python)
        token = _recording.set(rec)
        try:
            out = self.fn(*args, **kwargs)
        finally:
            _recording.reset(token)
        for opt, _ in rec.optimizer_guard.values():  # the next capture watches its hyperparameters
            if all(o is not opt for o in self._optimizers):
                self._optimizers.append(opt)
        try:
            changed = python_changed(python, before)
            if changed is not None:
                rec.refuse(changed + ": a replay without Python would not")
            cap = prepare(rec.finish(out))
            cap.guards.python = python
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
        """Forget every capture, forward and backward plan and remembered inference (the next
        calls warm up, capture and plan again)."""
        with self._lock:
            self._cache.clear()
            self.plans = BackwardPlans()
            self._inferred = {}
            self._forward_plan = []


def compile(fn: Callable | None = None, *, pure: bool = False, cache_size: int = 8, warmup: int = 1,
            modules: Any = None, enabled: bool = True) -> Any:  # noqa: A001 - pg.compile, like torch.compile
    """Make ``fn`` (a training or inference step) cheaper per call, with eager's numbers.

    Use as ``step = pg.compile(fn)`` or as a decorator (``@pg.compile``,
    ``@pg.compile(pure=True)``).  ``fn`` must be callable (else :class:`CompileError`, at once).

    Default mode: ``fn``'s Python runs on every call -- branches on ``loss.item()``,
    ``clip_grad_norm_``, warm-ups, appends, freezing and ``eval()`` all behave as eagerly -- and
    polygrad's per-op work is what is saved (each op matched against the ops the last call
    issued and run with the decisions recorded for it, backward plans for graph structures seen
    before).  Bit for bit eager, by construction::

        @pg.compile
        def train_step(x, y):
            opt.zero_grad()
            loss = nn.mse(model(x), y)
            if not math.isfinite(loss.item()):   # fine: runs every call
                return loss
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss)
            return loss

    ``pure=True``: after ``warmup`` eager calls and two agreeing captures, the kernels replay
    without running ``fn``'s Python -- for a step that only issues ops (the example above would
    be refused: it reads ``loss.item()`` and appends to a list; it then runs eagerly with one
    ``RuntimeWarning``).  ``cache_size`` captures (one per guard key) are kept, least recently
    used first out; ``modules`` names extra modules whose train/eval mode is guarded (every
    module that runs is guarded anyway); ``enabled=False`` always runs ``fn`` eagerly.  The
    package docstring lists what pure mode refuses, re-captures on, and leaves to its contract.
    """
    if fn is None:
        return lambda f: Compiled(f, cache_size, warmup, modules, enabled, pure)
    return Compiled(fn, cache_size, warmup, modules, enabled, pure)
