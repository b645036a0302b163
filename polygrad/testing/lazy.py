"""The conformance kit's checks of a lazy backend's ``materialize`` and ``submit``.

A lazy backend (``lazy = True``, or its own ``materialize``/``submit``) promises that both return
one array per array given, in the order given, equal in value, and that the arrays ``submit``
returns can be read, or materialized, later with the same values.  Optimizers materialize their
parameters and state every step, and ``fit``'s pipelined loop holds what ``submit`` returned and
reads it an epoch later: a backend that reorders, drops or recomputes differently there trains to
other numbers with no error.  The per-op checks cannot see this (they read each kernel's result
once), so these build a few values through the backend's own kernels and push them through every
path:

``materialize``           one array per input, in order, each equal bit for bit to the input read
                          directly (the same kernels give the same bits) and to numpy's value
``materialize-empty``     an empty list gives an empty list
``materialize-repeated``  one array given twice, and arrays materialized already, keep their values
``submit``                one array per input, in order; each read directly and after a
                          ``materialize`` equals the input, bit for bit

What they cannot do is make a task of your backend fail: test yourself that a failure of submitted
work surfaces at the ``materialize`` that waits for it, as a :class:`~polygrad.errors.BackendError`
naming the cause.  ``polygrad check NAME`` runs these on full runs of a lazy backend;
:func:`check_lazy_contract` returns their failures.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..runtime.backend import Backend, overrides, supports_dtype
from ..runtime.registry import registry

#: the contract's checks, in the order they run
LAZY_CHECKS = ("materialize", "materialize-empty", "materialize-repeated", "submit")


def is_lazy(backend: str) -> bool:
    """Whether ``backend`` defers work: ``lazy = True``, or a ``materialize``/``submit`` of its own."""
    be = registry.get(backend)
    return bool(be.lazy) or overrides(be, "materialize") or overrides(be, "submit")


def _host(be: Backend) -> np.ndarray:
    """The checks' input: float64 where the backend holds it, else float32 (a float32-only backend)."""
    dtype = np.float64 if supports_dtype(be, np.dtype(np.float64)) else np.float32
    return np.linspace(-2.0, 2.0, 12, dtype=dtype).reshape(4, 3)


def _values(backend: str) -> list[tuple[str, Any, np.ndarray]]:
    """(what, the backend's array, numpy's value): a leaf, an elementwise result, a reduction --
    each made by the backend's own kernels (dispatch), so a lazy backend hands back work to do."""
    import polygrad as pg

    host = _host(registry.get(backend))
    x = pg.tensor(host, backend=backend)
    y = x * 2.0 + 1.0
    s = (x * x).sum(axis=1)
    return [("a leaf", x.array, host), ("x * 2 + 1", y.array, host * 2.0 + 1.0),
            ("(x * x).sum(axis=1)", s.array, (host * host).sum(axis=1))]


def _read(be: Backend, array: Any) -> np.ndarray:
    return np.asarray(be.to_numpy(array))


def _same(be: Backend, what: str, got: Any, want: np.ndarray, path: str) -> None:
    """Raise AssertionError unless ``got`` reads as ``want`` bit for bit (shape, dtype, values)."""
    value = _read(be, got)
    if value.shape != want.shape or value.dtype != want.dtype:
        raise AssertionError(f"{path} of {what}: shape {value.shape} dtype {value.dtype}, where the input reads as "
                             f"shape {want.shape} dtype {want.dtype}")
    if not np.array_equal(value, want, equal_nan=True):
        raise AssertionError(f"{path} of {what}: values differ from the input read directly (max difference "
                             f"{float(np.max(np.abs(value - want))):.3g}); the same kernels must give the same bits")


def _count(path: str, given: int, got: Any) -> list:
    if not isinstance(got, (list, tuple)) or len(got) != given:
        size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
        raise AssertionError(f"{path} of {given} arrays returned {size}: one array per input, in order")
    return list(got)


def _check_materialize(backend: str, be: Backend) -> None:
    values = _values(backend)
    direct = [_read(be, a) for _, a, _ in values]
    for (what, _, expected), value in zip(values, direct):
        tol = 1e-12 if expected.dtype == np.float64 else 1e-5
        if not np.allclose(value, expected, rtol=tol, atol=tol):
            raise AssertionError(f"{what} reads as {value!r}, numpy gives {expected!r}")
    out = _count("materialize", len(values), be.materialize([a for _, a, _ in values]))
    for (what, _, _), want, got in zip(values, direct, out):
        _same(be, what, got, want, "materialize")


def _check_empty(backend: str, be: Backend) -> None:
    _count("materialize", 0, be.materialize([]))
    _count("submit", 0, be.submit([]))


def _check_repeated(backend: str, be: Backend) -> None:
    (what, y, _) = _values(backend)[1]
    want = _read(be, y)
    first, second = _count("materialize", 2, be.materialize([y, y]))
    _same(be, what, first, want, "materialize (given twice, first)")
    _same(be, what, second, want, "materialize (given twice, second)")
    [again] = _count("materialize", 1, be.materialize([first]))
    _same(be, what, again, want, "materialize of a materialized array")


def _check_submit(backend: str, be: Backend) -> None:
    values = _values(backend)
    direct = [_read(be, a) for _, a, _ in values]
    submitted = _count("submit", len(values), be.submit([a for _, a, _ in values]))
    for (what, _, _), want, got in zip(values, direct, submitted):
        _same(be, what, got, want, "submit, read directly")
    done = _count("materialize", len(values), be.materialize(submitted))
    for (what, _, _), want, got in zip(values, direct, done):
        _same(be, what, got, want, "materialize of submit's result")


_CHECKS: dict[str, Callable[[str, Backend], None]] = {
    "materialize": _check_materialize, "materialize-empty": _check_empty, "materialize-repeated": _check_repeated,
    "submit": _check_submit,
}


def check_lazy_contract(backend: str) -> list[str]:
    """Messages for every check of :data:`LAZY_CHECKS` that ``backend`` fails (empty: all hold, or
    the backend is eager and the defaults hold by construction)."""
    if not is_lazy(backend):
        return []
    be = registry.get(backend)
    failures = []
    for name in LAZY_CHECKS:
        try:
            _CHECKS[name](backend, be)
        except AssertionError as exc:
            failures.append(f"lazy contract {name!r} on backend {backend!r}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a backend that raises fails the check, by name
            failures.append(f"lazy contract {name!r} on backend {backend!r} raised {type(exc).__name__}: {exc}")
    return failures
