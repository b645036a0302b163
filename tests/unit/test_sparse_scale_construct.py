"""Construction at scale (issue 11): the counting-sort paths against a scipy reference, on the
hostile shapes of real edge lists, and the index-dtype edges (checked on views, never allocated)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import polygrad as pg
from polygrad.errors import SparseIndexError
from polygrad.sparse.pattern import Pattern


def _graphs():
    rng = np.random.default_rng(7)
    yield "duplicate-heavy", 20, rng.integers(0, 20, (2, 5000))
    yield "empty-rows", 100, rng.integers(0, 50, (2, 300)) * 2          # odd rows (and cols) empty
    loops = np.repeat(np.arange(30), 3)
    yield "self-loop-only", 30, np.stack([loops, loops])
    yield "zero-edges", 5, np.zeros((2, 0), dtype=np.int64)
    yield "zero-nodes", 0, np.zeros((2, 0), dtype=np.int64)
    yield "sorted-already", 40, np.stack(np.nonzero(rng.random((40, 40)) < 0.2))
    yield "one-long-row", 1000, np.stack([np.zeros(2000, dtype=np.int64), rng.integers(0, 1000, 2000)])


GRAPHS = list(_graphs())
IDS = [g[0] for g in GRAPHS]


def _scipy_csr(ei, n, w):
    a = sp.coo_matrix((w, (ei[0], ei[1])), shape=(n, n)).tocsr()
    a.sum_duplicates()
    return a


def _scipy_gcn_norm(ei, n, w):
    a = _scipy_csr(ei, n, w)
    missing = (a.diagonal() == 0).astype(np.float64)
    a = (a + sp.diags(missing, format="csr")).tocsr()
    deg = np.asarray(a.sum(axis=1)).ravel()
    dinv = np.zeros_like(deg)
    np.power(deg, -0.5, out=dinv, where=deg > 0)
    a = (sp.diags(dinv) @ a @ sp.diags(dinv)).tocsr()
    a.sort_indices()
    return a


@pytest.mark.parametrize("name,n,ei", GRAPHS, ids=IDS)
def test_from_edge_index_matches_scipy(name, n, ei):
    w = np.random.default_rng(1).random(ei.shape[1])  # distinct weights: a wrong slot shows
    ours = pg.from_edge_index(ei, n, values=w, dtype=pg.float64)
    ref = _scipy_csr(ei, n, w)
    np.testing.assert_array_equal(ours.indptr, ref.indptr)
    np.testing.assert_array_equal(ours.col_indices, ref.indices)
    np.testing.assert_allclose(ours.values.numpy(), ref.data, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,n,ei", GRAPHS, ids=IDS)
def test_gcn_norm_matches_scipy(name, n, ei):
    ours = pg.gcn_norm(pg.from_edge_index(ei, n, dtype=pg.float64))
    ref = _scipy_gcn_norm(ei, n, np.ones(ei.shape[1]))
    np.testing.assert_array_equal(ours.indptr, ref.indptr)
    np.testing.assert_array_equal(ours.col_indices, ref.indices)
    np.testing.assert_allclose(ours.values.numpy(), ref.data, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,n,ei", GRAPHS, ids=IDS)
def test_transpose_and_union_diagonal_agree_with_the_generic_paths(name, n, ei):
    a = pg.from_edge_index(ei, n)
    t, perm = a.pattern.transpose()
    ref = _scipy_csr(ei, n, np.arange(1.0, ei.shape[1] + 1)).T.tocsr()
    ref.sort_indices()
    np.testing.assert_array_equal(t.indptr, ref.indptr)
    np.testing.assert_array_equal(t.cols, ref.indices)
    assert t.transpose()[0] is a.pattern and np.array_equal(t.transpose()[1][perm], np.arange(a.nnz))
    union, pos, diag_pos, had = a.pattern.union_diagonal()
    loops = np.arange(n, dtype=np.int64)
    generic, gp, gd = pg.union_pattern(a.pattern, Pattern.from_sorted((n, n), loops, loops))
    assert union.same_as(generic)
    np.testing.assert_array_equal(pos, gp)
    np.testing.assert_array_equal(diag_pos, gd)
    np.testing.assert_array_equal(had, np.isin(loops, ei[0][ei[0] == ei[1]]))


def test_duplicates_are_summed_in_a_float64_accumulator():
    # in float32, 1e8 + 1 - 1e8 is 0 left to right: a float32 running sum would lose the 1
    ei = np.array([[0, 1, 0, 0], [0, 0, 0, 0]])
    w = np.array([1e8, 5.0, 1.0, -1e8], dtype=np.float32)
    got = pg.from_edge_index(ei, 2, values=w).values.numpy()
    want = np.float32(np.float64(1e8) + 1.0 - 1e8)  # summed once, in input order (float64 accumulator)
    assert got[0] == want and got[1] == 5.0


def test_from_coo_reports_perm_or_slot():
    p, perm, slot = Pattern.from_coo((3, 3), [2, 0, 1], [1, 2, 0])
    assert slot is None and perm.tolist() == [1, 2, 0] and p.cols.tolist() == [2, 0, 1]
    p, perm, slot = Pattern.from_coo((3, 3), [2, 0, 2], [1, 2, 1])
    assert perm is None and slot.tolist() == [1, 0, 1] and p.nnz == 2
    p, perm, slot = Pattern.from_coo((3, 3), [0, 1], [0, 2])  # canonical input: nothing to move
    assert perm is None and slot is None


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint16])
def test_index_dtypes_give_the_same_int64_pattern(dtype):
    rng = np.random.default_rng(3)
    ei = rng.integers(0, 300, (2, 2000))
    ref = pg.from_edge_index(ei, 300)
    got = pg.from_edge_index(ei.astype(dtype), 300)
    assert got.pattern.same_as(ref.pattern)
    for arr in (got.indptr, got.col_indices, got.row_indices, got.pattern.transpose()[0].cols):
        assert arr.dtype == np.int64  # scipy's kernels get int64 indices: no overflow past 2^31


def test_int32_index_dtype_too_small_for_the_dimension_is_refused():
    idx = np.zeros((2, 1), dtype=np.int16)
    with pytest.raises(SparseIndexError, match="int16 cannot address a dimension of size 40000"):
        pg.sparse_coo(idx, [1.0], (40000, 40000))


def test_nnz_past_int32_with_an_int32_indptr_is_refused_before_allocating():
    # 2^31 column indices as a zero-stride view: nothing of that size is allocated
    cols = np.broadcast_to(np.int32(0), (2 ** 31,))
    with pytest.raises(SparseIndexError, match="cannot count 2147483648 stored entries"):
        pg.sparse_csr(np.array([0, 0], dtype=np.int32), cols, np.broadcast_to(np.float32(1), (2 ** 31,)), (1, 1))
