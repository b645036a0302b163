"""scipy's private ``_sparsetools`` routines that polygrad calls, pinned by what we rely on.

``backends/parallel.py`` (SpMM and its transpose over row blocks) and ``polygrad/sparse/pattern.py``
(sorting each row's columns) call scipy's compiled routines directly, because only they run on a
slice of rows and release the GIL.  They are private: a scipy release may change an argument order
or a semantics without notice.  These tests call each one exactly as polygrad does and compare with
scipy's public API, so an upgrade that breaks a signature or a meaning fails here, by name, instead
of as a wrong number somewhere in a model.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import _sparsetools

INDEX_TYPES = (np.int32, np.int64)
VALUE_TYPES = (np.float32, np.float64)


def _csr(n: int, m: int, density: float, seed: int, itype, vtype) -> sp.csr_matrix:
    a = sp.random(n, m, density=density, format="csr", random_state=seed, dtype=np.float64).astype(vtype)
    a.sort_indices()
    a.indptr = a.indptr.astype(itype)
    a.indices = a.indices.astype(itype)
    return a


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), f=st.integers(1, 4), density=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16), itype=st.sampled_from(INDEX_TYPES), vtype=st.sampled_from(VALUE_TYPES))
def test_csr_matvec_and_matvecs_add_A_times_x_into_out(n, m, f, density, seed, itype, vtype):
    a = _csr(n, m, density, seed, itype, vtype)
    rng = np.random.default_rng(seed)
    x1, xf = rng.normal(size=m).astype(vtype), rng.normal(size=(m, f)).astype(vtype)
    start1, startf = rng.normal(size=n).astype(vtype), rng.normal(size=(n, f)).astype(vtype)
    o1, of = start1.copy(), startf.copy()
    # (n_row, n_col, indptr, indices, data, x, y) and (n_row, n_col, n_vecs, ..., x flat, y flat): y += A x
    _sparsetools.csr_matvec(n, m, a.indptr, a.indices, a.data, x1, o1)
    _sparsetools.csr_matvecs(n, m, f, a.indptr, a.indices, a.data, xf.reshape(-1), of.reshape(-1))
    np.testing.assert_allclose(o1, start1 + a @ x1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(of, startf + a @ xf, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("itype", INDEX_TYPES)
def test_csr_matvec_on_a_row_slice_writes_only_those_rows(itype):
    """parallel.spmm runs one block of rows with a rebased view of indptr, as here."""
    a = _csr(8, 5, 0.5, 1, itype, np.float64)
    x = np.arange(5.0)
    r0, r1 = 3, 6
    out = np.zeros(r1 - r0)
    _sparsetools.csr_matvec(r1 - r0, 5, a.indptr[r0:r1 + 1], a.indices, a.data, x, out)
    np.testing.assert_allclose(out, (a @ x)[r0:r1])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), f=st.integers(1, 3), density=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16), itype=st.sampled_from(INDEX_TYPES))
def test_csc_matvec_on_csr_arrays_adds_A_transpose_times_g(n, m, f, density, seed, itype):
    """A's CSR arrays read as the CSC arrays of Aᵀ: (n_row, n_col) are Aᵀ's shape (m, n)."""
    a = _csr(n, m, density, seed, itype, np.float64)
    rng = np.random.default_rng(seed)
    g1, gf = rng.normal(size=n), rng.normal(size=(n, f))
    o1, of = np.zeros(m), np.zeros((m, f))
    _sparsetools.csc_matvec(m, n, a.indptr, a.indices, a.data, g1, o1)
    _sparsetools.csc_matvecs(m, n, f, a.indptr, a.indices, a.data, gf.reshape(-1), of.reshape(-1))
    np.testing.assert_allclose(o1, a.T @ g1, atol=1e-12)
    np.testing.assert_allclose(of, a.T @ gf, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16),
       itype=st.sampled_from(INDEX_TYPES))
def test_csr_tocsc_gives_the_transpose_with_rows_ascending_and_the_permutation(n, m, density, seed, itype):
    a = _csr(n, m, density, seed, itype, np.float64)
    nnz = a.nnz
    t_indptr, t_cols, perm = np.empty(m + 1, itype), np.empty(nnz, itype), np.empty(nnz, itype)
    _sparsetools.csr_tocsc(n, m, a.indptr, a.indices, np.arange(nnz, dtype=itype), t_indptr, t_cols, perm)
    at = sp.csr_matrix((a.data[perm], t_cols, t_indptr), shape=(m, n))
    np.testing.assert_array_equal(at.toarray(), a.T.toarray())
    for i in range(m):  # row i of Aᵀ lists A's rows in increasing order (what bitwise SpMM relies on)
        row = t_cols[t_indptr[i]:t_indptr[i + 1]]
        assert np.all(np.diff(row) > 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), seed=st.integers(0, 2**16), itype=st.sampled_from(INDEX_TYPES))
def test_csr_sort_indices_sorts_each_row_and_carries_the_payload(n, seed, itype):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, size=n)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(itype)
    cols = np.concatenate([rng.permutation(8)[:c] for c in counts]).astype(itype)
    payload = np.arange(cols.shape[0], dtype=np.float64) + 0.5
    before = {(r, int(c)): p for r in range(n) for c, p in zip(cols[indptr[r]:indptr[r + 1]],
                                                                payload[indptr[r]:indptr[r + 1]])}
    half = n // 2  # pattern.sort_row_indices sorts blocks of rows through views of indptr, as here
    for r0, r1 in ((half, n), (0, half)):
        _sparsetools.csr_sort_indices(r1 - r0, indptr[r0:r1 + 1], cols, payload)
    for r in range(n):
        row = cols[indptr[r]:indptr[r + 1]]
        assert np.all(np.diff(row) > 0)
        assert all(before[(r, int(c))] == p for c, p in zip(row, payload[indptr[r]:indptr[r + 1]]))
