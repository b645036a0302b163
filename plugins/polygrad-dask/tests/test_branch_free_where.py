"""The dask backend's WHERE kernel (``dense_kernels.where``: ``where_block`` on each block) against
``np.where`` per block and ``da.where`` on chunked arrays, bit for bit: NaNs with payloads and
signs, -0.0, infinities, integers, broadcast operands, blocks above and below the branch-free
threshold, non-contiguous operands (no cluster: pure functions and the synchronous scheduler)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("dask.array")

try:
    import polygrad_dask  # noqa: F401,E402
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dask.array as da  # noqa: E402

from polygrad_dask import dense_kernels  # noqa: E402

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint32, np.float16]
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0]


def _bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _values(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x = np.asarray(rng.standard_normal(shape) * 1e3)
    hit = rng.random(shape) < 0.2
    x[hit] = rng.choice(SPECIALS, int(hit.sum()))
    x = x.astype(dtype)
    if x.size and np.dtype(dtype).itemsize in (4, 8):  # a NaN with a payload and its sign bit
        x.view(f"u{x.dtype.itemsize}").flat[0] = 0xFFC01234 if x.dtype.itemsize == 4 else 0xFFF8000000001234
    return x


@st.composite
def operands(draw):
    """(cond, a, b): ``b`` full-shape, ``a`` a 0-d zero (ReLU's backward), a 0-d value or full,
    the condition full or broadcast along rows; sizes on both sides of the thresholds."""
    rows = draw(st.sampled_from([1, 7, 300, 2100]))
    cols = draw(st.sampled_from([1, 8, 33]))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shape = (rows, cols)
    b = _values(rng, shape, dtype)
    kind = draw(st.sampled_from(["zero", "scalar", "full"]))
    a = (np.zeros((), dtype) if kind == "zero" else _values(rng, (), dtype) if kind == "scalar"
         else _values(rng, shape, dtype))
    cond_shape = draw(st.sampled_from([shape, (1, cols), (rows, 1)]))
    cond = rng.random(cond_shape) < draw(st.sampled_from([0.0, 0.5, 1.0]))
    if draw(st.booleans()):  # a non-bool condition: np.where's own path
        cond = cond.astype(np.int8)
    if draw(st.booleans()):  # a transposed (F-ordered) b: np.where keeps its layout
        b = np.asfortranarray(b)
    return cond, a, b


@settings(max_examples=150, deadline=None)
@given(ops=operands())
def test_where_block_is_np_where_bit_for_bit(ops):
    cond, a, b = ops
    got, want = dense_kernels.where_block(cond, a, b), np.where(cond, a, b)
    _bits(got, want)
    assert got.flags.c_contiguous == want.flags.c_contiguous


def test_relu_backward_block_takes_the_branch_free_path():
    """The case it is for: ``where(out <= 0, 0, g)`` on a large float32 block is computed on the
    bits (a fresh int view, not np.where's output), with np.where's bits."""
    rng = np.random.default_rng(0)
    g = _values(rng, (4096, 16), np.float32)
    cond = rng.random((4096, 16)) < 0.5
    got = dense_kernels.where_block(cond, np.zeros((), np.float32), g)
    assert got.base is not None and got.base.dtype == np.int32  # the bit path's view
    _bits(got, np.where(cond, np.float32(0), g))


@settings(max_examples=40, deadline=None)
@given(ops=operands(), blocks=st.integers(1, 4))
def test_dask_where_kernel_is_da_where(ops, blocks):
    """Same chunks, dtype and bits as ``da.where`` on row-chunked operands."""
    cond, a, b = ops
    rows = b.shape[0]
    step = max(1, -(-rows // blocks))

    def chunked(v: np.ndarray) -> da.Array:
        return da.from_array(v, chunks=(step if v.ndim and v.shape[0] == rows else -1,) + (-1,) * (v.ndim - 1)
                             if v.ndim else ())

    dc, dA, dB = chunked(cond), chunked(a), chunked(b)
    got, want = dense_kernels.where(dc, dA, dB), da.where(dc, dA, dB)
    assert got.chunks == want.chunks and got.dtype == want.dtype
    _bits(got.compute(scheduler="sync"), want.compute(scheduler="sync"))
