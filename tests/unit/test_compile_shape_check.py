"""The replay's shape check of a buffer (``_shape_check_source``): for backends whose arrays are
numpy's it reads ``.shape`` first and asks the backend's ``shape()`` only on a difference (a call
per buffer cost ~6 us of the moons step).  Against the slow form (``be.shape(b) != recorded``),
for the numpy backend and for a backend whose ``shape()`` is not ``.shape``."""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.compile.program import _shape_check_source, _ShapeMismatch
from polygrad.runtime.registry import resolve


class _Logical:
    """A backend over numpy arrays whose logical shape is not the array's (a padded layout)."""

    def owns(self, array: Any) -> bool:
        return isinstance(array, np.ndarray)

    def shape(self, array: Any) -> tuple:
        return tuple(array.shape[:-1]) + (array.shape[-1] - 1,) if array.ndim else ()


def _raises(be: Any, array: Any, recorded: tuple) -> bool:
    env: dict[str, Any] = {"Mismatch": _ShapeMismatch}

    def const(value: Any) -> str:
        name = f"C{len(env)}"
        env[name] = value
        return name

    src = _shape_check_source("b", be, recorded, const)
    try:
        exec(src, env, {"b": array})
    except _ShapeMismatch:
        return True
    return False


shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)


@settings(max_examples=200, deadline=None)
@given(actual=shapes, recorded=shapes, which=st.sampled_from(["numpy", "logical"]))
def test_the_shape_check_agrees_with_the_backends_shape(actual: tuple, recorded: tuple, which: str) -> None:
    be = resolve("numpy") if which == "numpy" else _Logical()
    array = np.zeros(actual)
    assert _raises(be, array, recorded) == (be.shape(array) != recorded)


def test_the_numpy_backend_is_checked_through_the_attribute() -> None:
    src = _shape_check_source("b", resolve("numpy"), (2, 3), lambda v: "C")
    assert src.startswith("if b.shape != C and ")
