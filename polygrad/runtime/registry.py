"""Backend discovery and selection.

Backends arrive through the pluggy entry-point group ``polygrad`` -- the built-in ones exactly
like any third party's.  Each entry point is loaded and registered
in isolation: one that fails to import, raises in a registration hook or whose ``is_available()``
raises is recorded with the reason and skipped, so ``import polygrad`` never breaks because of a
plugin.  Registration builds the per-backend kernel tables once; dispatch then only does dict
lookups.  Selection is context-local (``contextvars``), so threads and asyncio tasks don't leak
their choice into each other.

**Deferred plugins.**  A plugin that also names its backends in the entry-point group
``polygrad.backends`` (``<backend name> = "<plugin module>"``) is *not* imported at discovery:
listing backends shows them from metadata alone (availability: whether the distribution's
requirements are installed), and the plugin -- with its array library -- is imported the first
time one of those backends is used (``pg.use_backend``, ``t.to``, ``pg.tensor`` of its array,
its kernel table).  So a process that only uses numpy never imports JAX or Dask because their
plugins are installed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from typing import Any, Iterator

import numpy as np
import pluggy

from . import hookspecs
from .backend import Backend, KernelOverride, contract_problem
from ..ir.errors import BackendUnavailableError
from .events import GuardedEvent
from ..ir.errors import describe_exception
from ..ir.ops import Op, kernel_key

ENTRY_POINT_GROUP = "polygrad"
#: ``<backend name> = "<plugin module>"``: the plugin is imported when that backend is first used
DEFERRED_GROUP = "polygrad.backends"
EVENT_HOOKS = ("polygrad_op_executed", "polygrad_layout_chosen", "polygrad_fallback",
               "polygrad_backward_finished")


@dataclass(frozen=True)
class BackendInfo:
    """One row of ``pg.list_backends()``."""
    name: str
    available: bool
    reason: str          # why not available ("" when available)
    origin: str          # the distribution that provides it (or "<runtime>" for pg.register_plugin)
    status: str          # "ok", "unavailable" or "failed" (import/registration error)
    #: False for a deferred plugin's backend not used yet (its plugin and library not imported;
    #: ``available`` then only says its distribution's requirements are installed)
    loaded: bool = True

    def __str__(self) -> str:
        return f"{self.name} ({'available' if self.available else self.status + ': ' + self.reason})"


@dataclass
class _Entry:
    name: str
    origin: str
    backend: Backend | None = None
    error: str = ""
    available: bool | None = None     # None: not checked yet (checked lazily)
    reason: str = ""
    deferred: Any = None              # the entry point to import on first use (deferred plugins)


class Registry:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.entries: dict[str, _Entry] = {}
        #: per backend name: {(Op, layout): kernel}, and the fused backward kernels
        self.tables: dict[str, dict[tuple[Op, str], Any]] = {}
        self.vjp_tables: dict[str, dict[tuple[Op, str], Any]] = {}
        self._priorities: dict[tuple[str, Op, str, str], int] = {}
        #: event hook callers, None when no plugin implements them (so firing costs one check)
        self.events: dict[str, Any] = dict.fromkeys(EVENT_HOOKS)
        #: plugin name -> names of the backends it provided (removed again by unregister_plugin)
        self._provided: dict[str, list[str]] = {}
        self._lock = threading.RLock()
        self.loaded = False
        self._default: str | None = None  # cached default_name(); reset on (un)registration
        #: deferred plugin module -> (entry point, plugin name, backend names it declares)
        self._deferred: dict[str, tuple[Any, str, list[str]]] = {}

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        with self._lock:
            if self.loaded:
                return
            self.loaded = True
            try:
                eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
                lazy = sorted(entry_points(group=DEFERRED_GROUP), key=lambda e: e.name)
            except Exception as exc:  # noqa: BLE001 - broken metadata on sys.path must not break us
                self.entries.setdefault("<entry points>", _Entry("<entry points>", "<unknown>", error=(
                    f"could not read the entry points of group {ENTRY_POINT_GROUP!r}: {describe_exception(exc)}")))
                return
            plugin_names = {ep.value: ep.name for ep in eps}
            for ep in lazy:
                _, name, names = self._deferred.setdefault(ep.value, (ep, plugin_names.get(ep.value, ep.value), []))
                names.append(ep.name)
                self.entries.setdefault(ep.name, _Entry(ep.name, _origin(ep), deferred=ep))
            for ep in eps:
                if ep.value in self._deferred:
                    continue  # imported when one of its backends is first used
                try:
                    plugin = ep.load()
                except BaseException as exc:  # noqa: BLE001 - a broken plugin must not break us
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    self.entries.setdefault(ep.name, _Entry(ep.name, _origin(ep),
                                                            error=f"failed to import: {describe_exception(exc)}"))
                    continue
                self.register_plugin(plugin, name=ep.name, origin=_origin(ep))

    def realize(self, name: str) -> None:
        """Import the deferred plugin that declares backend ``name`` (once; a no-op otherwise).

        Every backend that plugin declares is replaced by what its registration provides; a
        declared backend it did not provide is listed as unavailable, one whose plugin fails to
        import as failed, with the reason."""
        with self._lock:
            entry = self.entries.get(name)
            if entry is None or entry.deferred is None:
                return
            ep = entry.deferred
            _, plugin_name, names = self._deferred[ep.value]
            origin = entry.origin
            for declared in names:
                if declared in self.entries and self.entries[declared].deferred is not None:
                    del self.entries[declared]
            try:
                plugin = ep.load()
            except BaseException as exc:  # noqa: BLE001 - a broken plugin must not break us
                if isinstance(exc, KeyboardInterrupt):
                    raise
                for declared in names:
                    self.entries.setdefault(declared, _Entry(declared, origin, error=(
                        f"failed to import {ep.value!r}: {describe_exception(exc)}")))
                return
            if self.pm.is_registered(plugin):  # registered before and its backends removed since
                self.pm.unregister(plugin)
            self.register_plugin(plugin, name=plugin_name, origin=origin)
            for declared in names:
                self.entries.setdefault(declared, _Entry(declared, origin, available=False, reason=(
                    f"plugin {ep.value!r} declares it (entry-point group {DEFERRED_GROUP!r}) but did not "
                    "provide it here")))

    def deferred_names(self) -> list[str]:
        """Backends whose plugin is not imported yet."""
        self.load()
        return [e.name for e in self.entries.values() if e.deferred is not None]

    def register_plugin(self, plugin: Any, name: str | None = None, origin: str = "<runtime>") -> None:
        """Register a plugin object (module or instance with hookimpls) at runtime.

        A plugin that pluggy rejects, or whose registration hooks raise or return something that
        is not a Backend / KernelOverride, is recorded as failed (``pg.list_backends()``) and
        unregistered again, so none of its hooks -- event hooks included -- ever runs."""
        with self._lock:
            name = name or getattr(plugin, "__name__", None) or repr(plugin)
            if self.pm.is_registered(plugin) or self.pm.has_plugin(name):
                return
            self._default = None
            try:
                self.pm.register(plugin, name=name)
                # a @hookimpl whose name matches no hook (a misspelling) is an error, not ignored
                self.pm.check_pending()
            except Exception as exc:  # pluggy's PluginValidationError names the hook
                if self.pm.is_registered(plugin):
                    self.pm.unregister(plugin)
                self.entries.setdefault(name, _Entry(name, origin,
                                                     error=f"failed to register: {describe_exception(exc)}"))
                return
            try:
                self._collect(plugin, name, origin)
            except BaseException as exc:  # noqa: BLE001 - isolate the plugin, keep loading the others
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self.pm.unregister(plugin)
                self.entries.setdefault(name, _Entry(name, origin,
                                                     error=f"raised in registration: {describe_exception(exc)}"))
            self._refresh_events()

    def unregister_plugin(self, plugin: Any) -> None:
        """Unregister a plugin: its hooks stop firing and the backends it provided are removed."""
        with self._lock:
            self._default = None
            if self.pm.is_registered(plugin):
                for bname in self._provided.pop(self.pm.get_name(plugin) or "", ()):
                    self.entries.pop(bname, None)
                    self.tables.pop(bname, None)
                    self.vjp_tables.pop(bname, None)
                    for key in [k for k in self._priorities if k[0] == bname]:
                        del self._priorities[key]
                self.pm.unregister(plugin)
            self._refresh_events()

    def _call_own_hook(self, plugin: Any, hook: str) -> list:
        """This plugin's own ``@hookimpl`` of ``hook`` (an unmarked function of that name is not
        an implementation, exactly as pluggy sees it)."""
        out: list = []
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            if impl.plugin is plugin:
                out.extend(impl.function() or [])
        return out

    def _collect(self, plugin: Any, name: str, origin: str) -> None:
        """Call the plugin's registration hooks and install what they return.

        Everything is validated and staged before anything is installed, so a plugin that fails
        half way leaves no partial kernel table behind; the caller records the failure."""
        backends = self._call_own_hook(plugin, "polygrad_backends")
        overrides = self._call_own_hook(plugin, "polygrad_kernels")
        staged = []
        for backend in backends:
            bname = getattr(backend, "name", "")
            if not isinstance(backend, Backend) or not bname or not isinstance(bname, str):
                raise TypeError(f"polygrad_backends returned {backend!r}, which is not a polygrad.Backend "
                                "with a name")
            kernels = [(Op(op), layout, k) for (op, layout), k in dict(backend.kernels).items()]
            vjps = [(Op(op), layout, k) for (op, layout), k in dict(backend.vjp_kernels).items()]
            staged.append((bname, backend, kernels, vjps))
        staged_overrides = [(ov, Op(ov.op)) for ov in overrides if isinstance(ov, KernelOverride)]
        for bname, backend, kernels, vjps in staged:
            if bname in self.entries and self.entries[bname].backend is not None:
                self.entries[f"{bname} ({origin})"] = _Entry(bname, origin, error=(
                    f"duplicate backend name {bname!r}: already provided by {self.entries[bname].origin}"))
                continue
            self.entries[bname] = _Entry(bname, origin, backend=backend)
            self._provided.setdefault(name, []).append(bname)
            table = self.tables.setdefault(bname, {})
            vjp_table = self.vjp_tables.setdefault(bname, {})
            for op, layout, kernel in kernels:
                self._install(table, bname, op, layout, kernel, 0, "forward")
            for op, layout, kernel in vjps:
                self._install(vjp_table, bname, op, layout, kernel, 0, "vjp")
        for ov, op in staged_overrides:
            tables = self.vjp_tables if ov.kind == "vjp" else self.tables
            self._install(tables.setdefault(ov.backend, {}), ov.backend, op, ov.layout,
                          ov.kernel, ov.priority, ov.kind)

    def _install(self, table, backend, op, layout, kernel, priority, kind) -> None:
        op, layout = kernel_key(op, layout)
        key = (backend, op, layout, kind)
        if priority >= self._priorities.get(key, -1 << 30):
            table[(op, layout)] = kernel
            self._priorities[key] = priority

    def _refresh_events(self) -> None:
        # each listener is called through a guard: one that raises is disabled, never propagated
        for hook in EVENT_HOOKS:
            guarded = GuardedEvent(hook, getattr(self.pm.hook, hook).get_hookimpls(), self._event_emptied)
            self.events[hook] = guarded if guarded else None

    def _event_emptied(self, hook: str) -> None:
        """Every listener of ``hook`` was disabled: stop firing it (ops pay nothing again)."""
        self.events[hook] = None

    # -- queries ------------------------------------------------------------------------------
    def _check(self, entry: _Entry) -> None:
        if entry.available is not None:
            return
        if entry.backend is None:
            entry.available, entry.reason = False, entry.error
            return
        try:
            ok = bool(entry.backend.is_available())
            entry.reason = "" if ok else str(entry.backend.unavailable_reason())
            if ok:  # an available backend whose array methods break the contract would fail every op
                entry.error = entry.reason = contract_problem(entry.backend)
                ok = not entry.reason
        except BaseException as exc:  # noqa: BLE001 - a broken backend must not break us
            if isinstance(exc, KeyboardInterrupt):
                raise
            ok, entry.reason = False, f"is_available() raised {describe_exception(exc)}"
            entry.error = entry.reason
        entry.available = ok

    def infos(self) -> list[BackendInfo]:
        self.load()
        out = []
        for entry in list(self.entries.values()):
            if entry.deferred is not None:
                missing = _missing_requirements(entry.deferred)
                reason = f"needs {', '.join(missing)} (not installed)" if missing else ""
                out.append(BackendInfo(entry.name, not missing, reason, entry.origin,
                                       "unavailable" if missing else "ok", loaded=False))
                continue
            self._check(entry)
            status = "ok" if entry.available else ("failed" if entry.error else "unavailable")
            out.append(BackendInfo(entry.name, bool(entry.available), entry.reason, entry.origin, status))
        return out

    def default_name(self) -> str:
        """The registered backend with the highest ``Backend.default_priority`` (ties: by name)."""
        name = self._default
        if name is None:
            self.load()
            with self._lock:
                ranked = sorted((-e.backend.default_priority, e.name) for e in self.entries.values()
                                if e.backend is not None)
                if not ranked:
                    raise BackendUnavailableError("no polygrad backend is installed (entry-point group "
                                                  f"{ENTRY_POINT_GROUP!r}); pg.list_backends() shows why")
                name = self._default = ranked[0][1]
        return name

    def kernel(self, backend: str, op: "Op | str", layout: str = "dense", kind: str = "forward") -> Any:
        """The kernel dispatch runs for ``(op, layout)`` on ``backend`` (after plugin overrides), or
        None.  ``kind``: "forward", or "vjp" for a fused backward kernel."""
        if kind not in ("forward", "vjp"):
            raise ValueError(f"kind must be 'forward' or 'vjp', got {kind!r}")
        return self._table(backend, kind).get(kernel_key(Op(op), layout))

    def kernel_table(self, backend: str, kind: str = "forward") -> dict:
        """A copy of ``backend``'s kernel table: {(Op, layout): kernel} (sparse ops under "csr",
        which serves "coo" too)."""
        return dict(self._table(backend, kind))

    def _table(self, backend: str, kind: str) -> dict:
        if kind not in ("forward", "vjp"):
            raise ValueError(f"kind must be 'forward' or 'vjp', got {kind!r}")
        self.load()
        self.realize(backend)
        return (self.vjp_tables if kind == "vjp" else self.tables).get(backend, {})

    def get(self, name: str) -> Backend:
        self.load()
        if not isinstance(name, str):
            raise BackendUnavailableError(f"a backend is selected by its name (a str) or a polygrad.Backend, "
                                          f"got {type(name).__name__} {name!r:.60}")
        self.realize(name)
        entry = self.entries.get(name)
        if entry is None or entry.backend is None and not (entry.error or entry.reason):
            known = ", ".join(sorted(e.name for e in self.entries.values()
                                     if e.backend is not None or e.deferred is not None))
            raise BackendUnavailableError(f"unknown backend {name!r}; installed backends: {known}")
        self._check(entry)
        if not entry.available:
            hint = getattr(entry.backend, "install_hint", "") if entry.backend else ""
            raise BackendUnavailableError(f"backend {name!r} is not available: {entry.reason}"
                                          + (f" ({hint})" if hint else ""))
        return entry.backend  # type: ignore[return-value]


registry = Registry()

_current: ContextVar[str | None] = ContextVar("polygrad_backend", default=None)


def get_backend() -> str:
    """Name of the backend new tensors go to: use_backend/set_backend, else $POLYGRAD_BACKEND, else
    the installed backend with the highest ``Backend.default_priority`` (numpy's)."""
    return _current.get() or _env_backend() or registry.default_name()


_ENVIRON_TYPE = type(os.environ)
_ENV_KEY = os.environ.encodekey("POLYGRAD_BACKEND") if hasattr(os.environ, "encodekey") else None


def _env_backend() -> str | None:
    """``os.environ.get("POLYGRAD_BACKEND")``, read live (the user may set it at any time) but
    without encoding the name on every call: ~0.1 us where ``os.environ.get`` costs ~1 us, and
    ``pg.compile`` reads it on every call (its cache key).  Any other ``os.environ`` (replaced by
    a test, say) is asked as usual."""
    env = os.environ
    if type(env) is _ENVIRON_TYPE and _ENV_KEY is not None:
        raw = env._data.get(_ENV_KEY)  # type: ignore[attr-defined]
        return None if raw is None else env.decodevalue(raw)
    return env.get("POLYGRAD_BACKEND")


def get_kernel(backend: str, op: "Op | str", layout: str = "dense", kind: str = "forward") -> Any:
    """The kernel ``backend`` runs for ``op`` in ``layout`` (plugin overrides applied), or None.

    ``kind="vjp"`` asks for a fused backward kernel.  For inspection and tests; dispatch itself
    looks kernels up in tables built at load time."""
    return registry.kernel(backend, op, layout, kind)


def kernel_table(backend: str, kind: str = "forward") -> dict:
    """A copy of ``backend``'s kernel table ``{(Op, layout): kernel}`` (``kind``: forward / vjp)."""
    return registry.kernel_table(backend, kind)


def resolve(name: "str | Backend | None" = None) -> Backend:
    if isinstance(name, Backend):
        registry.load()
        entry = registry.entries.get(name.name)
        if entry is None or entry.backend is not name:
            raise BackendUnavailableError(
                f"backend object {name!r} is not registered; register its plugin first "
                "(an entry point in the group 'polygrad', or pg.register_plugin)")
        return name
    return registry.get(get_backend() if name is None or (isinstance(name, str) and not name) else name)


def owner_of(array: Any) -> Backend | None:
    """The available backend whose ``owns(array)`` is true (the selected one first), or None.

    Lets ``pg.tensor(x)`` keep a backend's native array on that backend.  A backend whose
    ``owns`` raises is treated as not owning it."""
    registry.load()
    current = registry.entries.get(get_backend())
    found = _owner_among(([current] if current else []) + list(registry.entries.values()), array)
    if found is not None or isinstance(array, _HOST_DATA):
        return found
    # a foreign array no loaded backend owns: its library is imported already, so loading deferred
    # plugins costs no library import -- the one named like the array's module first (jax, cupy)
    top = type(array).__module__.partition(".")[0]
    for name in sorted(registry.deferred_names(), key=lambda n: n != top):
        registry.realize(name)
        entry = registry.entries.get(name)
        found = _owner_among([entry] if entry else [], array)
        if found is not None:
            return found
    return None


#: data no deferred plugin can own (host arrays, Python numbers and sequences)
_HOST_DATA = (np.ndarray, np.generic, int, float, complex, list, tuple)


def _owner_among(entries: list, array: Any) -> Backend | None:
    for entry in entries:
        if entry.backend is None:
            continue
        registry._check(entry)
        try:
            if entry.available and entry.backend.owns(array):
                return entry.backend
        except Exception:  # noqa: BLE001 - a broken owns() must not break pg.tensor
            continue
    return None


def _origin(ep: Any) -> str:
    try:
        dist = getattr(ep, "dist", None)
        return dist.name if dist is not None else "<unknown>"
    except Exception:  # noqa: BLE001 - unreadable METADATA
        return "<unknown>"


_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _missing_requirements(ep: Any) -> list[str]:
    """The unconditional requirements of entry point ``ep``'s distribution that are not installed --
    read from metadata, importing nothing (how a deferred plugin's availability is listed)."""
    try:
        requires = ep.dist.requires or []
    except Exception:  # noqa: BLE001 - no or unreadable metadata: nothing to check
        return []
    missing = []
    for req in requires:
        match = _REQUIREMENT_NAME.match(req)
        if match is None or "extra" in req.partition(";")[2]:
            continue
        name = match.group(1)
        try:
            distribution(name)
        except PackageNotFoundError:
            module = name.replace("-", "_")
            if "." in module or importlib.util.find_spec(module) is None:
                missing.append(name)
    return missing


def set_backend(name: str) -> None:
    """Make ``name`` the default backend in the current context (thread / task)."""
    registry.get(name)
    _current.set(name)


@contextmanager
def use_backend(name: str) -> Iterator[Backend]:
    """``with pg.use_backend("scalar"):`` -- context-local backend selection."""
    backend = registry.get(name)
    token = _current.set(name)
    try:
        yield backend
    finally:
        _current.reset(token)


def list_backends() -> list[BackendInfo]:
    """One record per discovered backend (and per failed plugin): name, available, reason, origin."""
    return registry.infos()


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object at runtime (event-hook listeners, extra backends)."""
    registry.load()
    registry.register_plugin(plugin, name)


def unregister_plugin(plugin: Any) -> None:
    registry.unregister_plugin(plugin)
