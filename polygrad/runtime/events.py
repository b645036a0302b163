"""Event hooks, isolated: a plugin's listener that raises is reported once, disabled, and ignored.

Event hooks (``polygrad_op_executed``, ``polygrad_layout_chosen``, ``polygrad_fallback``,
``polygrad_backward_finished``) run inside every op or backward of every program that has the
plugin installed.  pluggy would propagate a listener's exception into the op -- one buggy
monitor would break every computation on the machine.  :class:`GuardedEvent` calls each
implementation itself instead: the first exception of an implementation disables it (for the
rest of the process), is recorded in :data:`hook_failures` (``pg.stats()["hook_failures"]``,
``polygrad backends``) and warned about once with :class:`~polygrad.errors.PluginWarning`; the
op's result is unaffected.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

import pluggy

from ..ir.errors import PluginWarning

__all__ = ["GuardedEvent", "hook_failures"]

#: "plugin/hook" -> "ExcType: message" for every listener disabled since start
hook_failures: dict[str, str] = {}
#: the listener functions disabled so far: re-registering their plugin does not revive them
_disabled: set = set()
_lock = threading.Lock()


class GuardedEvent:
    """A caller for one event hook over the given pluggy hook implementations.

    Implementations disabled earlier are left out.  Calls them in pluggy's order (last
    registered first) with the arguments each declares; wrappers (``wrapper=True`` or the old
    ``hookwrapper=True``) run their part before the yield first and their part after it last,
    as pluggy would (an event hook has no result: they receive None / an empty Result).
    ``on_empty`` runs when the last implementation was disabled (the registry then stops
    firing the event at all)."""

    __slots__ = ("_impls", "_wrappers", "_plain", "_on_empty", "hook")

    def __init__(self, hook: str, impls: list, on_empty: Callable[[str], None]):
        self.hook = hook
        kinds = {id(impl): "new" if getattr(impl, "wrapper", False) else
                 "old" if getattr(impl, "hookwrapper", False) else "" for impl in impls}
        self._set([(impl.plugin_name, impl.function, tuple(impl.argnames), kinds[id(impl)])
                   for impl in reversed(impls) if (impl.function, hook) not in _disabled])
        self._on_empty = on_empty

    def _set(self, impls: list) -> None:
        # split once here, not on every event: wrappers open first and close last
        self._impls = impls
        self._wrappers = [e for e in impls if e[3]]
        self._plain = [e for e in impls if not e[3]]

    def __bool__(self) -> bool:
        return bool(self._impls)

    def __call__(self, **kwargs: Any) -> None:
        opened = []
        for entry in self._wrappers:  # wrappers: up to their yield
            try:
                gen = entry[1](*[kwargs[a] for a in entry[2]])
                next(gen)
                opened.append((entry, gen))
            except Exception as exc:  # noqa: BLE001 - a listener must never break the computation
                self._disable(entry, exc)
        for entry in self._plain:
            try:
                entry[1](*[kwargs[a] for a in entry[2]])
            except Exception as exc:  # noqa: BLE001 - a listener must never break the computation
                self._disable(entry, exc)
        for entry, gen in reversed(opened):  # wrappers: after their yield
            try:
                gen.send(None if entry[3] == "new" else pluggy.Result(None, None))
            except StopIteration:
                pass
            except Exception as exc:  # noqa: BLE001 - a listener must never break the computation
                self._disable(entry, exc)

    def _disable(self, entry: tuple, exc: Exception) -> None:
        name = entry[0]
        with _lock:
            if entry not in self._impls:  # another thread disabled it first
                return
            # copy-on-write: a concurrent __call__ keeps iterating its own lists
            self._set([e for e in self._impls if e is not entry])
            hook_failures[f"{name}/{self.hook}"] = f"{type(exc).__name__}: {exc}"
            _disabled.add((entry[1], self.hook))
            empty = not self._impls
        warnings.warn(f"plugin {name!r} raised in event hook {self.hook} ({type(exc).__name__}: {exc}); "
                      "the hook is disabled for this process and the computation continues "
                      "(see pg.stats()['hook_failures'])", PluginWarning, stacklevel=4)
        if empty:
            self._on_empty(self.hook)
