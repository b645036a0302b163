"""``A @ X`` with both operands sparse goes through the cost model (issue 11): the sparse product
when its partial products are few, the right operand densified (compiled SpMM) when they would
cost more; the monitor reports which, and both paths give the dense product's values and grads."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.sparse import ops as sparse_ops
from polygrad.testing import check_grads


def _graph(n, deg, seed=0):
    rng = np.random.default_rng(seed)
    return pg.gcn_norm(pg.from_edge_index(rng.integers(0, n, (2, n * deg)), n, dtype=pg.float64))


def _bag_of_words(n, words, per_row, seed=1):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    return pg.sparse_coo(np.stack([rows, rng.integers(0, words, n * per_row)]),
                         rng.random(n * per_row), (n, words))


def test_bag_of_words_features_are_densified_and_the_monitor_says_why():
    a, x = _graph(300, 4), _bag_of_words(300, 200, 30)  # ~5 x 30 products per row: dense wins
    with pg.monitor() as m:
        out = a @ x
        assert m.current.layouts["matmul->dense"] == 1
        assert "partial products" in m.current.layout_reasons["matmul->dense"]
    assert not pg.is_sparse(out)
    np.testing.assert_allclose(out.numpy(), a.numpy() @ x.numpy(), rtol=1e-12, atol=1e-12)


def test_few_partial_products_stay_sparse():
    a = _graph(400, 1)
    x = _bag_of_words(400, 5000, 1)  # one product per nonzero of A: far cheaper than 5000-wide rows
    out = a @ x
    assert pg.is_sparse(out)
    np.testing.assert_allclose(out.numpy(), a.numpy() @ x.numpy(), rtol=1e-12, atol=1e-12)


def test_memory_budget_keeps_the_sparse_path(monkeypatch):
    a, x = _graph(300, 4), _bag_of_words(300, 200, 30)
    monkeypatch.setattr(pg.memory, "fits", lambda nbytes, backend=None: False)
    assert pg.is_sparse(a @ x)


def test_cost_constant_decides(monkeypatch):
    a, x = _graph(300, 4), _bag_of_words(300, 200, 30)
    monkeypatch.setattr(sparse_ops, "SPGEMM_COST_PER_PRODUCT", 1e-6)  # products ~free: stay sparse
    assert pg.is_sparse(a @ x)


@pytest.mark.parametrize("cost", [1e-6, 1e6])
def test_both_paths_differentiate_like_the_dense_product(monkeypatch, cost):
    monkeypatch.setattr(sparse_ops, "SPGEMM_COST_PER_PRODUCT", cost)
    monkeypatch.setattr(pg.config, "sparse_min_elements", 0)
    a, x = _graph(12, 2), _bag_of_words(12, 7, 3)

    def f(av, xv):
        return (a.with_values(av) @ x.with_values(xv)).sum() if cost < 1 else \
            (a.with_values(av) @ x.with_values(xv)).tanh().sum()

    check_grads(f, [a.values.numpy(), x.values.numpy()])
