"""Guards: what a compiled function's cache key is made of (argument structure, shapes, modes), and
what else a pure replay must find unchanged since its capture (:class:`StateGuards`)."""
from __future__ import annotations

import inspect
import operator
import struct
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..sparse import SparseTensor
from ..tensor import Tensor
from .program import CompileError


SUPPORTED = ("tensors, Python scalars (bool, int, float), None, strings, numpy scalars, tuples, lists and "
             "dicts of those, modules and other hashable objects (optimizers, functions: by identity)")


def flatten_call(fn: Callable, args: tuple, kwargs: dict, flat: list, key: list) -> None:
    """:func:`_flatten` over a call's arguments; an argument it cannot guard is a CompileError
    that names it (by parameter name where ``fn``'s signature says it) and what is supported."""
    try:
        key.append((tuple, len(args)))
        for i, a in enumerate(args):
            try:
                _flatten(a, flat, key)
            except _Unsupported as bad:
                bad.path += [i, "args"]
                raise
        if kwargs:
            key.append((dict, tuple(kwargs)))
            for k, v in kwargs.items():
                try:
                    _flatten(v, flat, key)
                except _Unsupported as bad:
                    bad.path += [k, "kwargs"]
                    raise
    except _Unsupported as bad:
        raise CompileError(f"pg.compile({getattr(fn, '__name__', fn)!s}): {_argument_name(fn, args, bad.path)} is "
                           f"{bad.what}, which a compiled function cannot guard; it takes {SUPPORTED}") from None


class _Unsupported(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what
        self.path: list = []


def _argument_name(fn: Callable, args: tuple, path: list) -> str:
    """'argument 'x'' / 'argument 'batch'[2]' for the path of an unsupported value."""
    path = list(reversed(path))
    if path and path[0] == "args" and len(path) > 1:  # positional: its parameter's name if known
        index = path[1]
        name = f"positional argument {index}"
        try:
            params = [q for q in inspect.signature(fn).parameters.values()
                      if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
            if index < len(params):
                name = f"argument {params[index].name!r}"
        except (TypeError, ValueError):
            pass
        rest = path[2:]
    elif path and path[0] == "kwargs" and len(path) > 1:
        name, rest = f"argument {path[1]!r}", path[2:]
    else:
        name, rest = "an argument", path[1:]
    return name + "".join(f"[{p!r}]" for p in rest)


def _flatten(x: Any, flat: list, key: list) -> None:
    """Append ``x``'s tensors to ``flat`` and what the guard compares to ``key``."""
    if isinstance(x, Tensor):
        if isinstance(x, SparseTensor):
            key.append(("sparse", x.pattern, x.dtype, x._be.name, x.requires_grad))
            flat.append(x._values)
        else:
            key.append(("tensor", x.shape, x.dtype, x._be.name, x.requires_grad))
            flat.append(x)
    elif isinstance(x, (float, complex, np.inexact)):
        # by its bits: 0.0 == -0.0 (and hash alike), so a value key served -0.0 the capture of
        # 0.0 (1 / (x * s) gave +inf where eager gives -inf); a NaN keyed by value never matched
        key.append((type(x), _scalar_bits(x)))
    elif x is None or isinstance(x, (bool, int, str, np.number)):
        key.append((type(x), x))
    elif isinstance(x, (tuple, list)):
        key.append((type(x), len(x)))
        for i, v in enumerate(x):
            try:
                _flatten(v, flat, key)
            except _Unsupported as bad:
                bad.path.append(i)
                raise
    elif isinstance(x, dict):
        key.append((dict, tuple(x)))
        for k, v in x.items():
            try:
                _flatten(v, flat, key)
            except _Unsupported as bad:
                bad.path.append(k)
                raise
    elif isinstance(x, np.ndarray):
        raise _Unsupported(f"a numpy array of shape {x.shape} (it would be frozen into the capture; "
                           "pass pg.tensor(array) instead)")
    elif isinstance(x, (set, frozenset)):
        raise _Unsupported(f"a {type(x).__name__} (unordered: pass a tuple or list)")
    elif hasattr(x, "training") and callable(getattr(x, "modules", None)):  # a module (e.g. self)
        key.append(("module", x, tuple(m.training for m in x.modules())))
    else:  # optimizers, callables, other objects: by identity (their tensors are read live)
        try:
            hash(x)
        except TypeError:
            raise _Unsupported(f"an unhashable {type(x).__name__}") from None
        key.append(("object", x))


def _modules_of(fn: Callable, found: dict, tensors: dict, depth: int = 0, optimizers: dict | None = None) -> None:
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
            _modules_of(obj, found, tensors, depth + 1, optimizers)
        elif isinstance(obj, Tensor):
            tensors[id(obj)] = obj
        elif isinstance(obj, (list, tuple)) and len(obj) <= 10_000:
            tensors.update((id(t), t) for t in obj if isinstance(t, Tensor))
        elif isinstance(getattr(obj, "param_groups", None), list):
            tensors.update((id(p), p) for g in obj.param_groups for p in g.get("params", ()))
            if optimizers is not None:
                optimizers[id(obj)] = obj


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return False
    return True


def param_lists(optimizer: Any) -> tuple:
    """An optimizer's parameter lists, one tuple per group (compared by identity)."""
    return tuple(tuple(g.get("params", ())) for g in optimizer.param_groups)


def _same_objects(a: Any, b: tuple) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _same_param_lists(groups: list, lists: tuple) -> bool:
    """Whether ``groups`` (an optimizer's param_groups) hold the parameters ``lists`` (its
    :func:`param_lists` at capture) in order, without building the lists again."""
    if len(groups) != len(lists):
        return False
    for g, seen in zip(groups, lists):
        params = g.get("params", ())
        if not _same_objects(params if type(params) in (list, tuple) else tuple(params), seen):
            return False
    return True


#: arrays of at most this many bytes are first compared by their bytes (two small copies and one
#: memcmp: ~0.2 us where ``np.array_equal`` costs ~2-4 us per call, on every replay's guard)
_BYTES_FIRST = 1 << 16


def _scalar_bits(x: Any) -> bytes:
    """The bytes of a floating or complex scalar (a Python number or a numpy scalar)."""
    if type(x) is float:
        return _DOUBLE.pack(x)
    if type(x) is complex:
        return _DOUBLE.pack(x.real) + _DOUBLE.pack(x.imag)
    return np.asarray(x).tobytes()


_DOUBLE = struct.Struct("<d")


def _same_array(now: np.ndarray, seen: np.ndarray) -> bool:
    """Whether ``now`` holds what ``seen`` (a copy taken at capture) holds: same shape, dtype and
    values, NaN equal to NaN for floating kinds (``np.array_equal(equal_nan=...)``)."""
    if now.shape != seen.shape or now.dtype != seen.dtype:
        return False
    kind = seen.dtype.kind
    # the same bits (in C order) are the same values for these kinds, NaNs at the same places
    # included; different bits may still be equal values (-0.0 and 0.0, NaN payloads): then numpy decides
    # (plain arrays only: a subclass's tobytes may show other bytes, e.g. a masked array's filled ones)
    if (kind in "biufc" and seen.nbytes <= _BYTES_FIRST and type(now) is np.ndarray and type(seen) is np.ndarray
            and now.tobytes() == seen.tobytes()):
        return True
    return bool(np.array_equal(now, seen, equal_nan=kind in "fc"))


def python_state(fn: Callable) -> list[tuple[Any, str, Any, Any]]:
    """What ``fn``'s Python reads that is not an argument: each closure cell and each global it
    names (for a bound method, of its function), as ``(where, name, object, copy)``; ``copy`` is the
    content of a numpy array (guarded by value: in-place edits count), else None (by identity: a
    rebound name counts).  Attributes reached through objects are not followed."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    out: list[tuple[Any, str, Any, Any]] = []
    if code is None:
        return out
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        if _filled(cell):
            obj = cell.cell_contents
            out.append((cell, name, obj, obj.copy() if isinstance(obj, np.ndarray) else None))
    g = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in g:
            obj = g[name]
            out.append((g, name, obj, obj.copy() if isinstance(obj, np.ndarray) else None))
    return out


def _python_unchanged(state: list) -> bool:
    for where, name, obj, copy in state:
        if isinstance(where, dict):
            if where.get(name, _MISSING) is not obj:
                return False
        elif not _filled(where) or where.cell_contents is not obj:
            return False
        if copy is not None and not _same_array(obj, copy):
            return False
    return True


_MISSING = object()


def contents(state: list) -> list:
    """A shallow snapshot of each list or dict in ``state`` (its items, compared by identity; only
    the length of one over 1,000 items or of a set); None for other objects."""
    return [_contents(obj) for _, _, obj, _ in state]


def _contents(obj: Any) -> Any:
    if isinstance(obj, list):
        return tuple(obj) if len(obj) <= 1000 else len(obj)
    if isinstance(obj, dict):
        return tuple(obj.items()) if len(obj) <= 1000 else len(obj)
    if isinstance(obj, set):
        return len(obj)
    return None


def hyperparameters(optimizer: Any) -> tuple:
    """An optimizer's groups without their parameter lists (lr, momentum...), as a tuple."""
    return tuple(tuple((k, v) for k, v in g.items() if k != "params") for g in optimizer.param_groups)


def _same_contents(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(x is y or (type(x) is tuple and _same_contents(x, y)) or
                                        (type(x) in (int, float, str, bool) and x == y) for x, y in zip(a, b))
    return bool(a == b)


def python_changed(state: list, before: list) -> str | None:
    """What of the closure cells and globals in ``state`` (with ``before = contents(state)`` taken
    before the step ran) the step itself changed: rebound, an array edited in place, a list or
    dict changed (appended to, a counter stored), an optimizer's hyperparameters set.  A replay
    without Python would not repeat it."""
    for entry, snap in zip(state, before):
        where, name, held, copy = entry[0], entry[1], entry[2], entry[3]
        now = where.get(name, _MISSING) if isinstance(where, dict) else (
            where.cell_contents if _filled(where) else _MISSING)
        if now is not held:
            return f"the step rebinds the Python variable {name!r}"
        if copy is not None and not _same_array(entry[2], copy):
            return f"the step edits the numpy array {name!r} in place"
        if snap is not None and not _same_contents(_contents(held), snap):
            return f"the step changes {name!r} (a side effect: appending to a list, storing a counter)"
    return None


@dataclass
class StateGuards:
    """What a pure replay must find as the capture did, beyond the cache key: whether each gradient
    the step accumulates into was set, values read on the host, ``requires_grad`` of every tensor
    the step read, the train/eval mode of every module that ran (reported by ``Module.__call__``),
    each optimizer's parameter lists, numpy arrays read on the host (by content) and the closure
    cells and globals of the function (by identity; arrays by content)."""
    grad: list = field(default_factory=list)            # (ref, had a grad)
    host_values: list = field(default_factory=list)     # (ref, values read on the host)
    requires_grad: list = field(default_factory=list)   # (ref, flag)
    modules: list = field(default_factory=list)         # (module, training)
    optimizers: list = field(default_factory=list)      # (optimizer, param lists)
    arrays: list = field(default_factory=list)          # (array, copy)
    python: list = field(default_factory=list)          # python_state(fn)

    def still_valid(self, flat: list) -> bool:
        for ref, had in self.grad:
            t = flat[ref] if type(ref) is int else ref
            if (t.grad is not None) != had:
                return False
        for ref, flag in self.requires_grad:
            t = flat[ref] if type(ref) is int else ref
            if t.requires_grad != flag:
                return False
        for m, training in self.modules:
            if m.training != training:
                return False
        for opt, lists in self.optimizers:
            if not _same_param_lists(opt.param_groups, lists):
                return False
        for array, copy in self.arrays:
            if not _same_array(array, copy):
                return False
        if not _python_unchanged(self.python):
            return False
        for ref, seen in self.host_values:  # values the capture read on the host: unchanged?
            t = flat[ref] if type(ref) is int else ref
            if not _same_array(t._be.to_numpy(t._data), seen):
                return False
        return True
