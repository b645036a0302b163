"""Every sparse op, forward and gradient, against float64 central differences AND against the dense
computation restricted to the pattern, on the scalar and numpy backends; plus the two backends
against each other.  Cases cover empty rows and columns, nnz = 0, duplicate input entries, 1x1 and
rectangular shapes."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from tests.unit._sparse_helpers import check_sparse_op, dense_of

# (indices [2, k] with duplicates / empty rows and columns, shape)
CASES = {
    # row 2 and column 1 empty; (0, 3) appears twice
    "rect": (np.array([[0, 0, 1, 3, 0, 3], [3, 0, 2, 0, 3, 3]]), (4, 5)),
    "wide": (np.array([[0, 1, 1], [4, 0, 2]]), (2, 6)),
    "one": (np.array([[0], [0]]), (1, 1)),
    "empty": (np.zeros((2, 0), dtype=np.int64), (3, 2)),
    "dups": (np.array([[1, 1, 1, 0, 2, 2], [1, 1, 1, 2, 0, 0]]), (3, 3)),
}
CASES["square_gap"] = (np.array([[0, 0, 2, 3, 3], [1, 3, 3, 0, 1]]), (4, 4))  # row 1, col 2 empty
CASES["empty_square"] = (np.zeros((2, 0), dtype=np.int64), (2, 2))
SQUARE = ["one", "empty_square", "dups", "square_gap"]


def case(name: str, seed: int = 0):
    idx, shape = CASES[name]
    rng = np.random.default_rng(seed)
    vals = rng.uniform(0.3, 1.7, idx.shape[1]) * rng.choice([-1.0, 1.0], idx.shape[1])
    return idx, shape, vals


def other_indices(shape: tuple, seed: int = 1) -> np.ndarray:
    """A second pattern on the same shape (overlapping the first only partly)."""
    n, m = shape
    if n * m == 0:
        return np.zeros((2, 0), dtype=np.int64)
    rng = np.random.default_rng(seed)
    k = max(1, (n * m) // 2)
    flat = rng.choice(n * m, size=k, replace=False)
    return np.stack(np.divmod(flat, m)).astype(np.int64)


def sparse_b(idx_b, shape):
    return lambda vb: pg.sparse_coo(idx_b, vb, shape)


def dense_b(idx_b, shape):
    # the dense twin of sparse_b through a core dense op (index_add), not through polygrad.sparse
    return lambda vb: pg.index_add(vb, (idx_b[0], idx_b[1]), shape)


ALL = list(CASES)


def run_both(check, *args, **kwargs):
    """Run a check on scalar and numpy and require they agree to 1e-10."""
    res = {b: check(*args, backend=b, **kwargs) for b in ("scalar", "numpy")}
    s, n = res["scalar"], res["numpy"]
    np.testing.assert_allclose(n["out"], s["out"], rtol=1e-10, atol=1e-12, err_msg="numpy vs scalar forward")
    for a, b in zip(n["grads"], s["grads"]):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11, err_msg="numpy vs scalar gradient")
    return res


# -- SpMM in both directions -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_spmm_sparse_at_dense(name):
    idx, shape, vals = case(name)
    x = np.random.default_rng(2).normal(size=(shape[1], 3))
    run_both(check_sparse_op, lambda a, x: a @ x, idx, shape, vals, [x], dense_op=lambda d, x: d @ x)


@pytest.mark.parametrize("name", ALL)
def test_spmv_sparse_at_vector(name):
    idx, shape, vals = case(name)
    x = np.random.default_rng(3).normal(size=(shape[1],))
    run_both(check_sparse_op, lambda a, x: a @ x, idx, shape, vals, [x], dense_op=lambda d, x: d @ x)


@pytest.mark.parametrize("name", ALL)
def test_dense_at_sparse(name):
    idx, shape, vals = case(name)
    x = np.random.default_rng(4).normal(size=(2, shape[0]))
    run_both(check_sparse_op, lambda a, x: x @ a, idx, shape, vals, [x], dense_op=lambda d, x: x @ d)


@pytest.mark.parametrize("name", ["rect", "empty"])
def test_vector_at_sparse(name):
    idx, shape, vals = case(name)
    x = np.random.default_rng(5).normal(size=(shape[0],))
    run_both(check_sparse_op, lambda a, x: x @ a, idx, shape, vals, [x], dense_op=lambda d, x: x @ d)


@pytest.mark.parametrize("name", ["rect", "dups", "empty"])
def test_transpose_then_spmm(name):
    idx, shape, vals = case(name)
    x = np.random.default_rng(6).normal(size=(shape[0], 2))
    run_both(check_sparse_op, lambda a, x: a.T @ x, idx, shape, vals, [x], dense_op=lambda d, x: d.T @ x)


class OpRecorder:
    def __init__(self):
        self.ops: list[str] = []

    @pg.hookimpl
    def polygrad_op_executed(self, op, backend, layout, inputs, output):
        self.ops.append(op)


@pytest.mark.parametrize("backend", ["scalar", "numpy"])
def test_spmm_backward_runs_sddmm_only_when_values_need_grad(monkeypatch, backend):
    """dA is an SDDMM at A's nonzeros, and it is skipped when A's values need no gradient."""
    from polygrad.ir.ops import Op
    from polygrad.runtime.registry import registry
    registry.load()
    # a plugin's fused SpMM backward (polygrad-scipy) would bypass the rule checked here
    for layout in ("csr", "coo"):
        monkeypatch.delitem(registry.vjp_tables.setdefault(backend, {}), (Op.SPMM, layout), raising=False)
    rec = OpRecorder()
    pg.register_plugin(rec, name="sparse-op-recorder")
    try:
        idx, shape, vals = case("rect")
        x = pg.tensor(np.ones((shape[1], 2)), backend=backend, requires_grad=True)
        a = pg.sparse_coo(idx, vals, shape, backend=backend)
        y = a @ x
        rec.ops.clear()
        y.sum().backward()
        assert "sddmm" not in rec.ops and "spmm" in rec.ops and x.grad is not None and a.grad is None
        a = pg.sparse_coo(idx, vals, shape, backend=backend, requires_grad=True)
        x.zero_grad()
        y = a @ x
        rec.ops.clear()
        y.sum().backward()
        assert rec.ops.count("sddmm") == 1 and a.grad is not None and a.grad.pattern.same_as(a.pattern)
        x.requires_grad = False
        y = a @ x
        rec.ops.clear()
        y.sum().backward()
        assert "spmm" not in rec.ops and rec.ops.count("sddmm") == 1  # no dX: no transposed SpMM
    finally:
        pg.unregister_plugin(rec)


# -- transpose, to_dense ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_transpose(name):
    idx, shape, vals = case(name)
    res = run_both(check_sparse_op, lambda a: a.T, idx, shape, vals, dense_op=lambda d: d.T)
    assert res["numpy"]["sparse_out"]


@pytest.mark.parametrize("name", ALL)
def test_to_dense(name):
    idx, shape, vals = case(name)
    res = run_both(check_sparse_op, lambda a: a.to_dense(), idx, shape, vals, dense_op=lambda d: d * 1.0)
    np.testing.assert_allclose(res["numpy"]["out"], dense_of(idx, vals, shape))


# -- add / sub / mul / div --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_add_union_pattern(name):
    idx, shape, vals = case(name)
    idx_b = other_indices(shape)
    vb = np.random.default_rng(7).normal(size=idx_b.shape[1])
    sb, db = sparse_b(idx_b, shape), dense_b(idx_b, shape)
    res = run_both(check_sparse_op, lambda a, v: a + sb(v), idx, shape, vals, [vb],
                   dense_op=lambda d, v: d + db(v))
    assert res["numpy"]["sparse_out"]


@pytest.mark.parametrize("name", ["rect", "dups", "empty"])
def test_sub_union_pattern(name):
    idx, shape, vals = case(name)
    idx_b = other_indices(shape, seed=3)
    vb = np.random.default_rng(8).normal(size=idx_b.shape[1])
    sb, db = sparse_b(idx_b, shape), dense_b(idx_b, shape)
    run_both(check_sparse_op, lambda a, v: a - sb(v), idx, shape, vals, [vb], dense_op=lambda d, v: d - db(v))
    run_both(check_sparse_op, lambda a, v: sb(v) - a, idx, shape, vals, [vb], dense_op=lambda d, v: db(v) - d)


@pytest.mark.parametrize("name", ALL)
def test_add_same_pattern_and_self(name):
    idx, shape, vals = case(name)
    run_both(check_sparse_op, lambda a: a + a * 3.0, idx, shape, vals, dense_op=lambda d: d + d * 3.0)


@pytest.mark.parametrize("name", ["rect", "one", "empty"])
def test_add_dense_gives_dense(name):
    idx, shape, vals = case(name)
    y = np.random.default_rng(9).normal(size=shape)
    res = run_both(check_sparse_op, lambda a, y: a + y, idx, shape, vals, [y], dense_op=lambda d, y: d + y)
    assert not res["numpy"]["sparse_out"]
    run_both(check_sparse_op, lambda a, y: y - a, idx, shape, vals, [y], dense_op=lambda d, y: y - d)
    run_both(check_sparse_op, lambda a: a + 1.5, idx, shape, vals, dense_op=lambda d: d + 1.5)


@pytest.mark.parametrize("name", ALL)
def test_mul_intersection_pattern(name):
    idx, shape, vals = case(name)
    idx_b = other_indices(shape, seed=5)
    vb = np.random.default_rng(10).normal(size=idx_b.shape[1])
    sb, db = sparse_b(idx_b, shape), dense_b(idx_b, shape)
    res = run_both(check_sparse_op, lambda a, v: a * sb(v), idx, shape, vals, [vb],
                   dense_op=lambda d, v: d * db(v))
    assert res["numpy"]["sparse_out"]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bshape", ["full", "row", "col", "scalar_tensor"])
def test_mul_dense_keeps_pattern(name, bshape):
    idx, shape, vals = case(name)
    n, m = shape
    b = {"full": (n, m), "row": (m,), "col": (n, 1), "scalar_tensor": ()}[bshape]
    y = np.random.default_rng(11).normal(size=b)
    res = run_both(check_sparse_op, lambda a, y: a * y, idx, shape, vals, [y], dense_op=lambda d, y: d * y)
    assert res["numpy"]["sparse_out"]
    run_both(check_sparse_op, lambda a, y: y * a, idx, shape, vals, [y], dense_op=lambda d, y: y * d)


@pytest.mark.parametrize("name", ["rect", "dups", "empty"])
def test_mul_and_div_by_scalar(name):
    idx, shape, vals = case(name)
    run_both(check_sparse_op, lambda a: 2.5 * a, idx, shape, vals, dense_op=lambda d: 2.5 * d)
    run_both(check_sparse_op, lambda a: a / 4.0, idx, shape, vals, dense_op=lambda d: d / 4.0)
    run_both(check_sparse_op, lambda a: -a, idx, shape, vals, dense_op=lambda d: -d)


@pytest.mark.parametrize("name", ["rect", "one", "empty"])
def test_div_by_dense_keeps_pattern(name):
    idx, shape, vals = case(name)
    y = np.random.default_rng(12).uniform(0.5, 2.0, size=shape)
    run_both(check_sparse_op, lambda a, y: a / y, idx, shape, vals, [y], dense_op=lambda d, y: d / y)


def test_division_by_a_sparse_matrix_is_dense():
    a = pg.sparse_coo([[0], [1]], [2.0], (2, 2), dtype=pg.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 1.0 / a
    assert out.layout == "dense" and out.numpy()[0, 1] == 0.5 and np.isinf(out.numpy()[0, 0])


@pytest.mark.parametrize("name", ["rect", "dups", "one"])
def test_pow_positive_scalar_keeps_pattern(name):
    idx, shape, vals = case(name)
    res = run_both(check_sparse_op, lambda a: a ** 3, idx, shape, vals, dense_op=lambda d: d ** 3)
    assert res["numpy"]["sparse_out"]
    a = pg.sparse_coo(idx, vals, shape)
    assert (a ** 0).layout == "dense" and np.all((a ** 0).numpy() == 1)  # 0 ** 0 = 1 everywhere
    assert (2 ** a).layout == "dense"


# -- reductions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, False), (-1, True), (0, True),
                                           ((0, 1), True)])
def test_sum(name, axis, keepdims):
    idx, shape, vals = case(name)
    run_both(check_sparse_op, lambda a: a.sum(axis, keepdims=keepdims), idx, shape, vals,
             dense_op=lambda d: d.sum(axis, keepdims=keepdims))


@pytest.mark.parametrize("name", ["rect", "dups"])
def test_mean_and_pg_sum(name):
    idx, shape, vals = case(name)
    run_both(check_sparse_op, lambda a: a.mean(0), idx, shape, vals, dense_op=lambda d: d.mean(0))
    run_both(check_sparse_op, lambda a: pg.sum(a, 1, keepdims=True), idx, shape, vals,
             dense_op=lambda d: pg.sum(d, 1, keepdims=True))


# -- scaling, elementwise on values, softmax ----------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_scale_rows_and_cols(name):
    idx, shape, vals = case(name)
    r = np.random.default_rng(13).normal(size=shape[0])
    c = np.random.default_rng(14).normal(size=shape[1])
    run_both(check_sparse_op, lambda a, r: pg.scale_rows(a, r), idx, shape, vals, [r],
             dense_op=lambda d, r: d * r.reshape(-1, 1))
    run_both(check_sparse_op, lambda a, c: a.scale_cols(c), idx, shape, vals, [c],
             dense_op=lambda d, c: d * c)


UNARY = {
    "relu": (lambda a: a.relu(), lambda d: d.relu()),
    "exp": (lambda a: a.exp(), lambda d: d.exp()),
    "tanh": (lambda a: a.tanh(), lambda d: d.tanh()),
    "sigmoid": (lambda a: a.sigmoid(), lambda d: d.sigmoid()),
    "log1p_sq": (lambda a: a.apply_values(lambda v: (v * v + 1).log()), lambda d: (d * d + 1).log()),
}


@pytest.mark.parametrize("name", ["rect", "dups", "one", "empty"])
@pytest.mark.parametrize("fn", list(UNARY))
def test_elementwise_on_values(name, fn):
    idx, shape, vals = case(name)
    sparse_fn, dense_fn = UNARY[fn]
    res = run_both(check_sparse_op, sparse_fn, idx, shape, vals, dense_op=dense_fn)
    assert res["numpy"]["sparse_out"]


def _masked_row_softmax(mask: np.ndarray):
    def dense(d):
        e = (d - d.max(1, keepdims=True).detach()).exp() * mask
        s = e.sum(1, keepdims=True)
        return e / (s + (s == 0).cast(s.dtype))
    return dense


@pytest.mark.parametrize("name", ALL)
def test_row_softmax(name):
    idx, shape, vals = case(name)
    mask = (dense_of(idx, np.ones(idx.shape[1]), shape) > 0).astype(np.float64)
    res = run_both(check_sparse_op, lambda a: a.row_softmax(), idx, shape, vals,
                   dense_op=_masked_row_softmax(mask))
    out = res["numpy"]["out"]
    nonempty = mask.sum(1) > 0
    np.testing.assert_allclose(out.sum(1)[nonempty], 1.0)
    assert np.all(out[~nonempty] == 0)


@pytest.mark.parametrize("name", ["rect", "dups"])
def test_column_softmax(name):
    idx, shape, vals = case(name)
    mask = (dense_of(idx, np.ones(idx.shape[1]), shape) > 0).astype(np.float64)
    row = _masked_row_softmax(mask.T)
    run_both(check_sparse_op, lambda a: a.softmax(axis=0), idx, shape, vals, dense_op=lambda d: row(d.T).T)


# -- graph helpers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SQUARE)
@pytest.mark.parametrize("mode", ["add", "remaining"])
def test_add_self_loops(name, mode):
    idx, shape, vals = case(name)
    n = shape[0]
    has_diag = np.diag(dense_of(idx, np.ones(idx.shape[1]), shape)) > 0
    fill = np.ones(n) if mode == "add" else (~has_diag).astype(np.float64)
    res = run_both(check_sparse_op, lambda a: pg.add_self_loops(a, 1.0, mode=mode), idx, shape, vals,
                   dense_op=lambda d: d + pg.tensor(np.diag(fill), backend=d.backend))
    assert res["numpy"]["sparse_out"]


@pytest.mark.parametrize("name", SQUARE)
def test_gcn_norm(name):
    idx, shape, _ = case(name)
    vals = np.random.default_rng(15).uniform(0.5, 1.5, idx.shape[1])  # positive degrees
    n = shape[0]
    has_diag = np.diag(dense_of(idx, np.ones(idx.shape[1]), shape)) > 0
    eye = np.diag((~has_diag).astype(np.float64))

    def dense(d):
        d2 = d + pg.tensor(eye, backend=d.backend)
        dinv = d2.sum(1) ** -0.5
        return d2 * dinv.reshape(n, 1) * dinv.reshape(1, n)

    run_both(check_sparse_op, lambda a: pg.gcn_norm(a), idx, shape, vals, dense_op=dense)


def test_gcn_norm_matches_data_reference():
    """pg.gcn_norm agrees with polygrad.data.normalized_adjacency (PyG's convention)."""
    from polygrad.data import normalized_adjacency, random_graph
    ei = random_graph(50, 200, seed=3)
    ei = np.concatenate([ei, [[4, 7], [4, 7]]], axis=1)  # existing self loops are kept, not doubled
    ref = normalized_adjacency(ei, 50)
    ours = pg.gcn_norm(pg.from_edge_index(ei, 50, dtype=pg.float64))
    np.testing.assert_array_equal(ours.indptr, ref.indptr)
    np.testing.assert_array_equal(ours.col_indices, ref.indices)
    np.testing.assert_allclose(ours.values.numpy(), ref.data, rtol=1e-12)


def test_gcn_norm_zero_degree_rows_stay_zero():
    a = pg.sparse_coo([[0, 1], [1, 0]], [1.0, 1.0], (3, 3), dtype=pg.float64, requires_grad=True)
    out = pg.gcn_norm(a, add_self_loops=False)
    assert np.all(out.to_dense().numpy()[2] == 0)
    out.sum().backward()
    assert np.all(np.isfinite(a.grad.values.numpy()))


# -- sparse @ sparse (kept sparse) ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rect", "dups", "empty", "one"])
def test_sparse_at_sparse(name):
    idx, shape, vals = case(name)
    bshape = (shape[1], 3)
    idx_b = other_indices(bshape, seed=9)
    vb = np.random.default_rng(16).normal(size=idx_b.shape[1])
    sb, db = sparse_b(idx_b, bshape), dense_b(idx_b, bshape)
    res = run_both(check_sparse_op, lambda a, v: a @ sb(v), idx, shape, vals, [vb], dense_op=lambda d, v: d @ db(v))
    assert res["numpy"]["sparse_out"]


# -- dense -> sparse ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["scalar", "numpy"])
def test_to_sparse_gradient_lives_on_the_nonzeros(backend):
    x0 = np.array([[0.0, 1.5, 0.0], [-2.0, 0.0, 3.0]])
    x = pg.tensor(x0, backend=backend, requires_grad=True)
    s = x.to_sparse()
    assert s.layout == "csr" and s.nnz == 3
    np.testing.assert_array_equal(s.to_dense().numpy(), x0)
    w = np.array([1.0, 2.0, 3.0])
    (s.values * pg.tensor(w, backend=backend)).sum().backward()
    want = np.zeros_like(x0)
    want[x0 != 0] = w
    np.testing.assert_array_equal(x.grad.numpy(), want)
    # numerically: perturbing a nonzero entry moves exactly its value
    eps = 1e-6
    for (i, j), g in zip(zip(*np.nonzero(x0)), w):
        xp, xm = x0.copy(), x0.copy()
        xp[i, j] += eps
        xm[i, j] -= eps
        f = lambda arr: float((pg.tensor(arr, backend=backend).to_sparse().values.numpy() * w).sum())  # noqa: E731
        assert abs((f(xp) - f(xm)) / (2 * eps) - g) < 1e-6


def test_sparse_dense_roundtrip_through_autograd():
    """dense -> sparse -> op -> dense: the gradient reaches the dense input at its nonzeros."""
    x0 = np.array([[0.0, 2.0], [1.0, 0.0]])
    x = pg.tensor(x0, requires_grad=True)
    y = (x.to_sparse().exp().to_dense() * pg.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=pg.float64)).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 2 * np.exp(2.0)], [3 * np.exp(1.0), 0]])


# -- accumulation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["scalar", "numpy"])
def test_leaf_used_twice_accumulates(backend):
    idx, shape, vals = case("rect")
    a = pg.sparse_coo(idx, vals, shape, dtype=pg.float64, backend=backend, requires_grad=True)
    x = pg.tensor(np.ones((shape[1], 2)), backend=backend)
    loss = (a @ x).sum() + (a * 3.0).sum() + a.T.sum(0).sum()
    loss.backward()
    # d/dv of sum(A @ 1) = 2 (two columns), of 3*sum(A) = 3, of sum(A^T) = 1
    np.testing.assert_allclose(a.grad.values.numpy(), np.full(a.nnz, 6.0))
    assert a.grad.pattern.same_as(a.pattern)
    loss2 = (a * 2.0).sum()
    loss2.backward()  # accumulates across backward calls
    np.testing.assert_allclose(a.grad.values.numpy(), np.full(a.nnz, 8.0))


def test_adding_sparse_gradients_merges_patterns():
    a = pg.sparse_coo([[0, 1], [0, 1]], [1.0, 2.0], (2, 2), dtype=pg.float64, requires_grad=True)
    b = pg.sparse_coo([[0, 1], [1, 1]], [3.0, 4.0], (2, 2), dtype=pg.float64, requires_grad=True)
    x = pg.tensor(np.eye(2))
    ((a @ x).sum() + (b @ x).sum() * 2).backward()
    total = a.grad + b.grad
    assert pg.is_sparse(total) and total.nnz == 3
    np.testing.assert_array_equal(total.to_dense().numpy(), [[1.0, 2.0], [0.0, 3.0]])


def test_values_tensor_keeps_its_graph():
    """Learnable edge weights: sparse_coo with a tensor of values differentiates back to it."""
    w = pg.tensor([1.0, 2.0, 3.0], dtype=pg.float64, requires_grad=True)
    a = pg.sparse_coo([[0, 0, 1], [1, 1, 0]], w, (2, 2))  # the first two entries are duplicates
    assert a.nnz == 2 and not a.is_leaf
    (a @ pg.tensor([[1.0], [10.0]], dtype=pg.float64)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [10.0, 10.0, 1.0])


def test_reductions_are_bitwise_reproducible():
    rng = np.random.default_rng(0)
    ei = rng.integers(0, 500, size=(2, 5000))
    x = rng.normal(size=(500, 8)).astype(np.float32)
    outs = []
    for _ in range(3):
        a = pg.from_edge_index(ei, 500, values=rng.normal(size=5000).astype(np.float32) * 0 + 0.37,
                               requires_grad=True)
        xt = pg.tensor(x, requires_grad=True)
        y = a @ xt
        (y * y).sum().backward()
        outs.append((y.numpy().tobytes(), a.grad.values.numpy().tobytes(), xt.grad.numpy().tobytes(),
                     a.row_softmax().values.numpy().tobytes(), a.sum(0).numpy().tobytes()))
    assert outs[0] == outs[1] == outs[2]


def test_mixed_backends_are_refused_with_both_names():
    a = pg.sparse_coo([[0], [0]], [1.0], (1, 1), backend="scalar")
    b = pg.sparse_coo([[0], [0]], [1.0], (1, 1), backend="numpy")
    with pytest.raises(pg.errors.MixedBackendError, match="scalar.*numpy|numpy.*scalar"):
        a + b
    with pytest.raises(pg.errors.MixedBackendError, match="scalar.*numpy|numpy.*scalar"):
        a @ pg.tensor([[1.0]], backend="numpy")
    c = a.to("numpy")
    assert (c + b).backend == "numpy"
