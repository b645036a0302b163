"""The per-call fast paths of pg.compile's guards and cache key, each against the slow path it
replaces: the bytes-first array comparison (``guards._same_array``), the environment read of
``get_backend`` and the cache key's empty fallback chain."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import polygrad as pg
from polygrad.compile import guards
from polygrad.runtime import registry


def _reference(now: np.ndarray, seen: np.ndarray) -> bool:
    """What ``_same_array`` computed before its bytes-first path."""
    return (now.shape == seen.shape and now.dtype == seen.dtype
            and bool(np.array_equal(now, seen, equal_nan=seen.dtype.kind in "fc")))


_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-310, -1.5]
_DTYPES = ["float64", "float32", "float16", "complex128", "int64", "int8", "uint16", "bool", ">f8", ">i4"]


def _nan_payload(dtype: np.dtype, payload: int) -> np.ndarray:
    """A NaN with another payload (and sign) than ``np.nan``'s, of a float dtype."""
    bits = {2: np.uint16(0x7C00 | (payload & 0x3FF) or 1),
            4: np.uint32(0x7F800000 | ((payload & 0x7FFFFF) or 1)),
            8: np.uint64(0x7FF0000000000000 | ((payload & 0xFFFFFFFFFFFFF) or 1))}[dtype.itemsize]
    value = np.array([bits]).view(dtype.newbyteorder("=")).astype(dtype)
    return -value if payload & 1 else value


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=5))
    if dtype.kind in "fc":
        elements = st.sampled_from(_SPECIALS) | st.floats(allow_nan=True, allow_infinity=True, width=64)
        with np.errstate(over="ignore", invalid="ignore"):  # huge doubles cast to float16/32: inf
            seen = draw(hnp.arrays(np.float64, shape, elements=elements)).astype(dtype)
    else:
        seen = draw(hnp.arrays(dtype, shape))
    now = seen.copy()
    edit = draw(st.sampled_from(["same", "value", "negzero", "payload", "shape", "dtype", "fortran", "strided"]))
    if edit == "value" and now.size:
        i = draw(st.integers(0, now.size - 1))
        flat = now.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            flat[i] = flat[i] + 1 if dtype.kind in "fc" else (not flat[i] if dtype.kind == "b" else flat[i] ^ 1)
    elif edit == "negzero" and now.size and dtype.kind == "f":
        now.reshape(-1)[now.reshape(-1) == 0] *= -1  # -0.0 for 0.0: equal values, other bits
    elif edit == "payload" and now.size and dtype.kind == "f":
        i = draw(st.integers(0, now.size - 1))
        now.reshape(-1)[i] = _nan_payload(dtype, draw(st.integers(0, 2**52)))[0]
        if draw(st.booleans()):
            seen = seen.copy()
            seen.reshape(-1)[i] = np.nan
    elif edit == "shape":
        now = now.reshape(-1)
    elif edit == "dtype":
        now = np.zeros(now.shape, "float32" if dtype != np.float32 else "float64")
    elif edit == "fortran":
        now = np.asfortranarray(now)
    elif edit == "strided" and now.ndim:
        now = np.repeat(now, 2, axis=-1)[..., ::2]  # a non-contiguous view of the same values
    if draw(st.booleans()):  # the other side Fortran-ordered too
        seen = np.asfortranarray(seen)
    return now, seen


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pairs())
def test_same_array_agrees_with_array_equal(pair: tuple[np.ndarray, np.ndarray]) -> None:
    now, seen = pair
    assert guards._same_array(now, seen) is _reference(now, seen)


def test_same_array_special_cases() -> None:
    a = np.array([0.0, np.nan, 1.0])
    assert guards._same_array(a, a.copy())
    b = a.copy()
    b[0] = -0.0  # other bits, equal values: numpy's answer
    assert guards._same_array(b, a)
    c = a.copy()
    c[1] = -np.nan  # another NaN: equal under equal_nan
    assert guards._same_array(c, a)
    assert not guards._same_array(a.astype(np.float32), a)
    big = np.arange(guards._BYTES_FIRST // 8 + 10, dtype=np.int64)  # past the bytes-first size
    edited = big.copy()
    assert guards._same_array(edited, big)
    edited[-1] = -1
    assert not guards._same_array(edited, big)
    masked = np.ma.masked_array([1, 2, 3], mask=[False, True, False])
    other = masked.copy()
    other.data[1] = 7  # under the mask: the filled bytes agree, the data does not
    assert guards._same_array(other, masked) is _reference(other, masked)
    objects = np.array([1, "a"], dtype=object)
    assert guards._same_array(objects.copy(), objects)


def test_compiled_step_sees_an_in_place_edit_of_a_closure_array() -> None:
    """The guard the bytes-first path serves: an index array edited in place after capture."""
    rows = np.array([0, 2], dtype=np.int64)
    w = pg.tensor(np.arange(8.0).reshape(4, 2), requires_grad=True)

    @pg.compile(pure=True)
    def step():
        return w[rows].sum()

    eager = [float(w.detach().numpy()[rows].sum())]
    for _ in range(4):
        assert float(step().item()) == eager[0]
    rows[1] = 3
    assert float(step().item()) == float(w.detach().numpy()[rows].sum())


@pytest.mark.parametrize("value", [None, "", "numpy", "scalar"])
def test_env_backend_reads_the_environment_live(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("POLYGRAD_BACKEND", raising=False)
    else:
        monkeypatch.setenv("POLYGRAD_BACKEND", value)
    assert registry._env_backend() == os.environ.get("POLYGRAD_BACKEND")


def test_env_backend_with_a_replaced_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", {"POLYGRAD_BACKEND": "scalar"})
    assert registry._env_backend() == "scalar"


def test_compile_key_follows_the_fallback_chain() -> None:
    """The key's fallback chain: an empty dict takes the shortcut, an in-place edit still counts."""
    compiled = pg.compile(lambda: None, pure=True)
    saved = pg.config.fallback_chain
    try:
        pg.config.fallback_chain = {}
        _, empty = compiled._key((), {})
        assert "{}" in empty[-1]
        pg.config.fallback_chain["numpy"] = ["scalar"]
        _, edited = compiled._key((), {})
        assert edited != empty and repr(pg.config.fallback_chain) in edited[-1]
        pg.config.fallback_chain = []  # type: ignore[assignment]  # not a dict: its repr, as before
        _, listed = compiled._key((), {})
        assert "[]" in listed[-1] and listed != empty
    finally:
        pg.config.fallback_chain = saved
