"""A nearly complete halo taken as its whole column block (``partition.WHOLE_HALO_FRACTION``):
the same numbers, bit for bit, as gathering it (no cluster: the cluster's task structure run as
pure functions on the row blocks), and the edge-cut arithmetic (``locality.halo_stats``) counts
the rows the partition then moves.

Why bitwise: a tile taken whole indexes the whole block by block-local ids instead of the gathered
rows by halo positions -- the same operand rows, the same terms in the same order.  The transposed
product's partial then has a row per block row (zero where the block touches nothing: a sum
from +0.0 is never -0.0, and ``x + 0.0`` is ``x``) and is added whole, where the halo partial went
through a unit-valued product (one exact addition per row, the same bits).  One exception, as
``sparse_kernels._add_at`` documents: where both addends are NaN, numpy's ``+=`` keeps the
output's NaN and the unit product the partial's, so the sign and payload of such a NaN may differ
(never whether it is one); the generated inputs here hold no NaN."""
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

from polygrad_dask import locality, partition, sparse_kernels  # noqa: E402
from polygrad_dask.partition import build_block, own_block  # noqa: E402


def _bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), (a, b)


def _bounds(draw, size: int) -> tuple:
    cuts = sorted(draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=3, unique=True))) if size > 1 else []
    return tuple([0] + [c for c in cuts if 0 < c < size] + [size])


@st.composite
def near_whole_patterns(draw):
    """A canonical CSR matrix split into row and column blocks (square: the same bounds, each
    row block owning its diagonal column block), whose every (row block, column block) tile
    touches a drawn number of distinct columns -- from none to all, mostly near a threshold --
    and a drawn threshold; float32 or float64 values and operands with signed zeros."""
    square = draw(st.booleans())
    n = draw(st.integers(1, 40))
    m = n if square else draw(st.integers(1, 40))
    row_bounds = _bounds(draw, n)
    col_bounds = row_bounds if square else _bounds(draw, m)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rows, cols = [], []
    for a, b in zip(row_bounds[:-1], row_bounds[1:]):
        for lo, hi in zip(col_bounds[:-1], col_bounds[1:]):
            size = hi - lo
            # a count around 90% of the block, or anything
            near = int(round(0.9 * size)) + draw(st.integers(-2, 2))
            count = min(max(draw(st.sampled_from([near, near, 0, size]) | st.integers(0, size)), 0), size)
            used = lo + rng.choice(size, count, replace=False)
            extra = rng.choice(used, draw(st.integers(0, 2 * count))) if count else used
            cs = np.concatenate([used, extra])
            rows.append(rng.integers(a, b, cs.shape[0]))
            cols.append(cs)
    r, c = np.concatenate(rows), np.concatenate(cols)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    pool = np.array([0.0, -0.0, 1.5, -2.25, 1e3, -7e-3])
    vals = np.where(rng.random(r.shape[0]) < 0.2, rng.choice(pool, r.shape[0]), rng.normal(size=r.shape[0]))
    a = sp.csr_matrix((vals, (r, c)), shape=(n, m))
    a.sum_duplicates()
    a.sort_indices()
    f = draw(st.integers(1, 3))
    x = np.where(rng.random((m, f)) < 0.1, -0.0, rng.normal(size=(m, f)) * 1e2).astype(dtype)
    g = np.where(rng.random((n, f)) < 0.1, -0.0, rng.normal(size=(n, f))).astype(dtype)
    fraction = draw(st.sampled_from([partition.WHOLE_HALO_FRACTION, 0.5, 0.8, 0.9, 0.95]))
    return a.astype(dtype), row_bounds, col_bounds, x, g, fraction


def _row_blocks(a, row_bounds: tuple, col_bounds: tuple, fraction: float) -> tuple:
    """The row blocks as ``partition_of`` builds them (the own block where the bounds agree) and
    each one's values."""
    blocks, values = [], []
    for i, (r0, r1) in enumerate(zip(row_bounds[:-1], row_bounds[1:])):
        lo, hi = int(a.indptr[r0]), int(a.indptr[r1])
        blocks.append(build_block(a.indptr[r0:r1 + 1] - lo, a.indices[lo:hi], col_bounds, i,
                                  own_block((row_bounds, col_bounds), i), fraction))
        values.append(a.data[lo:hi])
    return blocks, values


def _pieces(block, x: np.ndarray, col_bounds: tuple) -> list:
    """``sparse_kernels._operand_parts`` on the host: each column block whole, gathered, or empty."""
    out = []
    for j, (_, count) in enumerate(block.segments):
        xj = x[col_bounds[j]:col_bounds[j + 1]]
        if not count:
            out.append(np.zeros((0, x.shape[1]), dtype=x.dtype))
        else:
            out.append(xj if block.need[j] is None else sparse_kernels._take(xj, block.need[j]))
    return out


def _spmm(blocks, values, x, row_bounds, col_bounds) -> np.ndarray:
    """``spmm_partition``'s tasks: the own tile first, then the fetched ones onto a copy."""
    out = []
    for i, block in enumerate(blocks):
        parts = _pieces(block, x, col_bounds)
        own = own_block((row_bounds, col_bounds), i)
        fetched = [j for j, (_, count) in enumerate(block.segments) if count and j != own]
        if own is None or not block.segments[own][1] or not fetched:
            out.append(sparse_kernels._spmm_block(block, values[i], *parts))
            continue
        first = sparse_kernels._spmm_tiles(block, values[i], (own,), None, parts[own])
        out.append(sparse_kernels._spmm_tiles(block, values[i], tuple(fetched), first, *(parts[j] for j in fetched)))
    return np.concatenate(out)


def _spmm_t(blocks, values, g, row_bounds, col_bounds) -> np.ndarray:
    """``spmm_t_partition``'s tasks: per column block the own term, then the partials in row-block
    order, whole or at their halo ids."""
    f, dtype, out = g.shape[1], g.dtype, []
    for j, (c0, c1) in enumerate(zip(col_bounds[:-1], col_bounds[1:])):
        ids, pieces, mine = [], [], None
        for i, block in enumerate(blocks):
            if not block.segments[j][1]:
                continue
            if own_block((row_bounds, col_bounds), i) == j:
                mine = i
                continue
            pieces.append(sparse_kernels._spmm_t_part(block, values[i], g[row_bounds[i]:row_bounds[i + 1]], j))
            ids.append(block.need[j])
        if mine is None:
            out.append(sparse_kernels._assemble((c1 - c0, f), dtype, tuple(ids), *pieces))
            continue
        first = sparse_kernels._assemble((c1 - c0, f), dtype, ((sparse_kernels.OWN, j),), blocks[mine],
                                         values[mine], g[row_bounds[mine]:row_bounds[mine + 1]])
        out.append(sparse_kernels._add_partials(first, tuple(ids), *pieces) if pieces else first)
    return np.concatenate(out)


def _sddmm(blocks, p, q, row_bounds, col_bounds) -> np.ndarray:
    return np.concatenate([sparse_kernels._sddmm_block(block, p[row_bounds[i]:row_bounds[i + 1]],
                                                       *_pieces(block, q, col_bounds))
                           for i, block in enumerate(blocks)])


@settings(max_examples=300, deadline=None)
@given(near_whole_patterns())
def test_whole_halo_gives_the_gathered_halos_bits(case):
    """SpMM, the transposed SpMM of spmm_vjp and SDDMM at the drawn threshold equal those at 1.0
    (a block taken whole only when its halo is all of it: the gathering behaviour) bit for bit;
    a block taken whole counts all its rows and keeps no ids, the others keep exactly the
    columns they touch."""
    a, row_bounds, col_bounds, x, g, fraction = case
    old, old_values = _row_blocks(a, row_bounds, col_bounds, 1.0)
    new, new_values = _row_blocks(a, row_bounds, col_bounds, fraction)
    for i, (before, after) in enumerate(zip(old, new)):
        for j, ((_, was), (_, now)) in enumerate(zip(before.segments, after.segments)):
            size = col_bounds[j + 1] - col_bounds[j]
            whole = j != own_block((row_bounds, col_bounds), i) and partition.takes_whole(was, size, fraction)
            assert (after.need[j] is None) == (before.need[j] is None or whole)
            assert now == (size if whole else was)
    _bits(_spmm(new, new_values, x, row_bounds, col_bounds), _spmm(old, old_values, x, row_bounds, col_bounds))
    _bits(_spmm_t(new, new_values, g, row_bounds, col_bounds), _spmm_t(old, old_values, g, row_bounds, col_bounds))
    _bits(_sddmm(new, g, x, row_bounds, col_bounds), _sddmm(old, g, x, row_bounds, col_bounds))


def test_the_threshold_is_read_when_a_block_is_built(monkeypatch):
    """build_block without a threshold reads the module's, so patching it changes what is taken
    whole (9 of 10 columns used: whole at 0.9, gathered at 1.0)."""
    indptr, cols = np.array([0, 9]), np.arange(10, 19)          # one row, columns 10..18 of 0..19
    assert build_block(indptr, cols, (0, 10, 20), 0, 0).need[1] is None
    monkeypatch.setattr(partition, "WHOLE_HALO_FRACTION", 1.0)
    block = build_block(indptr, cols, (0, 10, 20), 0, 0)
    np.testing.assert_array_equal(block.need[1], np.arange(9))
    assert block.segments[1][1] == 9


def test_halo_stats_counts_a_near_whole_halo_as_its_block(monkeypatch):
    """The predicted halo is the partition's: a halo of 9 of a block's 10 rows moves the block."""
    ei = np.array([[0] * 9 + [10], list(range(10, 19)) + [0]])  # block 0 uses 9 of block 1; block 1 one of 0
    monkeypatch.setattr(partition, "WHOLE_HALO_FRACTION", 0.9)
    assert locality.halo_stats(ei, 20, 2)["halo_rows"] == 10 + 1
    monkeypatch.setattr(partition, "WHOLE_HALO_FRACTION", 1.0)
    assert locality.halo_stats(ei, 20, 2)["halo_rows"] == 9 + 1
