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
(``polygrad/events.py``).
"""
from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "polygrad"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- registration hooks (called once, at load) -------------------------------------------------

@hookspec
def polygrad_backends() -> list[Any]:
    """Return the :class:`polygrad.Backend` instances this plugin provides.

    Each backend is listed by ``pg.list_backends()`` under its ``name``; its kernels enter the
    dispatch table keyed by ``(backend name, op, layout)``.
    """


@hookspec
def polygrad_kernels() -> list[Any]:
    """Return :class:`polygrad.KernelOverride` records: kernels for an *existing* backend.

    This is how a plugin speeds up some ops of a backend it does not own (e.g. scipy.sparse SpMM
    for the ``numpy`` backend).  For each ``(backend, op, layout)`` the kernel with the highest
    ``priority`` wins; the backend's own kernels have priority 0.
    """


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
