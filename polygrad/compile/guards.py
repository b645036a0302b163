"""Guards: what a compiled function's cache key is made of (argument structure, shapes, modes)."""
from __future__ import annotations

import types
from typing import Any, Callable

import numpy as np

from ..sparse import SparseTensor
from ..tensor import Tensor
from .program import CompileError


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
