"""``expand`` chunks broadcast axes by rows, as every array of that shape: bitwise numpy's
broadcast on generated inputs, and a bias expanded to N rows adds to a row-blocked array without a
rechunk (no cluster needed)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

try:
    import polygrad_dask  # noqa: E402, F401
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dask.array as da  # noqa: E402

from polygrad_dask import chunks, dense_kernels  # noqa: E402


@pytest.fixture(autouse=True)
def two_small_blocks():
    """2 row blocks, small blocks allowed (restored afterwards)."""
    saved = chunks.partitions, chunks.min_block_rows
    chunks.set_partitions(2)
    chunks.min_block_rows = 1
    yield
    chunks.set_partitions(saved[0])
    chunks.min_block_rows = saved[1]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_expand_is_numpys_broadcast_chunked_by_rows(data):
    out_shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    # an input broadcastable to out_shape: a suffix of its axes, each kept or set to 1
    rank = data.draw(st.integers(0, len(out_shape)))
    in_shape = tuple(n if data.draw(st.booleans()) else 1 for n in out_shape[len(out_shape) - rank:])
    host = np.random.default_rng(0).normal(size=in_shape)
    x = da.from_array(host, chunks=chunks.chunks_for(in_shape))
    got = dense_kernels.expand(x, shape=out_shape)
    assert got.chunks[0] == chunks.row_chunks(out_shape[0]) or (rank == len(out_shape) and in_shape[0] == out_shape[0]
                                                                 and got.chunks[0] == x.chunks[0])
    assert got.compute(scheduler="sync").tobytes() == np.ascontiguousarray(np.broadcast_to(host, out_shape)).tobytes()


def test_a_bias_expanded_to_rows_adds_without_rechunking():
    """A bias broadcast to N rows used to be one N-row block, split again by every op with a
    row-blocked array (a rechunk on one worker, half of it sent to the other)."""
    n, h = 10, 3
    x = da.ones((n, h), chunks=chunks.chunks_for((n, h)))
    b = dense_kernels.expand(da.from_array(np.arange(float(h)).reshape(1, h), chunks=((1,), (h,))), shape=(n, h))
    assert b.chunks == x.chunks
    assert not [k for k in dict((x + b).__dask_graph__()) if "rechunk" in str(k)]
