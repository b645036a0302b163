"""The dask backend's SUM and MAX over axes that no block splits (``dense_kernels``: one task per
block) against ``da.sum`` / ``da.max`` (a chunk task and an aggregate task per block), bit for
bit: same chunks, dtype and values for NaNs with payloads, -0.0, infinities, float32/float64,
1-3 dimensions, several row blocks, keepdims either way; split axes still take dask's own tree
(no cluster: the synchronous scheduler)."""
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

SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38]


@st.composite
def reductions(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = np.asarray(rng.standard_normal(shape) * draw(st.sampled_from([1.0, 1e30])))
    hit = rng.random(shape) < 0.2
    x[hit] = rng.choice(SPECIALS, int(hit.sum()))
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    x.view(f"u{x.dtype.itemsize}").flat[0] = 0xFFC01234 if dtype == np.float32 else 0xFFF8000000001234
    if draw(st.booleans()) and ndim > 1:
        x = np.asfortranarray(x)
    rows = draw(st.integers(1, shape[0]))  # row blocks of this many rows (the last one shorter)
    split_other = ndim > 1 and draw(st.booleans()) and shape[-1] > 1  # the last axis in two blocks
    chunks = (rows,) + tuple(-1 for _ in shape[1:-1]) + (((shape[-1] + 1) // 2 if split_other else -1),) * (ndim > 1)
    axes = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1))))
    return da.from_array(x, chunks=chunks), axes, draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(case=reductions(), op=st.sampled_from(["sum", "max"]))
def test_reductions_are_dasks_bit_for_bit(case, op):
    x, axes, keepdims = case
    kernel = dense_kernels.reduce_sum if op == "sum" else dense_kernels.reduce_max
    got, want = kernel(x, axes=axes, keepdims=keepdims), getattr(x, op)(axis=axes, keepdims=keepdims)
    assert got.chunks == want.chunks and got.dtype == want.dtype
    with np.errstate(all="ignore"):  # inf - inf and overflow, on purpose
        a, b = got.compute(scheduler="sync"), want.compute(scheduler="sync")
    assert a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def test_a_row_reduction_is_one_task_per_row_block():
    x = da.from_array(np.ones((12, 5), dtype=np.float32), chunks=(4, 5))
    for kernel in (dense_kernels.reduce_sum, dense_kernels.reduce_max):
        out = kernel(x, axes=(1,), keepdims=True)
        assert len(out.__dask_graph__()) - len(x.__dask_graph__()) == 3
    # rows are split: dask's own chunk + aggregate tree
    assert len(dense_kernels.reduce_sum(x, axes=(0,), keepdims=False).__dask_graph__()) > 3 + 3
