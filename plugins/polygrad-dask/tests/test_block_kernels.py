"""The per-block sparse kernels' direct sparsetools paths against the scipy products they replace,
bit for bit (no cluster: pure functions on one row block).

The forward product of a row block adds tile after tile into one output with ``csr_matvecs``: each
row's sum runs over its columns in increasing order, so it is exactly the serial CSR product of the
whole rows (what the numpy backend computes).  (The cluster's SpMM runs the own tile first while the
halo travels, so there only row block 0 keeps those bits.)  A halo partial is added at its ids
through a unit-valued sparse product: one exact addition per row, the bits of ``out[ids] += part``
(where both operands are NaN, whichever NaN's sign and payload).  A chunk of the wrong shape is a
ShapeError, never a read past an array's end.
"""
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

import scipy.sparse as sp  # noqa: E402
from scipy.sparse import _sparsetools  # noqa: E402

from polygrad_dask import sparse_kernels  # noqa: E402
from polygrad_dask.partition import build_block  # noqa: E402

SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45]


def _bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), (a, b)


@st.composite
def blocked(draw):
    """A random n x m float matrix in canonical CSR, column bounds, the own block (square), and an
    operand; float32 or float64."""
    n, m = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    density = draw(st.sampled_from([0.1, 0.4, 1.0]))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    a = sp.random(n, m, density=density, format="csr", random_state=seed, dtype=np.float64)
    a.data = np.random.default_rng(seed).normal(size=a.nnz) * 1e3
    a = a.astype(dtype)
    a.sort_indices()
    cuts = sorted(draw(st.lists(st.integers(1, max(m - 1, 1)), max_size=3, unique=True))) if m > 1 else []
    col_bounds = tuple([0] + [c for c in cuts if 0 < c < m] + [m])
    own = draw(st.integers(0, len(col_bounds) - 2)) if n == m and draw(st.booleans()) else None
    f = draw(st.integers(1, 4))
    x = (np.random.default_rng(seed + 1).normal(size=(m, f)) * 1e3).astype(dtype)
    return a, col_bounds, own, x


@settings(max_examples=150, deadline=None)
@given(blocked())
def test_block_spmm_is_the_serial_csr_product_bit_for_bit(case):
    a, col_bounds, own, x = case
    block = build_block(a.indptr, a.indices, col_bounds, 0, own)
    parts = [x[lo:hi] if need is None else sparse_kernels._take(x[lo:hi], need)
             for (lo, hi), need in zip(zip(col_bounds[:-1], col_bounds[1:]), block.need)]
    want = np.zeros((a.shape[0], x.shape[1]), dtype=x.dtype)
    _sparsetools.csr_matvecs(a.shape[0], a.shape[1], x.shape[1], a.indptr, a.indices, a.data, x.reshape(-1),
                             want.reshape(-1))
    _bits(sparse_kernels._spmm_block(block, a.data, *parts), want)


@settings(max_examples=150, deadline=None)
@given(blocked())
def test_transposed_tiles_match_scipys_transposed_product(case):
    """The halo partials and the own tile computed into the result give ``A.T @ G`` of the row
    block (close: tile sums start from zero, scipy's run over the whole column)."""
    a, col_bounds, own, x = case
    g = np.random.default_rng(7).normal(size=(a.shape[0], x.shape[1])).astype(a.dtype)
    block = build_block(a.indptr, a.indices, col_bounds, 0, own)
    want = np.asarray(a.T @ g)
    for j, (lo, hi) in enumerate(zip(col_bounds[:-1], col_bounds[1:])):
        if j == own:
            got = sparse_kernels._assemble((hi - lo, g.shape[1]), a.dtype, ((sparse_kernels.OWN, j),),
                                           block, a.data, g)
        else:
            got = sparse_kernels._assemble((hi - lo, g.shape[1]), a.dtype, (block.need[j],),
                                           sparse_kernels._spmm_t_part(block, a.data, g, j))
        np.testing.assert_allclose(got, want[lo:hi], rtol=1e-4, atol=1e-3 * max(1.0, float(np.abs(want).max())))


@st.composite
def scatters(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.complex128, np.float16]))
    rows, f = draw(st.integers(1, 12)), draw(st.integers(1, 3))
    k = draw(st.integers(0, rows))
    ids = np.sort(np.random.default_rng(draw(st.integers(0, 999))).choice(rows, k, replace=False))
    ids = ids.astype(draw(st.sampled_from([np.int32, np.int64])))
    pool = SPECIALS if np.dtype(dtype).kind in "fc" else [0, -1, 2**40]
    out = np.array(draw(st.lists(st.sampled_from(pool) | st.floats(-10, 10, width=16), min_size=rows * f,
                                 max_size=rows * f)), dtype=np.float64)
    part = np.array(draw(st.lists(st.sampled_from(pool) | st.floats(-10, 10, width=16), min_size=k * f,
                                  max_size=k * f)), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return out.reshape(rows, f).astype(dtype), ids, part.reshape(k, f).astype(dtype)


@settings(max_examples=200, deadline=None)
@given(scatters())
def test_add_at_is_fancy_add_bit_for_bit(case):
    """Signed zeros, infinities, NaN, extremes: the unit product adds exactly what ``+=`` adds
    (complex and float16 take numpy's own path: a unit complex times inf is not exact)."""
    out, ids, part = case
    want = out.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        want[ids] += part
        got = out.copy()
        sparse_kernels._add_at(got, ids, part)
    _bits(got, want)


@settings(max_examples=150, deadline=None)
@given(blocked())
def test_own_tile_first_then_the_halo_tiles_onto_it(case):
    """The split forward (own tile from zero, then the fetched tiles added onto it, in place: it
    is this worker's own array) gives the row block's product; with the own block first in
    column order it is still the serial CSR product bit for bit."""
    a, col_bounds, own, x = case
    if own is None:
        own = 0
    block = build_block(a.indptr, a.indices, col_bounds, 0, own)
    parts = [x[lo:hi] if need is None else sparse_kernels._take(x[lo:hi], need)
             for (lo, hi), need in zip(zip(col_bounds[:-1], col_bounds[1:]), block.need)]
    first = sparse_kernels._spmm_tiles(block, a.data, (own,), None, parts[own])
    rest = tuple(j for j in range(len(parts)) if j != own)
    got = sparse_kernels._spmm_tiles(block, a.data, rest, first, *(parts[j] for j in rest)) if rest else first
    assert got is first
    want = np.zeros((a.shape[0], x.shape[1]), dtype=x.dtype)
    _sparsetools.csr_matvecs(a.shape[0], a.shape[1], x.shape[1], a.indptr, a.indices, a.data, x.reshape(-1),
                             want.reshape(-1))
    if own == 0:
        _bits(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * max(1.0, float(np.abs(want).max())))


@settings(max_examples=100, deadline=None)
@given(scatters(), st.booleans())
def test_partials_add_onto_the_own_term(case, whole):
    """``_add_partials``: the own term plus a partial at its ids (or whole), numpy's bits, in place
    for a term this worker made, into a copy of a read-only one (received), left as it was."""
    start, ids, part = case
    if whole:
        ids, part = None, start[::-1].copy()
    kept = start.copy()
    frozen = start.copy()
    frozen.flags.writeable = False
    want = start.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        if ids is None:
            want += part
        else:
            want[ids] += part
        copied = sparse_kernels._add_partials(frozen, (ids,), part)
        got = sparse_kernels._add_partials(start, (ids,), part)
    _bits(got, want)
    _bits(copied, want)
    _bits(frozen, kept)
    assert (got is start) == (start.flags.owndata and start.flags.c_contiguous)


def test_a_chunk_of_the_wrong_shape_is_a_shape_error():
    """sparsetools reads as far as it is told: short values, a short operand piece, a gradient or a
    partial of the wrong shape must raise before the call (scipy's product used to)."""
    from polygrad.errors import ShapeError

    a = sp.random(6, 6, density=0.5, format="csr", random_state=1, dtype=np.float64)
    a.sort_indices()
    block = build_block(a.indptr, a.indices, (0, 6), 0, None)
    x = np.ones((6, 2))
    with pytest.raises(ShapeError, match="nonzeros"):
        sparse_kernels._spmm_block(block, a.data[:-1], x)
    with pytest.raises(ShapeError, match="operand"):
        sparse_kernels._spmm_block(block, a.data, x[:3])
    with pytest.raises(ShapeError, match="operand"):
        sparse_kernels._spmm_t_part(block, a.data, np.ones((4, 2)), 0)
    out = np.zeros((5, 2))
    with pytest.raises(ShapeError, match="halo partial"):
        sparse_kernels._add_at(out, np.array([0, 2]), np.ones((3, 2)))


@settings(max_examples=100, deadline=None)
@given(blocked())
def test_the_rest_is_added_into_the_own_term_only_where_this_worker_made_it(case):
    """``_spmm_tiles`` and ``_add_partials`` add into the own tile's term in place when this
    worker made it (owned, writable, C order, the result's dtype) -- the same bits as into a copy
    -- and otherwise into a copy, leaving the term as it was: an array received from another
    worker (here: read-only, or a view of a buffer) or of another dtype."""
    a, col_bounds, own, x = case
    block = build_block(a.indptr, a.indices, col_bounds, 0, own)
    if own is None or len(col_bounds) < 3:
        return
    parts = [x[lo:hi] if need is None else sparse_kernels._take(x[lo:hi], need)
             for (lo, hi), need in zip(zip(col_bounds[:-1], col_bounds[1:]), block.need)]
    fetched = tuple(j for j in range(len(parts)) if j != own)
    first = sparse_kernels._spmm_tiles(block, a.data, (own,), None, parts[own])
    want = sparse_kernels._spmm_block(block, a.data, *parts) if own == 0 else None
    kept = first.copy()
    view = np.frombuffer(bytearray(first.tobytes()), dtype=first.dtype).reshape(first.shape)
    frozen = first.copy()
    frozen.flags.writeable = False
    wider = first.astype(np.float64) if first.dtype == np.float32 else None
    rest = [parts[j] for j in fetched]
    got = sparse_kernels._spmm_tiles(block, a.data, fetched, first, *rest)
    assert got is first  # added in place
    if want is not None:
        _bits(got, want)
    for start in (view, frozen):
        before = start.copy()
        other = sparse_kernels._spmm_tiles(block, a.data, fetched, start, *rest)
        assert other is not start
        _bits(other, got)
        _bits(start, before)
    if wider is not None:
        _bits(wider, kept.astype(np.float64))
        out = sparse_kernels._spmm_tiles(block, a.data.astype(np.float64), fetched, wider,
                                         *(r.astype(np.float64) for r in rest))
        assert out is wider   # float64 result: the float64 term is the accumulator
    part = np.random.default_rng(3).normal(size=first.shape).astype(first.dtype)
    for start, inplace in ((kept.copy(), True), (view, False), (frozen, False)):
        before = start.copy()
        total = sparse_kernels._add_partials(start, (None,), part)
        assert (total is start) == inplace
        _bits(total, before + part)
        if not inplace:
            _bits(start, before)
