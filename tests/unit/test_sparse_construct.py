"""SparseTensor construction: validation errors, canonical form (duplicates summed), conversions and
the container's tensor-like surface."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import DTypeError, NonFiniteError, ShapeError, SparseIndexError


# -- validation: one test per documented error ---------------------------------------------------------

def test_negative_index():
    with pytest.raises(SparseIndexError, match=r"row indices\[1\] = -1 is out of range \[0, 3\)"):
        pg.sparse_coo([[0, -1], [0, 1]], [1.0, 2.0], (3, 3))


def test_index_out_of_range_rows_and_cols():
    with pytest.raises(SparseIndexError, match="row indices.*out of range"):
        pg.sparse_coo([[0, 3], [0, 1]], [1.0, 2.0], (3, 3))
    with pytest.raises(SparseIndexError, match=r"column indices\[0\] = 5 .*\[0, 4\)"):
        pg.sparse_coo([[0, 1], [5, 1]], [1.0, 2.0], (3, 4))
    with pytest.raises(SparseIndexError, match="column indices"):
        pg.sparse_csr([0, 1, 2], [0, 7], [1.0, 2.0], (2, 3))


@pytest.mark.parametrize("bad", [np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([[True, False], [False, True]])])
def test_non_integer_index_dtype(bad):
    with pytest.raises(SparseIndexError, match="integer dtype"):
        pg.sparse_coo(bad, [1.0, 2.0], (2, 2))
    with pytest.raises(SparseIndexError, match="integer dtype"):
        pg.sparse_csr([0, 1, 2], bad[0], [1.0, 2.0], (2, 2))


def test_wrong_index_array_shape():
    with pytest.raises(SparseIndexError, match=r"\[2, nnz\]"):
        pg.sparse_coo([[0, 1], [1, 0], [0, 0]], [1.0, 2.0], (2, 2))
    with pytest.raises(SparseIndexError, match=r"\[2, nnz\]"):
        pg.sparse_coo([0, 1], [1.0, 2.0], (2, 2))
    with pytest.raises(SparseIndexError, match="1-D"):
        pg.sparse_csr([[0, 1, 2]], [0, 1], [1.0, 2.0], (2, 2))
    with pytest.raises(SparseIndexError, match=r"\[2, E\]"):
        pg.from_edge_index(np.zeros((3, 4), dtype=np.int64))


def test_indptr_not_monotone():
    with pytest.raises(SparseIndexError, match=r"non-decreasing.*indptr\[2\] = 1 < indptr\[1\] = 2"):
        pg.sparse_csr([0, 2, 1, 3], [0, 1, 2], [1.0, 2.0, 3.0], (3, 3))


def test_indptr_wrong_length_start_or_end():
    with pytest.raises(SparseIndexError, match="rows\\+1 = 4 entries"):
        pg.sparse_csr([0, 1, 2], [0, 1], [1.0, 2.0], (3, 3))
    with pytest.raises(SparseIndexError, match=r"indptr\[0\] must be 0"):
        pg.sparse_csr([1, 1, 2], [0, 1], [1.0, 2.0], (2, 2))
    with pytest.raises(SparseIndexError, match=r"indptr\[-1\] = 3 must equal .* \(2\)"):
        pg.sparse_csr([0, 1, 3], [0, 1], [1.0, 2.0], (2, 2))


def test_nnz_mismatch_between_indices_and_values():
    with pytest.raises(ShapeError, match="3 indices but values of shape \\(2,\\)"):
        pg.sparse_coo([[0, 1, 1], [0, 1, 0]], [1.0, 2.0], (2, 2))
    with pytest.raises(ShapeError, match="2 indices"):
        pg.sparse_csr([0, 1, 2], [0, 1], [[1.0, 2.0]], (2, 2))
    with pytest.raises(ShapeError):
        pg.from_edge_index([[0, 1], [1, 0]], values=[1.0, 2.0, 3.0])


def test_non_finite_values_need_allow_nonfinite():
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(NonFiniteError, match=r"values\[1\] = .* not finite.*allow_nonfinite=True"):
            pg.sparse_coo([[0, 1], [0, 1]], [1.0, bad], (2, 2))
    a = pg.sparse_coo([[0, 1], [0, 1]], [1.0, np.nan], (2, 2), allow_nonfinite=True)
    assert np.isnan(a.values.numpy()[1])
    with pytest.raises(NonFiniteError):
        pg.sparse_csr([0, 1], [0], [np.inf], (1, 1))
    with pytest.raises(NonFiniteError):
        pg.tensor(np.array([[0.0, np.nan]]), layout="csr", allow_nonfinite=False)


def test_index_dtype_too_small_for_the_shape():
    small = np.array([[0, 1], [1, 0]], dtype=np.int8)
    with pytest.raises(SparseIndexError, match="int8 cannot address a dimension of size 300"):
        pg.sparse_coo(small, [1.0, 2.0], (300, 2))
    # int8 is fine when it can address the whole shape, and is stored as int64
    a = pg.sparse_coo(small, [1.0, 2.0], (2, 2))
    assert a.indices.dtype == np.int64
    with pytest.raises(SparseIndexError, match="int16 cannot address a dimension of size 40000"):
        pg.sparse_csr(np.array([0, 1], dtype=np.int64), np.array([3], dtype=np.int16), [1.0], (1, 40000))
    with pytest.raises(SparseIndexError, match="indptr of dtype int8 cannot count 200 stored entries"):
        pg.sparse_csr(np.array([0, 0], dtype=np.int8), np.zeros(200, dtype=np.int64), np.ones(200), (1, 1))


def test_int32_and_int64_indices_both_work():
    for dt in (np.int32, np.int64, np.uint32):
        a = pg.sparse_coo(np.array([[1, 0], [0, 2]], dtype=dt), [2.0, 3.0], (2, 3))
        np.testing.assert_array_equal(a.to_dense().numpy(), [[0, 0, 3], [2, 0, 0]])


def test_bad_shape_and_layout():
    with pytest.raises(ShapeError, match="2-D"):
        pg.sparse_coo([[0], [0]], [1.0], (2, 2, 2))
    with pytest.raises(ShapeError, match="non-negative"):
        pg.sparse_coo(np.zeros((2, 0), dtype=np.int64), [], (-1, 2))
    with pytest.raises(ValueError, match="layout"):
        pg.sparse_coo([[0], [0]], [1.0], (1, 1), layout="bsr")
    with pytest.raises(DTypeError, match="only floating values can require grad"):
        pg.sparse_coo([[0], [0]], np.array([1]), (1, 1), requires_grad=True)


# -- canonical form -------------------------------------------------------------------------------------

def test_duplicates_are_summed_and_entries_sorted():
    a = pg.sparse_coo([[2, 0, 2, 0, 1], [1, 2, 1, 0, 1]], [1.0, 2.0, 3.0, 4.0, 5.0], (3, 3))
    assert a.nnz == 4 and a.is_coalesced()
    np.testing.assert_array_equal(a.indices, [[0, 0, 1, 2], [0, 2, 1, 1]])
    np.testing.assert_array_equal(a.values.numpy(), [4.0, 2.0, 5.0, 4.0])  # (2, 1): 1 + 3
    np.testing.assert_array_equal(a.indptr, [0, 2, 3, 4])


def test_csr_with_unsorted_and_repeated_columns():
    a = pg.sparse_csr([0, 3, 3, 4], [2, 0, 2, 1], [1.0, 2.0, 3.0, 4.0], (3, 3))
    np.testing.assert_array_equal(a.indptr, [0, 2, 2, 3])
    np.testing.assert_array_equal(a.col_indices, [0, 2, 1])
    np.testing.assert_array_equal(a.values.numpy(), [2.0, 4.0, 4.0])


def test_explicit_zeros_are_kept_as_structure():
    a = pg.sparse_coo([[0, 1], [1, 0]], [0.0, 2.0], (2, 2), requires_grad=True)
    assert a.nnz == 2
    (a @ pg.ones(2, 1)).sum().backward()
    np.testing.assert_array_equal(a.grad.values.numpy(), [1.0, 1.0])  # the stored zero gets its gradient


def test_canonical_input_is_not_resorted_and_the_transpose_is_cached():
    idx = np.array([[0, 0, 1], [0, 2, 1]])
    a = pg.sparse_coo(idx, [1.0, 2.0, 3.0], (2, 3))
    np.testing.assert_array_equal(a.indices, idx)
    t1, t2 = a.T, a.T
    assert t1.pattern is t2.pattern  # computed once, cached on the pattern
    assert (a * 2).pattern is a.pattern and a.relu().pattern is a.pattern  # ops share, never re-sort
    assert a.T.T.pattern is a.pattern


def test_nnz_zero_and_one_by_one():
    e = pg.sparse_coo(np.zeros((2, 0), dtype=np.int64), [], (3, 4))
    assert e.nnz == 0 and e.density == 0.0 and e.to_dense().shape == (3, 4)
    assert np.all((e @ pg.ones(4, 2)).numpy() == 0)
    e2 = pg.sparse_coo([[], []], [], (0, 0))
    assert e2.shape == (0, 0) and e2.density == 0.0
    one = pg.sparse_coo([[0], [0]], [2.5], (1, 1), requires_grad=True)
    one.backward()
    assert one.grad.values.numpy().tolist() == [1.0] and one.density == 1.0


# -- constructors and conversions ---------------------------------------------------------------------

def test_from_edge_index_defaults():
    a = pg.from_edge_index(np.array([[0, 1, 3], [1, 0, 1]]))
    assert a.shape == (4, 4) and a.layout == "csr" and a.dtype == pg.float32
    np.testing.assert_array_equal(a.values.numpy(), [1.0, 1.0, 1.0])
    assert pg.from_edge_index(np.zeros((2, 0), dtype=np.int64)).shape == (0, 0)
    b = pg.from_edge_index(pg.tensor([[0, 0], [1, 1]]), num_nodes=3, values=[0.5, 0.25], dtype=pg.float64)
    assert b.nnz == 1 and b.values.numpy().tolist() == [0.75]


def test_scipy_roundtrip():
    import scipy.sparse as sp

    m = sp.random(30, 20, density=0.1, format="coo", random_state=0, dtype=np.float64)
    m = sp.coo_matrix((np.concatenate([m.data, [1.0]]), (np.concatenate([m.row, [m.row[0]]]),
                                                        np.concatenate([m.col, [m.col[0]]]))), shape=m.shape)
    a = pg.from_scipy(m)
    assert a.layout == "coo" and a.dtype == np.float64
    np.testing.assert_array_equal(a.to_dense().numpy(), m.toarray())  # the duplicate was summed
    back = pg.from_scipy(m.tocsr()).to_scipy()
    assert back.format == "csr"
    np.testing.assert_array_equal(back.toarray(), m.toarray())
    assert a.to_scipy().format == "coo"


def test_layouts_relabel_the_same_storage():
    a = pg.sparse_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
    assert a.layout == "coo"
    c = a.to_sparse("csr")
    assert c.layout == "csr" and c.values is a.values and c.pattern.indptr is a.pattern.indptr
    assert c.to_sparse("coo").layout == "coo"
    d = pg.tensor([[0.0, 1.0], [0.0, 0.0]])
    assert d.layout == "dense" and d.to_sparse().layout == "csr" and d.to_sparse("coo").nnz == 1
    with pytest.raises(ShapeError, match="2-D"):
        pg.tensor([1.0, 0.0]).to_sparse()


def test_container_surface():
    a = pg.sparse_coo([[0, 1, 1], [2, 0, 1]], [1.0, -2.0, 3.0], (2, 3), dtype=pg.float64, requires_grad=True)
    assert a.shape == (2, 3) and a.ndim == 2 and a.numel == 6 and a.nnz == 3
    assert a.density == pytest.approx(0.5) and a.backend == "numpy" and a.is_leaf
    assert isinstance(a, pg.Tensor) and pg.is_sparse(a) and not pg.is_sparse(a.to_dense())
    np.testing.assert_array_equal(np.asarray(a), [[0, 0, 1], [-2, 3, 0]])
    d = a.detach()
    assert not d.requires_grad and d.pattern is a.pattern
    f = a.float()
    assert f.dtype == pg.float32 and pg.is_sparse(f)
    s = a.to("scalar")
    assert s.backend == "scalar" and s.requires_grad and s.pattern is a.pattern
    np.testing.assert_array_equal(s.to_dense().numpy(), a.to_dense().numpy())
    r = repr(a)
    assert r.startswith("sparse_tensor(indices=") and "nnz=3" in r and "layout='coo'" in r and "requires_grad" in r
    assert "grad_fn=mul" in repr(a * 2)


def test_grad_and_data_properties():
    a = pg.sparse_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), dtype=pg.float64, requires_grad=True)
    assert a.grad is None
    (a * 3.0).sum().backward()
    g = a.grad
    assert pg.is_sparse(g) and g.pattern is a.pattern and g is a.grad
    np.testing.assert_array_equal(g.values.numpy(), [3.0, 3.0])
    a.zero_grad()
    assert a.grad is None and a.values.grad is None
    with pytest.raises(ShapeError, match="same pattern"):
        a.grad = pg.sparse_coo([[0], [0]], [1.0], (2, 2), dtype=pg.float64)
    a.data = a.data * 2  # optimiser-style update keeps the leaf
    np.testing.assert_array_equal(a.values.numpy(), [2.0, 4.0])
    assert a.is_leaf and a.requires_grad
    with pytest.raises(ShapeError, match="patterns differ"):
        a.data = pg.sparse_coo([[0], [0]], [1.0], (2, 2), dtype=pg.float64)


def test_sparse_backward_with_sparse_or_dense_seed():
    a = pg.sparse_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), dtype=pg.float64, requires_grad=True)
    b = a * 2.0
    b.backward(pg.sparse_coo([[0, 1], [1, 0]], [1.0, 10.0], (2, 2), dtype=pg.float64), retain_graph=True)
    np.testing.assert_array_equal(a.grad.values.numpy(), [2.0, 20.0])
    a.zero_grad()
    b.backward(np.array([[5.0, 1.0], [7.0, 5.0]]))  # dense seed: read at the pattern
    np.testing.assert_array_equal(a.grad.values.numpy(), [2.0, 14.0])


def test_dense_only_ops_on_sparse_raise_clear_errors():
    a = pg.sparse_coo([[0], [1]], [1.0], (2, 2))
    for fn in (lambda: a.reshape(4), lambda: a[0], lambda: a.max(), lambda: a.permute(1, 0),
               lambda: pg.concat([a, a])):
        with pytest.raises(ShapeError, match="sparse"):
            fn()
    with pytest.raises(ShapeError, match="shapes must match"):
        a + pg.sparse_coo([[0], [0]], [1.0], (3, 2))
    with pytest.raises(ShapeError, match="inner dimensions|rows"):
        a @ pg.ones(3, 2)
    with pytest.raises(ShapeError, match="columns"):
        pg.ones(2, 3) @ a
    with pytest.raises(ShapeError, match="does not broadcast"):
        a * pg.ones(3, 2)
