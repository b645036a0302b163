"""Row-wise sums and maxima on the dask backend run as one task per row block
(``dense_kernels._within_blocks``) where dask's reduction made two (the block's reduction, then an
aggregate of the one partial): the same bits as dask's own reduction -- NaN payloads and signs,
-0.0, infinities, float32, integers and booleans -- and the same chunks; a reduction over the
row axis (split into blocks) is still dask's."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")

try:
    import polygrad_dask  # noqa: F401
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from polygrad_dask import dense_kernels  # noqa: E402

SPECIAL = {np.dtype(np.float32): np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3e38], np.float32),
           np.dtype(np.float64): np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, 1e308])}


@st.composite
def blocked_arrays(draw):
    dtype = np.dtype(draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_])))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if dtype.kind == "f":
        ints = np.dtype(f"u{dtype.itemsize}")
        x = rng.integers(0, np.iinfo(ints).max, size=size, dtype=ints, endpoint=True).view(dtype)  # NaN payloads too
        special = SPECIAL[dtype]
        mix = rng.random(size) < 0.5
        x = np.where(mix, rng.normal(size=size).astype(dtype), x)
        pick = rng.random(size) < 0.3
        x[pick] = special[rng.integers(0, special.size, int(pick.sum()))]
    elif dtype.kind == "b":
        x = rng.random(size) < 0.5
    else:
        x = rng.integers(-1000, 1000, size=size).astype(dtype)
    x = x.reshape(shape)
    rows = shape[0]
    cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=3)))
    bounds = [0, *cuts, rows]
    row_chunks = tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a) or (rows,)
    axes = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1))))
    if draw(st.booleans()):
        axes = tuple(a - ndim for a in axes)  # negative axes, as a caller may pass them
    return x, row_chunks, axes, draw(st.booleans())


def _bits(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    return a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()


@settings(max_examples=300, deadline=None)
@given(blocked_arrays())
def test_row_reductions_equal_dasks_own_bit_for_bit(case):
    x, row_chunks, axes, keepdims = case
    xd = da.from_array(x, chunks=(row_chunks,) + tuple((n,) for n in x.shape[1:]))
    for ours, theirs in ((dense_kernels.reduce_sum, xd.sum), (dense_kernels.reduce_max, xd.max)):
        if ours is dense_kernels.reduce_max and 0 in x.shape:
            continue  # a maximum over nothing raises in numpy, either way
        got = ours(xd, axes=axes, keepdims=keepdims)
        want = theirs(axis=axes, keepdims=keepdims)
        assert got.shape == want.shape and got.dtype == want.dtype and got.chunks == want.chunks
        with np.errstate(all="ignore"):  # NaN and inf inputs warn in both
            g, w = got.compute(scheduler="sync"), want.compute(scheduler="sync")
        assert _bits(np.asarray(g)) == _bits(np.asarray(w)), (ours.__name__, x.dtype, axes, keepdims)


def test_a_row_wise_reduction_is_one_task_per_block():
    """[6, 4] in 3 row blocks: a row sum or max is 3 tasks on top of the array's own, where dask
    made 6; over the rows (split) it is dask's tree."""
    xd = da.from_array(np.arange(24.0).reshape(6, 4), chunks=((2, 2, 2), (4,)))
    base = len(xd.__dask_graph__())
    for fn in (dense_kernels.reduce_sum, dense_kernels.reduce_max):
        for keepdims in (False, True):
            assert len(fn(xd, axes=(1,), keepdims=keepdims).__dask_graph__()) - base == 3
        plain = np.sum if fn is dense_kernels.reduce_sum else np.max
        np.testing.assert_array_equal(fn(xd, axes=(0,), keepdims=False).compute(scheduler="sync"),
                                      plain(np.arange(24.0).reshape(6, 4), axis=0))
