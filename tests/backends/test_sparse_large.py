"""SpMM forward + backward (dX and dA) on a 100,000-node, 1,000,000-edge graph with 64 features.

The dense equivalent needs a 100,000 x 100,000 matrix (40 GB in float32, 80 GB in float64); the
sparse path must stay in O(nnz * F) memory.  Slow (a few seconds and ~0.3 GB): marked ``slow``;
``python -m benchmarks sparse`` runs the same workload and reports its time and memory.
Run with ``python -m pytest tests/backends/test_sparse_large.py -m slow``.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from benchmarks._harness import peak_memory_growth
from polygrad.data import random_graph

N, E, F = 100_000, 1_000_000, 64


@pytest.fixture(params=["installed", "own"])
def kernels(request, monkeypatch):
    """The numpy backend as installed (a plugin may override its SpMM), and with its own kernels."""
    if request.param == "own":
        import polygrad.backends.array_kernels as ak
        from polygrad.ir.ops import SPARSE
        from polygrad.runtime.registry import registry
        registry.load()
        for key, fn in ak.make_kernels(np).items():
            if key[0] in SPARSE:
                monkeypatch.setitem(registry.tables["numpy"], key, fn)
                monkeypatch.delitem(registry.vjp_tables.setdefault("numpy", {}), key, raising=False)
    return request.param


@pytest.mark.slow
def test_spmm_forward_backward_100k_nodes_1m_edges(kernels):
    rng = np.random.default_rng(0)
    ei = random_graph(N, E, seed=0, directed=True)
    a = pg.from_edge_index(ei, N, values=rng.uniform(0.5, 1.5, E).astype(np.float32), requires_grad=True)
    x = pg.tensor(rng.normal(size=(N, F)).astype(np.float32), requires_grad=True)
    w = rng.normal(size=(N, F)).astype(np.float32)
    wt = pg.tensor(w)

    def step():
        y = a @ x
        (y * wt).sum().backward()
        return y

    measured = peak_memory_growth(step)
    y, growth = measured.result, measured.bytes
    print(f"\npeak RSS growth of SpMM forward+backward (N={N}, E={E}, F={F}, {kernels} kernels): "
          f"{growth / 2**20:.1f} MiB")
    assert growth < 1.5 * 2**30, f"sparse forward+backward grew RSS by {growth / 2**30:.2f} GiB"

    vals, xs = a.values.numpy().astype(np.float64), x.numpy().astype(np.float64)
    rows, cols = a.row_indices, a.col_indices
    # forward at a few rows
    for i in rng.integers(0, N, 5):
        lo, hi = a.indptr[i], a.indptr[i + 1]
        np.testing.assert_allclose(y.numpy()[i], vals[lo:hi] @ xs[cols[lo:hi]], rtol=1e-4, atol=1e-4)
    # dA only at A's nonzeros: dA_ij = dY_i . X_j with dY = w
    assert a.grad.pattern.same_as(a.pattern) and a.grad.nnz == a.nnz
    pick = rng.integers(0, a.nnz, 200)
    want = np.einsum("ij,ij->i", w[rows[pick]].astype(np.float64), xs[cols[pick]])
    np.testing.assert_allclose(a.grad.values.numpy()[pick], want, rtol=1e-4, atol=1e-3)
    # dX = A^T dY at a few columns
    for j in rng.integers(0, N, 5):
        at = cols == j
        np.testing.assert_allclose(x.grad.numpy()[j], vals[at] @ w[rows[at]].astype(np.float64),
                                   rtol=1e-4, atol=1e-3)
