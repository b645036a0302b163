"""The ``polygrad_compile_kernels`` hook for the jax backend: a captured step's kernels as one
``jax.jit`` function (see ``polygrad/compile/backend_compile.py`` for what polygrad keeps)."""
from __future__ import annotations

from typing import Any, Callable

import jax

import polygrad as pg
from polygrad.compile import Call, Fused, Kernel
from polygrad.sparse.pattern import Pattern

from .kernels import pattern_arrays


def compile_kernels(program: Any, backend: Any) -> Callable:
    """``jax.jit`` of the program's entries called in order (the kernels as the registry has them
    now, plugin overrides included; ``Call`` entries -- the optimizer's updates, dropout draws --
    traced with their host numbers as arguments, so a new learning rate or key is no new trace)."""
    forward = pg.kernel_table(backend.name)
    fused = pg.kernel_table(backend.name, kind="vjp")
    for e in program.entries:   # device index arrays made now, never cached as tracers
        for value in (e.kwargs if isinstance(e, Fused) else e.attrs).values():
            if isinstance(value, Pattern):
                pattern_arrays(value)

    def run(*arrays: Any) -> list:
        *arrays, numbers = arrays
        calls = iter(numbers)
        buf = dict(zip(program.inputs, arrays))
        for e in program.entries:
            if isinstance(e, Kernel):
                buf[e.out] = forward[e.key](*[buf[i] for i in e.inputs], **e.attrs)
            elif isinstance(e, Call):
                buf.update(zip(e.outs, e.fn(*[buf[i] for i in e.inputs], *next(calls), **e.attrs)))
            else:
                grads = fused[e.key](*[buf[i] for i in e.inputs], **e.kwargs)
                for slot, g in zip(e.outs, grads):
                    if slot >= 0:
                        buf[slot] = g
        return [buf[s] for s in program.outputs]

    return jax.jit(run)
