"""Graph primitives (polygrad.sparse.graph_ops) and the activations (polygrad.tensor.activations).

Gradients against central differences in float64 on numpy and on the scalar reference; numpy and
scalar agree; values and gradients at the edge points follow PyTorch's conventions (the expected
numbers below are PyTorch's, written out so the test needs no torch).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import polygrad as pg
from polygrad.sparse import graph_ops as go
from polygrad.errors import DTypeError, ShapeError, SparseIndexError
from polygrad.testing import assert_backends_agree, check_grads

BACKENDS = ["numpy", "scalar"]
# 5 nodes; source row 0, destination row 1; node 4 has no incoming edge; a repeated edge (0->1)
EDGES = np.array([[0, 2, 3, 1, 0, 4, 2, 0], [1, 1, 1, 0, 2, 2, 3, 1]])


def _pattern():
    return go.graph_pattern(EDGES, 5)


# -- activations --------------------------------------------------------------------------------

POINTS = np.array([-30.0, -2.0, -1e-3, 0.0, 1e-3, 0.7, 3.0, 25.0])


@pytest.mark.parametrize("fn", [lambda x: pg.leaky_relu(x, 0.1), lambda x: pg.elu(x, 1.3), pg.gelu,
                                lambda x: pg.gelu(x, "tanh"), pg.softplus, lambda x: pg.softplus(x, 2.0, 5.0)],
                         ids=["leaky_relu", "elu", "gelu", "gelu_tanh", "softplus", "softplus_beta"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_activation_gradients_match_central_differences(fn, backend):
    x = np.array([-2.5, -0.4, -1e-2, 2e-2, 0.3, 1.7])  # away from the kinks by more than eps
    check_grads(fn, [x], backend=backend)


def _grad_at(fn, x: np.ndarray, backend: str = "numpy") -> tuple[np.ndarray, np.ndarray]:
    t = pg.tensor(x, dtype=pg.float64, requires_grad=True, backend=backend)
    y = fn(t)
    y.sum().backward()
    return y.numpy(), t.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_activations_at_zero_follow_pytorch(backend):
    zero = np.array([0.0])
    assert _grad_at(lambda x: pg.leaky_relu(x, 0.2), zero, backend)[1][0] == 0.2   # x > 0 branch only for x > 0
    assert _grad_at(lambda x: pg.elu(x, 1.5), zero, backend)[1][0] == 1.5          # x <= 0 branch: alpha * exp(0)
    assert _grad_at(pg.softplus, zero, backend)[1][0] == 0.5
    assert _grad_at(pg.gelu, zero, backend)[1][0] == pytest.approx(0.5, abs=1e-7)
    assert _grad_at(lambda x: pg.gelu(x, "tanh"), zero, backend)[1][0] == 0.5
    assert _grad_at(pg.softplus, zero, backend)[0][0] == pytest.approx(math.log(2.0))


def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_activation_values_match_their_definitions_and_never_overflow():
    v, g = _grad_at(lambda x: pg.elu(x, 1.0), POINTS)
    np.testing.assert_allclose(v, np.where(POINTS > 0, POINTS, np.expm1(np.minimum(POINTS, 0))), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g, np.where(POINTS > 0, 1.0, np.exp(np.minimum(POINTS, 0))), rtol=1e-12)
    v, g = _grad_at(pg.softplus, POINTS)  # threshold 20: 25 passes through unchanged, as PyTorch
    want = np.where(POINTS > 20, POINTS, np.log1p(np.exp(POINTS)))
    np.testing.assert_allclose(v, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g, np.where(POINTS > 20, 1.0, 1 / (1 + np.exp(-POINTS))), rtol=1e-12)
    v, g = _grad_at(pg.gelu, POINTS)
    np.testing.assert_allclose(v, [x * _phi(x) for x in POINTS], rtol=2e-7, atol=1e-12)
    pdf = np.exp(-POINTS ** 2 / 2) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(g, [_phi(x) for x in POINTS] + POINTS * pdf, rtol=1e-6, atol=1e-9)
    big = np.array([-800.0, 800.0])  # exp would overflow in a naive formula
    for fn in (pg.elu, pg.softplus, pg.gelu):
        v, g = _grad_at(fn, big)
        assert np.isfinite(v).all() and np.isfinite(g).all(), fn


def test_activations_agree_across_backends():
    x = np.array([-1.2, -0.1, 0.0, 0.4, 2.0])
    for fn in (pg.leaky_relu, pg.elu, pg.gelu, pg.softplus):
        assert_backends_agree(fn, [x], backends=BACKENDS, rtol=1e-10, atol=1e-12)


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        pg.gelu(pg.tensor([1.0]), "erf")


# -- graph_pattern / expand_pattern ------------------------------------------------------------

def test_graph_pattern_is_destination_major_and_drops_repeated_edges():
    p, order = _pattern()
    assert p.shape == (5, 5) and p.nnz == 7            # 8 edges, one repeated
    pairs = set(zip(p.rows.tolist(), p.cols.tolist()))
    assert pairs == {(int(d), int(s)) for s, d in EDGES.T}
    np.testing.assert_array_equal(EDGES[1][order], p.rows)
    np.testing.assert_array_equal(EDGES[0][order], p.cols)
    with pytest.raises(SparseIndexError, match="outside"):
        go.graph_pattern(np.array([[0, 7], [1, 1]]), 5)
    with pytest.raises(SparseIndexError, match=r"\[2, E\]"):
        go.graph_pattern(np.array([0, 1, 2]), 5)


def test_expand_pattern_round_trips_and_is_cached():
    p, _ = _pattern()
    big, to_e, from_e = go.expand_pattern(p, 3)
    assert big.shape == (15, 15) and big.nnz == 3 * p.nnz
    assert go.expand_pattern(p, 3)[0] is big
    vals = np.arange(p.nnz * 3).reshape(p.nnz, 3)
    flat = vals.reshape(-1)[to_e]
    np.testing.assert_array_equal(flat[from_e].reshape(p.nnz, 3), vals)
    # entry (i*H+h, j*H+h) holds head h of edge (i, j); rows sorted, columns sorted within a row
    e = flat // 3
    np.testing.assert_array_equal(big.rows, p.rows[e] * 3 + flat % 3)
    np.testing.assert_array_equal(big.cols, p.cols[e] * 3 + flat % 3)
    assert (np.diff(big.rows) >= 0).all()


# -- sddmm -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_sddmm_values_and_gradients(backend):
    p, _ = _pattern()
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    got = go.sddmm(p, pg.tensor(a, backend=backend), pg.tensor(b, backend=backend)).numpy()
    np.testing.assert_allclose(got, (a @ b.T)[p.rows, p.cols], rtol=1e-12)
    check_grads(lambda x, y: go.sddmm(p, x, y), [a, b], backend=backend)


def test_sddmm_on_a_sparse_tensor_returns_its_pattern_and_rejects_dense_graphs():
    adj = pg.from_edge_index(EDGES, 5, dtype=pg.float64)
    a = pg.tensor(np.ones((5, 2)))
    out = pg.sddmm(adj, a, a)
    assert pg.is_sparse(out) and out.pattern is adj.pattern
    np.testing.assert_allclose(out.values.numpy(), 2.0)
    with pytest.raises(DTypeError, match="sparse tensor or a Pattern"):
        pg.sddmm(pg.tensor(np.ones((5, 5))), a, a)
    with pytest.raises(ShapeError):
        pg.sddmm(adj, pg.tensor(np.ones((5, 2))), pg.tensor(np.ones((5, 3))))


# -- edge softmax ------------------------------------------------------------------------------

def _softmax_reference(p, s):
    out = np.zeros_like(s)
    for r in range(p.shape[0]):
        m = p.rows == r
        if m.any():
            e = np.exp(s[m] - s[m].max(0))
            out[m] = e / e.sum(0)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", [None, 3])
def test_edge_softmax_normalises_per_destination(backend, heads):
    p, _ = _pattern()
    rng = np.random.default_rng(1)
    s = rng.normal(size=(p.nnz,) if heads is None else (p.nnz, heads)) * 3
    got = pg.edge_softmax(p, pg.tensor(s, backend=backend)).numpy()
    np.testing.assert_allclose(got, _softmax_reference(p, s), rtol=1e-12)
    check_grads(lambda t: pg.edge_softmax(p, t), [s], backend=backend)


def test_edge_softmax_is_stable_and_keeps_minus_infinity_rows_finite():
    p, _ = _pattern()
    s = np.zeros(p.nnz)
    s[p.rows == 1] = [1000.0, 1001.0, 999.0]
    s[p.rows == 2] = -np.inf                            # a fully masked destination: zeros, not nan
    out = pg.edge_softmax(p, pg.tensor(s)).numpy()
    np.testing.assert_allclose(out[p.rows == 1], _softmax_reference(p, np.where(np.isinf(s), 0, s))[p.rows == 1])
    np.testing.assert_array_equal(out[p.rows == 2], 0.0)
    assert not np.isnan(out).any()


def test_edge_softmax_on_a_sparse_adjacency_and_bad_shapes():
    adj = pg.from_edge_index(EDGES, 5, values=np.arange(8.0))
    out = pg.edge_softmax(adj)
    assert pg.is_sparse(out)
    rows = out.sum(axis=1).numpy()        # rows of a user's adjacency are its destinations
    nonempty = np.diff(adj.pattern.indptr) > 0
    np.testing.assert_allclose(rows[nonempty], 1.0, rtol=1e-6)
    assert (rows[~nonempty] == 0).all()
    with pytest.raises(ShapeError, match="nnz"):
        pg.edge_softmax(adj, pg.tensor(np.ones(3)))


# -- gather / scatter --------------------------------------------------------------------------

INDEX = np.array([0, 2, 2, 1, 0, 2, 4])  # group 3 is empty


def _scatter_reference(src, reduce, n=5):
    out = np.zeros((n,) + src.shape[1:])
    for i in range(n):
        rows = src[INDEX == i]
        if rows.size:
            out[i] = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.max(0)}[reduce]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_scatter_values_and_gradients(backend, reduce):
    rng = np.random.default_rng(2)
    src = rng.normal(size=(7, 3))
    got = pg.scatter(pg.tensor(src, backend=backend), INDEX, 5, reduce).numpy()
    np.testing.assert_allclose(got, _scatter_reference(src, reduce), rtol=1e-12)
    check_grads(lambda t: pg.scatter(t, INDEX, 5, reduce), [src], backend=backend)


def test_scatter_max_splits_ties_evenly_and_agrees_across_backends():
    src = np.array([[1.0, 5.0], [3.0, 5.0], [3.0, -1.0], [0.0, 0.0], [2.0, 2.0], [1.0, 1.0], [7.0, 7.0]])
    t = pg.tensor(src, requires_grad=True)
    pg.scatter(t, INDEX, 5, "max").sum().backward()
    # group 2 = rows 1, 2, 5: column 0 ties between rows 1 and 2 -> half each; column 1 max at row 1
    np.testing.assert_allclose(t.grad.numpy()[[1, 2, 5]], [[0.5, 1.0], [0.5, 0.0], [0.0, 0.0]])
    assert_backends_agree(lambda x: pg.scatter(x, INDEX, 5, "max"), [src], backends=BACKENDS)


def test_gather_and_scatter_reject_bad_input():
    x = pg.tensor(np.ones((4, 2)))
    np.testing.assert_array_equal(pg.gather(x, [3, 0]).numpy(), np.ones((2, 2)))
    with pytest.raises(SparseIndexError, match="out of range"):
        pg.gather(x, [4])
    with pytest.raises(SparseIndexError, match="1-D integer"):
        pg.scatter(x, np.array([0.5, 1, 2, 3]))
    with pytest.raises(ShapeError, match="one row per index"):
        pg.scatter(x, [0, 1])
    with pytest.raises(SparseIndexError, match="out of range"):
        pg.scatter(x, [0, 1, 2, 9], dim_size=4)
    with pytest.raises(ValueError, match="reduce"):
        pg.scatter(x, [0, 1, 2, 3], reduce="min")
    assert pg.scatter(x, [0, 0, 0, 0], dim_size=3, reduce="max").numpy()[1:].tolist() == [[0, 0], [0, 0]]


# -- fallback ----------------------------------------------------------------------------------

def test_graph_ops_survive_faulty_kernels_through_the_scalar_fallback():
    """With the numpy kernels these composites lean on raising, the scalar decomposition gives
    the same values and gradients (and says so with a FallbackWarning)."""
    from polygrad.testing import inject_fault

    p, _ = _pattern()
    rng = np.random.default_rng(3)
    s, src = rng.normal(size=(p.nnz, 2)), rng.normal(size=(7, 3))

    def run():
        ts, tx = pg.tensor(s, requires_grad=True), pg.tensor(src, requires_grad=True)
        out = (pg.edge_softmax(p, pg.leaky_relu(ts, 0.2)).sum() + pg.elu(pg.scatter(tx, INDEX, 5, "max")).sum()
               + pg.gelu(tx).sum() + pg.softplus(tx).sum())
        out.backward()
        return out.item(), ts.grad.numpy(), tx.grad.numpy()

    clean = run()
    with pytest.warns(pg.FallbackWarning), inject_fault("numpy", "where") as f1, \
            inject_fault("numpy", "segment_max") as f2, inject_fault("numpy", "segment_sum") as f3:
        faulty = run()
    assert f1.triggered and f2.triggered and f3.triggered
    np.testing.assert_allclose(faulty[0], clean[0], rtol=1e-12)
    for a, b in zip(faulty[1:], clean[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
