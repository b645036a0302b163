"""The optimizer base class: parameter groups, per-parameter state, a learning-rate schedule hook.

Updates are written once, as arithmetic on "numbers" (``+ - * /`` and :meth:`Optimizer._sqrt`),
and run on one of two carriers, chosen per parameter:

* the parameter's **raw backend array** when that array speaks the Python array API
  (``__array_namespace__``: numpy, cupy): no dispatch, no graph, a few microseconds per update.
  The new array *replaces* the parameter's storage; nothing is written in place, so state dicts
  taken earlier and arrays a user passed to ``pg.tensor`` are never modified;
* **polygrad tensors** under ``pg.no_grad()`` for any other backend (scalar, third-party),
  assigned through ``p.data = new``: slower, but correct on every backend.

Sparse gradients: a gradient stored sparse is densified for a dense parameter; a sparse parameter
(a sparse tensor whose values are optimised) is updated through its stored values, so its
pattern never changes.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np

import polygrad as pg
from polygrad.compile import host_call
from polygrad.compile.recorder import note_group_write, update_recorder
from polygrad.ir.errors import CheckpointError, DTypeError
from polygrad.tensor import Tensor

from .blocked_update import PARALLEL_MIN, RuleInBlocks, update_in_blocks
from .multi_tensor import member_args, rule_key, run_together, together
from .replay_numbers import GroupingCheck, Numbers, TogetherNumbers, partition

__all__ = ["Optimizer", "ParamGroup", "Rule"]


class Rule(NamedTuple):
    """One parameter's update for one step: ``fn(x, g, *state arrays named reads, *numbers, **attrs)``
    returns the new ``x`` and the new state arrays named ``writes``.  ``fn`` is pure and written with
    ``+ - * /`` and :func:`sqrt` only, so it runs on raw arrays of any array-API library, on
    polygrad tensors, and traced by a backend that compiles a whole step (``pg.compile``); ``numbers``
    are this step's Python numbers (learning rate, bias corrections), ``attrs`` what selects the
    arithmetic (weight decay on or off)."""
    fn: Callable[..., tuple]
    attrs: dict
    numbers: tuple
    reads: tuple
    writes: tuple


def sqrt(x: Any) -> Any:
    """Square root on either carrier of an update rule (an array-API array or a polygrad tensor)."""
    return x.__array_namespace__().sqrt(x) if hasattr(x, "__array_namespace__") else x.sqrt()

class ParamGroup(dict):
    """A parameter group: a plain dict ("params" and hyper-parameters, PyTorch's layout) that tells
    a running ``pg.compile(pure=True)`` capture when code outside :mod:`polygrad.optim` sets a
    hyper-parameter (a warm-up computed in the step), which a replay would not repeat."""

    __slots__ = ()

    def __setitem__(self, key: str, value: Any) -> None:
        note_group_write(key, sys._getframe(1))
        dict.__setitem__(self, key, value)
Schedule = Callable[[int], float]


_is_sparse = pg.is_sparse


def _leaf_of(p: Tensor) -> Tensor:
    """The dense tensor whose numbers the update changes (a sparse parameter's values)."""
    return p.values if _is_sparse(p) else p


class Optimizer:
    """Base class: holds ``param_groups`` (dicts with "params" and hyper-parameters) and ``state``.

    ``params``: an iterable of tensors, of dicts ``{"params": [...], **overrides}`` (groups with
    their own hyper-parameters, e.g. weight decay on the first layer only), or a Module.
    ``lr_schedule``: a callable of the step number (0 for the first ``step()``) returning a
    *multiplier* of each group's ``lr`` (PyTorch's LambdaLR convention); with ``lr=1.0`` it is
    the learning rate itself, e.g. micrograd's ``lambda k: 1.0 - 0.9 * k / 100``.
    PyTorch's schedulers (:mod:`polygrad.optim.lr_scheduler`) write the groups' ``lr`` instead.

    A parameter moved to another backend (``Module.to``) keeps its identity, and its state here
    is re-created on that backend at the next ``step()``.
    """

    #: hyper-parameters every group gets (subclasses extend)
    defaults: dict[str, Any] = {}
    #: whether :meth:`_update` computes each element from that element alone (no norm, no
    #: reduction, no write into its arguments): then a large host parameter is updated in blocks
    #: on polygrad's threads, with the same bits (:mod:`polygrad.optim.blocked_update`)
    elementwise_update = False

    def __init__(self, params: Any, defaults: dict[str, Any], lr_schedule: Schedule | None = None):
        if lr_schedule is not None and not callable(lr_schedule):
            raise TypeError(f"{type(self).__name__}: lr_schedule must be a callable of the step, "
                            f"got {type(lr_schedule).__name__}")
        self.defaults = dict(defaults)
        self.lr_schedule = lr_schedule
        self.step_count = 0
        self.state: dict[int, dict[str, Any]] = {}
        self.param_groups: list[ParamGroup] = []
        if hasattr(params, "parameters") and callable(params.parameters):
            params = params.parameters()
        items = list(params) if not isinstance(params, Tensor) else [params]
        if not items:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        groups: list[Any] = items if all(isinstance(g, Mapping) for g in items) else [{"params": items}]
        seen: set[int] = set()
        for group in groups:
            self.add_param_group(group, _seen=seen)

    # -- groups -------------------------------------------------------------------------------------
    def add_param_group(self, group: Mapping[str, Any], _seen: set[int] | None = None) -> None:
        if not isinstance(group, Mapping) or "params" not in group:
            raise ValueError(f"{type(self).__name__}: a parameter group is a dict with a 'params' key")
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown hyper-parameters {sorted(unknown)} "
                             f"(known: {sorted(self.defaults)})")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = _seen if _seen is not None else {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            self._check_param(p)
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter of shape {p.shape} appears in "
                                 "more than one group (or twice in one)")
            seen.add(id(p))
        full = ParamGroup({**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": params})
        self._check_group(full)
        self.param_groups.append(full)

    def _check_param(self, p: Any) -> None:
        if not isinstance(p, Tensor):
            raise TypeError(f"{type(self).__name__}: parameters must be polygrad tensors, got "
                            f"{type(p).__name__}")
        leaf = _leaf_of(p)
        if leaf.dtype.kind != "f":
            raise DTypeError(f"{type(self).__name__}: cannot optimise a {leaf.dtype} tensor of shape {p.shape}")
        if not (p.requires_grad or leaf.requires_grad) or not leaf.is_leaf:
            raise ValueError(f"{type(self).__name__}: a parameter of shape {p.shape} is not a leaf tensor "
                             "with requires_grad=True")

    def _check_group(self, group: ParamGroup) -> None:
        lr = group.get("lr")
        if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"{type(self).__name__}: lr must be a finite number >= 0, got {lr!r}")
        wd = group.get("weight_decay", 0.0)
        if not isinstance(wd, (int, float)) or not math.isfinite(wd) or wd < 0:
            raise ValueError(f"{type(self).__name__}: weight_decay must be a finite number >= 0, got {wd!r}")

    # -- the step -------------------------------------------------------------------------------------
    def lr_factor(self, step: int | None = None) -> float:
        """The schedule's multiplier for ``step`` (default: the next step)."""
        if self.lr_schedule is None:
            return 1.0
        k = self.step_count if step is None else step
        factor = float(self.lr_schedule(k))
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"{type(self).__name__}: lr_schedule({k}) returned {factor}, expected a "
                             "finite number >= 0")
        return factor

    def current_lr(self, group: int = 0) -> float:
        """The learning rate the next ``step()`` uses for ``param_groups[group]``."""
        return self.param_groups[group]["lr"] * self.lr_factor()

    def scale_lr(self, factor: float) -> None:
        """Multiply every group's base learning rate by ``factor`` (used by ``fit``'s rollback)."""
        for g in self.param_groups:
            g["lr"] *= factor

    def zero_grad(self) -> None:
        host_call(self.zero_grad, idempotent=True)  # pg.compile replays this call
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
                if _is_sparse(p):
                    p.values.grad = None

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given.

        While ``pg.compile(pure=True)`` captures a step, an optimizer whose updates are
        :class:`Rule` s on raw arrays reports each update to the capture (so a backend that compiles
        whole steps compiles them too); otherwise the step is one host call the replay repeats."""
        rec = update_recorder() if closure is None else None
        if rec is not None and not self._recordable():
            rec = None
        if rec is None:
            host_call(self.step, idempotent=False, replayable=closure is None)  # pg.compile replays it
        loss = None
        if closure is not None:
            with pg.enable_grad():
                loss = closure()
        factor = self.lr_factor()
        homes = self.__dict__.setdefault("_state_homes", {})  # id(param) -> backend its state is on
        # each parameter's sparsity and leaf asked once per step (the undo record and the loop share them)
        groups = [[(p, p.values if _is_sparse(p) else p) for p in group["params"]] for group in self.param_groups]
        undo = self._undo_record([leaf for entries in groups for _, leaf in entries])
        recorded: list[int] = []  # the parameters whose updates a capture recorded
        # small numpy parameters sharing a rule, updated as one concatenation (polygrad.optim.multi_tensor)
        together = (self.elementwise_update and type(self)._update is Optimizer._update
                    and type(self)._rule is not Optimizer._rule)
        batches: dict[tuple, tuple[Rule, list]] = {}
        # a capture checks at replay that eager would group the small parameters as now (GroupingCheck)
        grouping: list | None = [] if rec is not None and together else None
        at = rec.mark() if rec is not None and grouping is not None else 0
        with pg.no_grad():
            for index, (group, entries) in enumerate(zip(self.param_groups, groups)):
                lr = group["lr"] * factor
                for p, leaf in entries:
                    grad = p.grad
                    if grad is None and leaf is not p:
                        grad = leaf.grad
                    if grad is None:
                        continue
                    if _is_sparse(grad):
                        grad = grad.values if leaf is not p else grad.to_dense()
                    if grad.shape != leaf.shape:
                        raise pg.errors.ShapeError(f"{type(self).__name__}: gradient of shape {grad.shape} "
                                                   f"for a parameter of shape {leaf.shape}")
                    # leaf and grad are dense here, so _fast(t) is whether t's array speaks the array API
                    fast = (hasattr(leaf._data, "__array_namespace__") and hasattr(grad._data, "__array_namespace__")
                            and grad.backend == leaf.backend)
                    x = leaf.array if fast else leaf
                    g = grad.array if fast else (grad if grad.backend == leaf.backend else grad.to(leaf.backend))
                    state = self.state.setdefault(id(p), {})
                    if state and homes.get(id(p)) is not leaf._be:
                        _follow(state, leaf, fast)  # the parameter moved (Module.to): its state follows
                    homes[id(p)] = leaf._be
                    if together and fast and type(x) is np.ndarray and x.size < PARALLEL_MIN:
                        # a capture groups the parameters as eager does: a replay must run the same
                        # concatenations to give eager's NaN bits (multi_tensor.Together)
                        self._init_state(x, group, state, fast)
                        rule = self._rule(lr, group, state)
                        key = rule_key(rule, x, g, state)
                        if grouping is not None:
                            grouping.append((Numbers(self, index, id(p), rule), leaf, key,
                                             type(g) is np.ndarray and g.dtype == x.dtype and g.shape == x.shape))
                        if key is not None:  # updated below, with every parameter sharing its rule
                            batches.setdefault(key, (rule, []))[1].append((leaf, x, g, state, index, p, grad))
                            continue
                        if rec is not None:
                            new = self._recorded_update(rec, index, p, leaf, grad, lr, state)
                            recorded.append(id(p))
                        else:
                            new = self._apply_rule(rule, x, g, state)
                    elif rec is not None:  # pg.compile: the update is recorded for a backend to compile
                        new = self._recorded_update(rec, index, p, leaf, grad, lr, state)
                        recorded.append(id(p))
                    elif self.elementwise_update and leaf._be.lazy and grad.backend == leaf.backend:
                        # a lazy backend runs the whole elementwise rule as one task per block
                        # (Backend.apply_update), not a task per op chained through its scheduler
                        self.__dict__["_rule_backend"] = leaf._be
                        try:
                            new = self._update(x, g, lr, group, state, fast)
                        finally:
                            self.__dict__.pop("_rule_backend", None)
                    elif self.elementwise_update:  # large host arrays: in blocks, on polygrad's threads
                        new = update_in_blocks(self._update, x, g, lr, group, state, fast)
                    else:
                        new = self._update(x, g, lr, group, state, fast)
                    _write(leaf, new, fast)
            for rule, members in batches.values():
                if rec is not None:
                    self._recorded_together(rec, rule, members, lr_of=lambda i: self.param_groups[i]["lr"] * factor)
                    recorded.extend(id(m[5]) for m in members)
                else:
                    self._update_together(rule, members)
            if rec is not None and grouping is not None and len(grouping) > 1:
                captured = partition([key for _, _, key, _ in grouping])
                # one group alone: its TogetherNumbers checks that its numbers stay equal, unless
                # another optimizer stepped before (then that check would come after a step)
                rec.check(grouping[0][1]._be, GroupingCheck([m[0] for m in grouping], [m[1] for m in grouping],
                                                            [m[3] for m in grouping], captured), at, self,
                          always=len(set(captured)) > 1)
        pending = self.__dict__.get("_pending")
        if undo is not None and pending is not None:
            pending.extend(self._step_results())  # the caller materialises them (and undoes a failure)
        elif undo is not None:
            try:
                self._materialize()
            except BaseException:
                undo()  # a failed step (a lost worker...) leaves parameters and state as they were
                raise
        self.step_count += 1
        if rec is not None:  # a replay advances the step counters after its updates
            rec.host(_Advance(self, recorded), idempotent=False)
        return loss

    def _recordable(self) -> bool:
        """Whether a capture can record this step's updates as :class:`Rule` calls: the optimizer
        defines :meth:`_rule`, and every parameter with a gradient is a dense array-API array with a
        dense gradient on its backend, which is not lazy."""
        if type(self)._rule is Optimizer._rule or type(self)._update is not Optimizer._update:
            return False
        for p in self._params():
            leaf = _leaf_of(p)
            grad = p.grad if p.grad is not None else (leaf.grad if leaf is not p else None)
            if grad is None:
                continue
            if (_is_sparse(p) or _is_sparse(grad) or not (_fast(leaf) and _fast(grad))
                    or grad.backend != leaf.backend or leaf._be.lazy):
                return False
        return True

    def _recorded_update(self, rec: Any, index: int, p: Tensor, leaf: Tensor, grad: Tensor, lr: float,
                         state: dict) -> Any:
        """:meth:`_update` on raw arrays, reported to the capture ``rec`` as a call of the rule with
        numbers a replay derives again from the hyper-parameters and state it then finds."""
        x = leaf.array
        self._init_state(x, self.param_groups[index], state, True)
        rule = self._rule(lr, self.param_groups[index], state)
        before = tuple(state[n] for n in rule.reads)
        fn = rule.fn
        if self.elementwise_update and type(x) is np.ndarray and x.size >= PARALLEL_MIN:
            fn = RuleInBlocks(fn)  # in blocks on polygrad's threads, as eager's update_in_blocks
        out = fn(x, grad.array, *before, *rule.numbers, **rule.attrs)
        rec.update(self, id(p), fn, rule.attrs, Numbers(self, index, id(p), rule), leaf, grad,
                   rule.reads, before, rule.writes, out)
        self._advance_state(state)
        for name, array in zip(rule.writes, out[1:]):
            state[name] = array
        return out[0]

    def _recorded_together(self, rec: Any, rule: Rule, members: list, lr_of: Callable[[int], float]) -> None:
        """:meth:`_update_together` reported to the capture ``rec`` as one call of the concatenated
        rule (:class:`~polygrad.optim.multi_tensor.Together`), whose numbers a replay derives again
        for every member (:class:`TogetherNumbers`); each member's own recorded update where
        there is one member or the rule's results are not one array per element, as eager does."""
        fn = together(rule, [x.shape for _, x, *_ in members])
        befores = [tuple(state[n] for n in rule.reads) for _, _, _, state, *_ in members]
        out = None
        if len(members) > 1:
            out = fn(*member_args(rule, [(x, g, state) for _, x, g, state, *_ in members]), *rule.numbers,
                     **rule.attrs)
        if out is None:
            for leaf, _, _, state, index, p, grad in members:
                _write(leaf, self._recorded_update(rec, index, p, leaf, grad, lr_of(index), state), True)
            return
        numbers = TogetherNumbers([Numbers(self, index, id(p), rule) for _, _, _, _, index, p, _ in members])
        rec.update_many(self, [(id(p), leaf, grad, before) for (leaf, _, _, _, _, p, grad), before
                               in zip(members, befores)], fn, rule.attrs, numbers, rule.reads, rule.writes, out)
        width = 1 + len(rule.writes)
        for m, (leaf, _, _, state, *_) in enumerate(members):
            self._advance_state(state)
            for name, array in zip(rule.writes, out[m * width + 1:(m + 1) * width]):
                state[name] = array
            _write(leaf, out[m * width], True)

    def _undo_record(self, leaves: list[Tensor] | None = None) -> Callable[[], None] | None:
        """On lazy backends, how to put every parameter's storage and the state back (else None).
        ``leaves``: every parameter's leaf (:func:`_leaf_of`) in order, when the caller has them."""
        if leaves is None:
            leaves = [_leaf_of(p) for p in self._params()]
        for leaf in leaves:
            if leaf._be.lazy:
                break
        else:
            return None
        storage = [(leaf, leaf._data) for leaf in leaves]
        state = {k: dict(v) for k, v in self.state.items()}
        tensors = [(v, v._data) for st in self.state.values() for v in st.values() if isinstance(v, Tensor)]

        def undo() -> None:
            for leaf, data in storage:
                leaf._data = data
            self.state = state
            for t, data in tensors:
                t._data = data
        return undo

    def _step_results(self) -> list[Tensor]:
        """Every parameter's leaf and every state tensor: what a step on a lazy backend leaves as
        pending work (:meth:`_materialize`)."""
        leaves = [(p, _leaf_of(p)) for p in self._params()]
        state_tensors = [v for p, _ in leaves for v in self.state.get(id(p), {}).values()
                         if isinstance(v, Tensor)]
        return [leaf for _, leaf in leaves] + state_tensors

    def _materialize(self) -> None:
        """On lazy backends (``Backend.lazy``), compute the new parameters and state once per step,
        so their task graphs do not grow step after step (``Backend.materialize``)."""
        pg.materialize(*self._step_results())

    @contextlib.contextmanager
    def deferred_materialize(self) -> Iterator[list[Tensor]]:
        """Within it, a ``step()`` on a lazy backend does not materialise its new parameters and
        state: it appends them to the yielded list, for the caller to materialise together with
        its own tensors in one submission (``fit``: the loss, the gradients and the step's results
        as one task graph, one scheduler round trip per step instead of four).  The caller then
        owns what ``step()`` does on a failed materialisation: putting back the parameters and
        state from before the step (``fit`` holds them: ``_StepUndo``).  On eager backends the
        list stays empty."""
        if "_pending" in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.deferred_materialize is not re-entrant")
        pending: list[Tensor] = []
        self.__dict__["_pending"] = pending
        try:
            yield pending
        finally:
            self.__dict__.pop("_pending", None)

    def _update(self, x: Any, g: Any, lr: float, group: ParamGroup, state: dict, fast: bool) -> Any:
        """New value of one parameter from its value ``x`` and gradient ``g`` (same carrier): its
        :meth:`_rule` applied (a subclass may override this instead, then it steps as host code)."""
        self._init_state(x, group, state, fast)
        return self._apply_rule(self._rule(lr, group, state), x, g, state)

    def _apply_rule(self, rule: Rule, x: Any, g: Any, state: dict) -> Any:
        """``rule`` on one parameter's ``x`` and ``g``: its new value; ``state`` advanced."""
        args = (x, g, *[state[n] for n in rule.reads])
        be = self.__dict__.get("_rule_backend")
        out = rule.fn(*args, *rule.numbers, **rule.attrs) if be is None else _rule_on(be, rule, args)
        self._advance_state(state)
        for name, array in zip(rule.writes, out[1:]):
            state[name] = array
        return out[0]

    def _update_together(self, rule: Rule, members: list) -> None:
        """``rule`` on several parameters (``(leaf, x, g, state)`` each) as one concatenation, or on
        each alone when there is one or the rule's results are not one array per element."""
        outs = run_together(rule, [(x, g, state) for _, x, g, state, *_ in members]) if len(members) > 1 else None
        for i, (leaf, x, g, state, *_) in enumerate(members):
            if outs is None:
                new = self._apply_rule(rule, x, g, state)
            else:
                self._advance_state(state)
                for name, array in zip(rule.writes, outs[i][1:]):
                    state[name] = array
                new = outs[i][0]
            _write(leaf, new, True)

    def _init_state(self, x: Any, group: ParamGroup, state: dict, fast: bool) -> None:
        """Create a parameter's state before its first update (Adam's moments); default: none."""

    def _rule(self, lr: float, group: ParamGroup, state: dict) -> Rule:
        """This step's :class:`Rule` for a parameter with ``state``; reads, never writes, the state."""
        raise NotImplementedError

    def _advance_state(self, state: dict) -> None:
        """Advance a parameter's counters after its update (Adam's step); default: none."""

    #: ``_rule_inputs(state)``: what of a parameter's state :meth:`_rule` reads, hashable (Adam: its
    #: step), so that parameters of one group with equal inputs get the same rule and a replay
    #: computes it once per group (``replay_numbers``).  None: unknown.  Honoured only where the
    #: class that defines ``_rule`` defines it too.
    _rule_inputs: Callable[[dict], Any] | None = None

    @staticmethod
    def _sqrt(x: Any, fast: bool) -> Any:
        if fast:
            return x.__array_namespace__().sqrt(x)
        return x.sqrt()

    @staticmethod
    def _zeros_like(x: Any, fast: bool) -> Any:
        if fast:
            return x.__array_namespace__().zeros_like(x)
        return pg.zeros_like(x)

    # -- state ----------------------------------------------------------------------------------------
    def _params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """Hyper-parameters, step count and per-parameter state (tensors), ready for ``pg.save``.

        Parameters are referred to by their position over all groups, so the state loads into
        an optimizer built the same way over a freshly built model.
        """
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": [index[id(p)] for p in g["params"]]})
        state = {}
        for pid, st in self.state.items():
            if pid not in index:
                continue
            p = _leaf_of(self._params()[index[pid]])
            state[str(index[pid])] = {k: _as_tensor(v, p) for k, v in st.items()}
        return {"type": type(self).__name__, "step_count": self.step_count, "param_groups": groups,
                "state": state}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore hyper-parameters, step count and per-parameter state from :meth:`state_dict`.

        A state dict may come from an untrusted checkpoint, so it is validated exactly as the
        constructor validates its arguments (``lr`` finite and >= 0, betas in [0, 1), ...), plus
        shapes, finiteness of the state and a step count >= 0; anything wrong raises
        :class:`~polygrad.errors.CheckpointError` and leaves the optimizer unchanged.
        """
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"{name}: not an optimizer state (a {type(sd).__name__})")
        try:
            groups = [dict(g) for g in sd["param_groups"]]
            state = dict(sd.get("state", {}))
            raw_step = sd.get("step_count", 0)
            if isinstance(raw_step, bool) or not isinstance(raw_step, (int, np.integer)) or raw_step < 0:
                raise ValueError(f"step_count must be an int >= 0, got {raw_step!r:.60}")
            step_count = int(raw_step)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{name}: not an optimizer state "
                                  f"({type(exc).__name__}: {exc})") from None
        if sd.get("type", type(self).__name__) != type(self).__name__:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: the state is from a {sd['type']}")
        params = self._params()
        if len(groups) != len(self.param_groups) or any(
                len(list(a["params"])) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: the state has "
                                  f"{[len(list(g['params'])) for g in groups]} parameters per group, "
                                  f"this optimizer {[len(g['params']) for g in self.param_groups]}")
        # hyper-parameters: validated on candidate copies, installed only when all are valid
        candidates = []
        for saved, group in zip(groups, self.param_groups):
            candidate = ParamGroup(group)
            for k, v in saved.items():
                if k == "params":
                    continue
                if k not in self.defaults:
                    raise CheckpointError(f"{name}: unknown hyper-parameter {k!r:.60} "
                                          f"(known: {sorted(self.defaults)})")
                default = self.defaults[k]
                if isinstance(default, tuple) and isinstance(v, list):
                    v = tuple(v)
                if isinstance(default, bool) != isinstance(v, bool) or (
                        isinstance(default, (int, float)) and not isinstance(v, (int, float))):
                    raise CheckpointError(f"{name}: hyper-parameter {k!r} must be a "
                                          f"{type(default).__name__}, got {v!r:.60}")
                candidate[k] = v
            try:
                self._check_group(candidate)
            except (ValueError, TypeError) as exc:
                raise CheckpointError(f"{name}: invalid hyper-parameters: {exc}") from None
            candidates.append(candidate)
        new_state: dict[int, dict[str, Any]] = {}
        for key, st in state.items():
            try:
                p = params[int(key)]
            except (ValueError, IndexError):
                raise CheckpointError(f"{type(self).__name__}.load_state_dict: state for unknown "
                                      f"parameter {key!r}") from None
            leaf = _leaf_of(p)
            entry = {}
            if not isinstance(st, Mapping):
                raise CheckpointError(f"{name}: state of parameter {key} is a {type(st).__name__}, not a dict")
            for sname, v in dict(st).items():
                if isinstance(v, (Tensor, np.ndarray)):
                    arr = v.numpy() if isinstance(v, Tensor) else v
                    if tuple(arr.shape) != leaf.shape:
                        raise CheckpointError(f"{name}: state {sname!r} of "
                                              f"parameter {key} has shape {tuple(arr.shape)}, expected {leaf.shape}")
                    if arr.dtype.kind not in "biuf" or not np.isfinite(arr).all():
                        raise CheckpointError(f"{name}: state {sname!r} of parameter {key} is not finite "
                                              f"numbers ({arr.dtype}); it would poison the parameters")
                    t = pg.tensor(np.array(arr, dtype=leaf.dtype), backend=leaf.backend)
                    entry[sname] = t.array if _fast(leaf) else t
                elif v is None or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                                   and math.isfinite(v) and v >= 0):
                    entry[sname] = v  # e.g. Adam's per-parameter step count
                else:
                    raise CheckpointError(f"{name}: state {sname!r} of parameter {key} must be a tensor, "
                                          f"a finite number >= 0 or None, got {v!r:.60}")
            new_state[id(p)] = entry
        for candidate, group in zip(candidates, self.param_groups):
            group.update({k: v for k, v in candidate.items() if k != "params"})
        self.state = new_state
        self.step_count = step_count

    def __repr__(self) -> str:
        groups = ", ".join(f"{{{len(g['params'])} params, "
                           + ", ".join(f"{k}={v}" for k, v in g.items() if k != "params") + "}"
                           for g in self.param_groups)
        return f"{type(self).__name__}({groups})"


class _Advance:
    """A replayed step's host part: the counters its updates advance (what :meth:`Optimizer.step`
    does besides the updates, which the replay ran as rule calls).  ``__self__`` names the
    optimizer, as a bound ``step`` would (a capture guards its parameter lists through it)."""

    __slots__ = ("__self__", "keys")
    counters_only = True  # changes no hyper-parameter: another optimizer's replay checks may run before it

    def __init__(self, opt: Optimizer, keys: list[int]):
        self.__self__, self.keys = opt, tuple(keys)

    def __call__(self) -> None:
        opt = self.__self__
        for key in self.keys:
            opt._advance_state(opt.state[key])
        opt.step_count += 1


def _fast(t: Tensor) -> bool:
    """Whether ``t``'s storage is an array-API array (numpy, cupy) the update can work on directly."""
    return not _is_sparse(t) and hasattr(t.array, "__array_namespace__")


def _rule_on(be: Any, rule: Rule, args: tuple) -> tuple:
    """``rule`` through ``be.apply_update`` on the arrays behind ``args`` (tensors or raw arrays of
    ``be``), its results in the carrier the arguments came in; op by op where ``be`` declines."""
    wrap = isinstance(args[0], Tensor)
    raw = tuple(a.array if isinstance(a, Tensor) else a for a in args)
    out = be.apply_update(rule.fn, raw, rule.numbers, rule.attrs)
    if out is None:
        return rule.fn(*args, *rule.numbers, **rule.attrs)
    return tuple(Tensor.from_backend(o, be) for o in out) if wrap else tuple(out)


def _write(leaf: Tensor, new: Any, fast: bool) -> None:
    if fast and new.dtype != leaf.dtype:
        new = new.astype(leaf.dtype)
    leaf.update_(new)


def _follow(state: dict, leaf: Tensor, fast: bool) -> None:
    """Re-create ``state``'s arrays where ``leaf`` now lives, in the carrier the update uses (raw
    arrays on the fast path, tensors otherwise); numbers are left alone."""
    for key, v in state.items():
        if isinstance(v, Tensor):
            if fast or v._be is not leaf._be:
                state[key] = leaf._be.from_numpy(v.numpy()) if fast else v.to(leaf._be)
        elif hasattr(v, "__array_namespace__") and not (fast and type(v) is type(leaf.array)):
            host = pg.tensor(v).numpy()  # lands on the backend that owns v, which can read it back
            state[key] = leaf._be.from_numpy(host) if fast else pg.tensor(host, backend=leaf._be)


def _as_tensor(v: Any, like: Tensor) -> Any:
    """Optimizer state for a state dict: arrays and tensors as tensors, numbers as they are."""
    if isinstance(v, Tensor):
        return v.detach()
    if hasattr(v, "__array_namespace__"):
        return pg.tensor(v, backend=like.backend)
    return v
