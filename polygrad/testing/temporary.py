"""Register a plugin for the duration of a block, then remove every trace of it.

``pg.register_plugin`` is permanent for the process (kernel tables are built once, at
registration).  Tests and the conformance kit need plugins that come and go -- a deliberately
wrong backend must not leak into the next test's ``pg.list_backends()`` -- so this restores the
registry's backends, kernel tables and priorities exactly as they were::

    with temporary_plugin(my_module):
        run_conformance("mybackend")
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from ..runtime.backend import Backend
from ..runtime.hookspecs import hookimpl
from ..runtime.registry import registry


class BackendPlugin:
    """A plugin object that provides the given Backend instances (for runtime registration)."""

    def __init__(self, *backends: Backend) -> None:
        self.backends = list(backends)

    @hookimpl
    def polygrad_backends(self) -> list[Backend]:
        return list(self.backends)


def _restore(live: dict, saved: dict) -> None:
    """Put ``live`` (a dict of dicts) back to ``saved``, keeping the identity of every dict."""
    for key in list(live):
        if key not in saved:
            del live[key]
    for key, inner in saved.items():
        if key in live:
            live[key].clear()
            live[key].update(inner)
        else:
            live[key] = dict(inner)


@contextmanager
def registry_snapshot() -> Iterator[None]:
    """Undo, on exit, every registration made inside the block (plugins, backends, kernels).

    For tests of code that calls ``pg.register_plugin`` itself (e.g. a documentation example).
    """
    registry.load()
    with registry._lock:
        plugins = {id(p) for p in registry.pm.get_plugins()}
        entries = dict(registry.entries)
        tables = {k: dict(v) for k, v in registry.tables.items()}
        vjps = {k: dict(v) for k, v in registry.vjp_tables.items()}
        priorities = dict(registry._priorities)
    try:
        yield
    finally:
        with registry._lock:
            for plugin in list(registry.pm.get_plugins()):
                if id(plugin) not in plugins:
                    registry.unregister_plugin(plugin)
            registry.entries.clear()
            registry.entries.update(entries)
            _restore(registry.tables, tables)
            _restore(registry.vjp_tables, vjps)
            registry._priorities.clear()
            registry._priorities.update(priorities)


@contextmanager
def temporary_plugin(plugin: Any, name: str | None = None) -> Iterator[Any]:
    """Register ``plugin`` (a module/object with hookimpls, or a :class:`polygrad.Backend`).

    On exit the plugin is unregistered and the registry's entries, kernel tables, fused-backward
    tables and priorities are restored, so later code sees exactly the backends it saw before.
    Yields the registered plugin object.
    """
    if isinstance(plugin, Backend):
        plugin = BackendPlugin(plugin)
    with registry_snapshot():
        registry.register_plugin(plugin, name or f"polygrad-temporary-{id(plugin)}")
        yield plugin
