"""The plugin contract: pluggy hook specifications for the entry-point group ``polygrad``.

A plugin is any importable object (usually a module) named by an entry point in the group
``polygrad``; polygrad imports it once, registers it with its pluggy PluginManager and calls the
*registration* hooks once.  Per-op dispatch afterwards is a dictionary lookup, never a hook call.

*Event* hooks are called only when at least one registered plugin implements them, so a session
with no monitor pays nothing for them.  Implement a hook with ``@polygrad.hookimpl``::

    import polygrad as pg

    @pg.hookimpl
    def polygrad_backends():
        return [MyBackend()]

Hook implementations must not raise; a registration hook that raises is reported by
``pg.list_backends()`` and its plugin is skipped.  An *event* hook implementation that raises is
reported once (a ``PluginWarning``, ``pg.stats()["hook_failures"]``, ``polygrad backends``) and
disabled for the rest of the process; the op or backward pass that fired it is unaffected
(``polygrad/runtime/events.py``).
"""
from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "polygrad"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- registration hooks (called once, at load) and the step compiler ----------------------------

@hookspec
def polygrad_backends() -> list[Any]:
    """Return the :class:`polygrad.Backend` instances this plugin provides.

    Each backend is listed by ``pg.list_backends()`` under its ``name``; its kernels enter the
    dispatch table keyed by ``(backend name, op, layout)``.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations


@hookspec
def polygrad_kernels() -> list[Any]:
    """Return :class:`polygrad.KernelOverride` records: kernels for an *existing* backend.

    This is how a plugin speeds up some ops of a backend it does not own (e.g. scipy.sparse SpMM
    for the ``numpy`` backend).  For each ``(backend, op, layout)`` the kernel with the highest
    ``priority`` wins; the backend's own kernels have priority 0.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations


@hookspec(firstresult=True)
def polygrad_compile_kernels(program: Any, backend: Any) -> Any:
    """Compile a captured step's kernels into one callable, or return None to decline.

    Called once per capture of ``pg.compile(step, pure=True)`` whose kernels all run on
    ``backend`` (a :class:`polygrad.Backend`), with ``program`` a
    :class:`polygrad.compile.backend_compile.KernelProgram`: the step's ``Kernel``/``Fused`` entries in order,
    the ``inputs`` slots they read, the ``outputs`` slots the rest of the step reads, each slot's
    ``(backend, shape, dtype)``.  Return ``fn(*input_arrays) -> sequence of output arrays``
    computing what calling those kernels in order does (JAX: one ``jax.jit``).  A plugin should
    decline (None) for backends it does not own; the first non-None answer is used.

    polygrad keeps the guards, runs the rest of the step (arguments, random draws, gradients,
    optimizer calls, the result) as a replay does, and falls back to calling the kernels one by one
    -- reported like a kernel fallback, op ``"compiled-step"`` -- when ``fn`` raises or returns
    something of another shape.  See ``polygrad/compile/backend_compile.py`` and docs/writing-a-backend.md.
    """
    raise NotImplementedError  # a specification: pluggy calls the implementations


# --- event hooks (called only when implemented) -------------------------------------------------

@hookspec
def polygrad_op_executed(op: str, backend: str, layout: str, inputs: tuple, output: Any) -> None:
    """An op ran. ``inputs``/``output`` are polygrad tensors; do not keep references to them."""


@hookspec
def polygrad_layout_chosen(op: str, shape: tuple, nnz: int, density: float, layout: str,
                           reason: str) -> None:
    """The automatic layout policy picked ``layout`` ("dense", "csr", "coo") for an operand."""


@hookspec
def polygrad_fallback(op: str, backend: str, layout: str, exception: BaseException) -> None:
    """A kernel of ``backend`` failed for ``op``; the op is being recomputed by the fallback chain."""


@hookspec
def polygrad_backward_finished(num_nodes: int, seconds: float, grads: list) -> None:
    """A backward pass finished; ``grads`` lists the (leaf tensor, gradient) pairs it produced."""
