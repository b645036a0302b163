"""The capture program: typed entries, the recorded step (:class:`Capture`) and what reads its
dataflow (which slots each entry reads and writes, the comparison of two captures).

A program is a list of entries, each a named tuple whose first field ``kind`` says what it does.
Every entry is self-describing: a :class:`Kernel` names its op and layout (``key``), its backend,
its input slots, its output slot, its attributes and its output shape, and ``Capture.meta[slot]``
gives each slot's ``(backend, shape, dtype)``; so a backend that compiles whole steps can read a
program without knowing how it was recorded.  Each slot is written by exactly one entry.

Gradient and result *values* (``SetGrad.value``, ``Backward.grads``, the result spec) are small
tuples: ``(0, None)`` no tensor, ``(1, slot)`` a dense tensor over a slot, ``(2, tensor)`` a
constant tensor, ``(3, pattern, value)`` a sparse tensor over ``value``'s values.
"""
from __future__ import annotations

import keyword
from typing import Any, Callable, NamedTuple, Union

import numpy as np

from ..runtime.backend import Backend
from ..ir.errors import PolygradError
from ..ir.ops import Op
from ..sparse.pattern import Pattern
from ..tensor import Tensor

# entry kinds (the first field of every entry)
(LOAD, ARG, GRAD, KERNEL, FUSED, FRESH, HOST, SET_GRAD, SET_DATA, BACKWARD, ASSERT_FINITE, CALL, STATE,
 SET_STATE) = range(14)


class Load(NamedTuple):
    """Read the current storage of a tensor the step reaches but did not get as an argument."""
    kind: int
    slot: int
    tensor: Tensor


class Arg(NamedTuple):
    """Read the storage of the call's ``position``-th flattened tensor argument."""
    kind: int
    slot: int
    position: int


class Grad(NamedTuple):
    """Read ``owner.grad``'s live storage (gradient accumulation into an existing ``.grad``)."""
    kind: int
    slot: int
    owner: Tensor


class Kernel(NamedTuple):
    """Call ``backend``'s forward kernel for ``key = (op, layout)`` on the ``inputs`` slots with
    ``attrs``; its output, of ``shape``, goes to slot ``out``."""
    kind: int
    backend: Any
    key: tuple
    inputs: tuple
    attrs: dict
    out: int
    shape: tuple

    @property
    def op(self) -> Op:
        return self.key[0]

    @property
    def layout(self) -> str:
        return self.key[1]


class Fused(NamedTuple):
    """Call ``backend``'s fused backward kernel for ``key``; its i-th gradient goes to slot
    ``outs[i]`` (-1: not wanted)."""
    kind: int
    backend: Any
    key: tuple
    inputs: tuple
    kwargs: dict
    outs: tuple

    @property
    def op(self) -> Op:
        return self.key[0]


class Fresh(NamedTuple):
    """Draw from a random generator: ``make()`` (``raw``: it returns the array, not a Tensor)."""
    kind: int
    slot: int
    make: Callable[[], Any]
    raw: bool


class Host(NamedTuple):
    """Call host code (an optimizer's ``step``); not ``idempotent``: a replay cannot re-run after it."""
    kind: int
    method: Callable[[], Any]
    idempotent: bool


class SetGrad(NamedTuple):
    """``target.grad = value`` (``target``: a flattened-argument index or the tensor itself)."""
    kind: int
    target: Any
    value: tuple


class SetData(NamedTuple):
    """``target``'s storage becomes slot ``slot`` (an optimizer's update)."""
    kind: int
    target: Any
    slot: int


class Backward(NamedTuple):
    """A backward pass finished (fires ``polygrad_backward_finished`` with the leaves' gradients)."""
    kind: int
    num_nodes: int
    grads: tuple


class AssertFinite(NamedTuple):
    """Fault the replay unless slot ``slot`` is all finite (what a rewrite's exactness needs)."""
    kind: int
    slot: int


class Call(NamedTuple):
    """Call ``fn(*inputs, *numbers(), **attrs)``, a pure function of its arrays and numbers written
    against their array namespace (an optimizer's update rule, a backend's keyed random draw); its
    i-th result goes to slot ``outs[i]``.  ``numbers`` is host code run when the entry runs: it
    returns this call's Python numbers (a learning rate, bias corrections, a random key), which
    change from call to call while ``fn``, ``attrs`` and the slots do not.  A backend that compiles
    a step traces ``fn`` with the numbers as arguments, so a new learning rate is not a new trace."""
    kind: int
    backend: Any
    fn: Callable[..., Any]
    attrs: dict
    numbers: Callable[[], tuple]
    inputs: tuple
    outs: tuple


class State(NamedTuple):
    """Read an optimizer's state array ``optimizer.state[key][name]`` (looked up when the entry runs,
    so a ``load_state_dict`` between calls is seen)."""
    kind: int
    slot: int
    optimizer: Any
    key: int
    name: str


class SetState(NamedTuple):
    """``optimizer.state[key][name]`` becomes slot ``slot`` (an optimizer's update of its state)."""
    kind: int
    optimizer: Any
    key: int
    name: str
    slot: int


Entry = Union[Load, Arg, Grad, Kernel, Fused, Fresh, Host, SetGrad, SetData, Backward, AssertFinite, Call, State,
              SetState]


class CompileError(PolygradError, TypeError):
    """A compiled function was called with an argument it cannot guard."""


class StaleCapture(PolygradError):
    """Raised by a :class:`Call`'s ``numbers`` when what the capture recorded no longer holds (an
    optimizer's rule changed shape): the replay is a fault, and the call runs eagerly."""


def _numbers(call: Any) -> tuple:
    """``call.numbers()``; an exception from it is host code's (the user's: a bad learning-rate
    schedule), except :class:`StaleCapture`."""
    try:
        return call.numbers()
    except StaleCapture:
        raise
    except Exception as exc:  # noqa: BLE001 - the optimizer's error is the user's
        raise _HostFailed(exc) from exc


class _Refused(Exception):
    """Internal: what was seen while capturing cannot be replayed (the reason is the message)."""


class _ReplayFault(Exception):
    """Internal: a kernel failed during a replay; ``after_step`` when a non-idempotent host call ran."""

    def __init__(self, exc: BaseException, after_step: bool):
        super().__init__(str(exc))
        self.exc = exc
        self.after_step = after_step


class _NotFinite(Exception):
    def __init__(self) -> None:
        super().__init__("a rewritten replay met a non-finite sparse value (the eager step gives NaN there)")


class _HostFailed(Exception):
    """Internal: host code (an optimizer call) raised during a replay; its error is the user's."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


class _ShapeMismatch(Exception):
    def __init__(self, want: tuple, got: tuple):
        super().__init__(f"a replayed kernel returned shape {got}, the capture saw {want}")


def _call_source(ins: tuple, kwargs: dict, const: Callable[[Any], str]) -> str:
    """The argument list of a kernel call in generated code: its input buffers ``b<i>``, then its
    keyword arguments as constants (``const`` names a value in the code's namespace); one splatted
    dict where a key is not an identifier."""
    args = [f"b{i}" for i in ins]
    if all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in kwargs):
        args += [f"{k}={const(v)}" for k, v in kwargs.items()]
    elif kwargs:
        args.append(f"**{const(kwargs)}")
    return ", ".join(args)


def _shape_check_source(var: str, be: Any, shape: tuple, const: Callable[[Any], str]) -> str:
    """The generated line that raises :class:`_ShapeMismatch` (bound as ``Mismatch``) when buffer
    ``var`` does not have the recorded shape; ``.shape`` directly unless the backend overrides
    ``Backend.shape``."""
    got = f"{var}.shape" if type(be).shape is Backend.shape else f"{const(be.shape)}({var})"
    if got != f"{var}.shape" and _holds_numpy(be):
        # numpy's arrays (the numpy backend's shape() returns .shape): the attribute first, the
        # backend's method only when it differs -- a call per buffer costs ~6 us of a small step
        return f"if {var}.shape != {const(shape)} and {got} != {const(shape)}: raise Mismatch({const(shape)}, {got})"
    return f"if {got} != {const(shape)}: raise Mismatch({const(shape)}, {got})"


def _holds_numpy(be: Any) -> bool:
    """Whether ``be``'s arrays are numpy arrays (they have ``.shape``) whose shape is ``.shape``
    (probed: a backend with a logical shape of its own, a padded layout, is asked every time)."""
    try:
        return all(be.owns(probe) and tuple(be.shape(probe)) == probe.shape
                   for probe in (np.empty((2, 3)), np.empty(0), np.empty(())))
    except Exception:  # noqa: BLE001 - a backend that cannot tell: its own shape() decides
        return False


class Capture:
    """A recorded step: the program, each slot's (backend, shape, dtype), the result's spec, and
    what a call must find unchanged to replay it (``guards``: a
    :class:`polygrad.compile.guards.StateGuards`).  ``fast`` is the executor's generated function
    (set by :func:`polygrad.compile.executor.prepare`)."""

    def __init__(self, program: list, meta: list, spec: tuple, fresh_draws: bool, guards: Any):
        self.program, self.meta = program, meta
        self.spec = spec
        self.fresh_draws = fresh_draws
        self.kernels = sum(1 for e in program if e[0] in (KERNEL, FUSED, CALL))
        self.fast: Callable[[list, dict, dict], Any] | None = None
        self.checked: Callable[[list, dict, dict], Any] | None = None  # the checked variant, made on demand
        self.guards = guards

    def still_valid(self, flat: list) -> bool:
        return bool(self.guards.still_valid(flat))


def _value_slots(value: tuple, out: list) -> None:
    if value[0] == 1:
        out.append(value[1])
    elif value[0] == 3:
        _value_slots(value[2], out)


def _reads(e: tuple) -> list[int]:
    """The slots a program entry reads."""
    kind = e[0]
    if kind in (KERNEL, FUSED):
        return list(e[3])
    if kind == CALL:
        return list(e[5])
    if kind in (SET_DATA,):
        return [e[2]]
    if kind == SET_STATE:
        return [e[4]]
    if kind == ASSERT_FINITE:
        return [e[1]]
    out: list[int] = []
    if kind == SET_GRAD:
        _value_slots(e[2], out)
    elif kind == BACKWARD:
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
        if e[0] == KERNEL:
            producer[e[5]] = n
        elif e[0] in (FUSED, CALL):
            for slot in e[5 if e[0] == FUSED else 6]:
                if slot >= 0:
                    producer[slot] = n
        elif e[0] in (LOAD, ARG, GRAD, FRESH, STATE):
            producer[e[1]] = n
    return readers, producer


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


def _same_ref(a: Any, b: Any) -> bool:
    """Two references to a tensor (a flattened-argument index, or the tensor: by identity)."""
    return a is b or (type(a) is int and type(b) is int and a == b)


def _mismatch(a: Capture, b: Capture) -> str | None:
    """Why two captures of the same guard key differ (None: they agree, replay is safe).

    Two captures differ when the step's Python code decides something the guards do not see: a
    learning rate or counter computed in Python and turned into a tensor (a constant the replay
    would freeze), or control flow that depends on values."""
    if len(a.program) != len(b.program) or a.spec[0] != b.spec[0]:
        return "the step ran a different sequence of ops when captured twice (control flow on values?)"
    for x, y in zip(a.program, b.program):
        if x[0] != y[0]:
            return "the step ran a different sequence of ops when captured twice (control flow on values?)"
        if x[0] == LOAD:
            if x[2] is not y[2] and (x[2].requires_grad or y[2].requires_grad):
                return ("the step makes a tensor that requires grad itself (a leaf it backpropagates into: "
                        "saliency, FGSM, a gradient penalty); a replay would keep the first one")
            if x[2] is not y[2] and _constant_changed(x[2], y[2]):
                return ("a value the step makes from Python numbers or host data (a learning rate? a "
                        "counter?) changed between calls; pass it as a tensor argument")
        elif x[0] in (KERNEL, FUSED):
            if x[1] is not y[1] or x[2] != y[2] or x[3] != y[3] or not _same(x[4], y[4]) or x[5] != y[5]:
                return f"op '{x[2][0]}' ran with different operands or attributes when captured twice"
        elif x[0] == HOST:
            if getattr(x[1], "__self__", x[1]) is not getattr(y[1], "__self__", y[1]):
                return "the step called a different optimizer when captured twice"
        elif x[0] in (SET_GRAD, SET_DATA) and not _same_ref(x[1], y[1]):
            return "the step wrote gradients or storage of different tensors when captured twice"
        elif x[0] == GRAD and x[2] is not y[2]:
            return "the step wrote gradients or storage of different tensors when captured twice"
        elif x[0] == CALL:
            if x[1] is not y[1] or x[2] != y[2] or not _same(x[3], y[3]) or x[5] != y[5] or x[6] != y[6]:
                return "an optimizer update or random draw ran with a different rule or operands when captured twice"
        elif x[0] in (STATE, SET_STATE) and x[1:] != y[1:]:  # slots, optimizer (by identity), key, name
            return "the step read or wrote different optimizer state when captured twice"
    return None
