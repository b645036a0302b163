"""The numpy backend's sparse kernels (backends/array_kernels.py) on their own: every chunking path
(many rows per chunk -> reduceat; few long rows -> per-row sums; a row longer than a chunk), empty
rows, mixed dtypes, against dense numpy; and the scalar reference for the same inputs."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
import polygrad.backends.array_kernels as ak
from polygrad.ir.ops import Op
from polygrad.runtime.registry import registry


def kernels():
    return ak.make_kernels(np)


def random_pattern(n: int, m: int, degrees, seed: int = 0):
    """A canonical pattern whose row i has degrees[i] distinct columns."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for i, d in enumerate(degrees):
        c = np.sort(rng.choice(m, size=d, replace=False))
        rows.append(np.full(d, i))
        cols.append(c)
    idx = np.stack([np.concatenate(rows), np.concatenate(cols)]).astype(np.int64) if rows else np.zeros((2, 0))
    a = pg.sparse_coo(idx, rng.normal(size=idx.shape[1]), (n, m), dtype=pg.float64)
    return a, a.to_dense().numpy()


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
@pytest.mark.parametrize("f", [1, 3, 16, 40])
def test_spmm_chunk_paths(monkeypatch, chunk, f):
    monkeypatch.setattr(ak, "SPARSE_CHUNK_ELEMENTS", chunk)
    degrees = [0, 5, 1, 0, 30, 2, 0, 0, 9, 1]  # empty rows, a row longer than small chunks
    a, dense = random_pattern(10, 40, degrees, seed=f)
    x = np.random.default_rng(1).normal(size=(40, f))
    spmm = kernels()[(Op.SPMM, "csr")]
    got = spmm(a.values.numpy(), x, pattern=a.pattern)
    np.testing.assert_allclose(got, dense @ x, rtol=1e-12, atol=1e-12)
    got1 = spmm(a.values.numpy(), x[:, 0], pattern=a.pattern)  # 1-D operand
    np.testing.assert_allclose(got1, dense @ x[:, 0], rtol=1e-12, atol=1e-12)


def test_spmm_mixed_dtypes_and_noncontiguous_operand():
    a, dense = random_pattern(6, 8, [1, 0, 3, 8, 2, 0], seed=4)
    x = np.asfortranarray(np.random.default_rng(5).normal(size=(8, 5)).astype(np.float32))
    spmm = kernels()[(Op.SPMM, "csr")]
    got = spmm(a.values.numpy().astype(np.float32), x, pattern=a.pattern)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, dense.astype(np.float32) @ x, rtol=1e-5, atol=1e-6)
    got64 = spmm(a.values.numpy(), x, pattern=a.pattern)
    assert got64.dtype == np.float64


@pytest.mark.parametrize("chunk", [1, 5, 1 << 16])
def test_sddmm_and_segments(monkeypatch, chunk):
    monkeypatch.setattr(ak, "SPARSE_CHUNK_ELEMENTS", chunk)
    a, dense = random_pattern(7, 9, [3, 0, 9, 1, 0, 4, 2], seed=6)
    rng = np.random.default_rng(7)
    p, q = rng.normal(size=(7, 4)), rng.normal(size=(9, 4))
    k = kernels()
    rows, cols = a.row_indices, a.col_indices
    np.testing.assert_allclose(k[(Op.SDDMM, "csr")](p, q, pattern=a.pattern), (p @ q.T)[rows, cols], rtol=1e-12)
    v = a.values.numpy()
    np.testing.assert_allclose(k[(Op.SEGMENT_SUM, "csr")](v, pattern=a.pattern), dense.sum(1), rtol=1e-12,
                               atol=1e-15)
    masked = np.where(dense != 0, dense, -np.inf).max(1)
    np.testing.assert_array_equal(k[(Op.SEGMENT_MAX, "csr")](v, pattern=a.pattern),
                                  np.where(np.isfinite(masked), masked, 0.0))


def test_empty_pattern_and_zero_width():
    a = pg.sparse_coo(np.zeros((2, 0), dtype=np.int64), [], (4, 3), dtype=pg.float64)
    k = kernels()
    assert np.all(k[(Op.SPMM, "csr")](a.values.numpy(), np.ones((3, 2)), pattern=a.pattern) == 0)
    b, _ = random_pattern(3, 3, [1, 2, 0])
    assert k[(Op.SPMM, "csr")](b.values.numpy(), np.ones((3, 0)), pattern=b.pattern).shape == (3, 0)
    assert np.all(k[(Op.SDDMM, "csr")](np.ones((3, 0)), np.ones((3, 0)), pattern=b.pattern) == 0)


@pytest.fixture
def own_numpy_kernels(monkeypatch):
    """The numpy backend with its own sparse kernels, whatever plugin (polygrad-scipy) overrides them."""
    registry.load()
    own = kernels()
    for key, fn in own.items():
        if key[0] in (Op.SPMM, Op.SDDMM, Op.SEGMENT_SUM, Op.SEGMENT_MAX):
            monkeypatch.setitem(registry.tables["numpy"], key, fn)
            monkeypatch.delitem(registry.vjp_tables.setdefault("numpy", {}), key, raising=False)


def test_numpy_kernels_match_the_scalar_reference(own_numpy_kernels):
    a, _ = random_pattern(5, 6, [2, 0, 6, 1, 3], seed=8)
    x = np.random.default_rng(9).normal(size=(6, 3))
    for name in ("numpy", "scalar"):
        assert (Op.SPMM, "csr") in registry.tables[name]
    out = {}
    for backend in ("numpy", "scalar"):
        ab = a.to(backend)
        out[backend] = ((ab @ pg.tensor(x, backend=backend)).numpy(),
                        pg.row_softmax(ab).values.numpy(), ab.sum(0).numpy())
    for got, want in zip(out["numpy"], out["scalar"]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_gradients_through_the_own_kernels(own_numpy_kernels, monkeypatch, chunk):
    """End to end on the numpy backend's own kernels: central differences and the dense computation."""
    from tests.unit._sparse_helpers import check_sparse_op
    monkeypatch.setattr(ak, "SPARSE_CHUNK_ELEMENTS", chunk)
    idx = np.array([[0, 0, 2, 3, 3, 3, 0], [1, 3, 3, 0, 1, 1, 1]])
    vals = np.linspace(-1.5, 2.0, idx.shape[1])
    x = np.random.default_rng(10).normal(size=(4, 5))
    check_sparse_op(lambda a, x: a @ x, idx, (4, 4), vals, [x], dense_op=lambda d, x: d @ x)
    check_sparse_op(lambda a, x: x.T @ a, idx, (4, 4), vals, [x], dense_op=lambda d, x: x.T @ d)
    check_sparse_op(lambda a: a.row_softmax().sum(0), idx, (4, 4), vals)
