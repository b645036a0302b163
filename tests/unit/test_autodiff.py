"""The scheduler: order, accumulation, freeing, retain_graph, no_grad, pg.grad and higher order."""
from __future__ import annotations

import math
import sys
import weakref

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import GraphError, ShapeError


def test_shared_subexpression_accumulates(backend):
    x = pg.tensor(3.0, dtype=pg.float64, requires_grad=True, backend=backend)
    y = x * x          # used twice below
    z = y + y * x      # dz/dx = 2*2x... = 2x + 3x^2
    z.backward()
    assert x.grad.item() == pytest.approx(2 * 3 + 3 * 9)


def test_grad_accumulates_across_backward_calls():
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]


def test_second_backward_without_retain_graph_raises():
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward()
    with pytest.raises(GraphError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = pg.tensor([1.0, 2.0], dtype=pg.float64, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.exp([1.0, 2.0]))


def test_saved_tensors_are_freed_after_backward():
    x = pg.tensor(np.ones(3), requires_grad=True)
    h = x.exp()
    ref = weakref.ref(h)
    y = (h * 2).sum()
    del h
    assert ref() is not None          # kept alive by the graph
    y.backward()
    assert ref() is None              # freed as soon as its consumer's VJP ran


def test_backward_needs_scalar_or_explicit_grad():
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    with pytest.raises(GraphError, match="single-element"):
        y.backward()
    y.backward(pg.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(ShapeError):
        (x * 2).backward(pg.tensor([1.0]))


def test_backward_on_tensor_without_grad_raises():
    with pytest.raises(GraphError, match="does not require grad"):
        pg.tensor([1.0]).sum().backward()


def test_no_grad_records_nothing():
    x = pg.tensor([1.0], requires_grad=True)
    with pg.no_grad():
        y = x * 2
        assert not pg.is_grad_enabled()
    assert pg.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf


def test_detach_stops_gradient():
    x = pg.tensor([2.0], dtype=pg.float64, requires_grad=True)
    y = x * x.detach()
    y.sum().backward()
    assert x.grad.tolist() == [2.0]


def test_leaf_grad_keeps_leaf_dtype():
    x = pg.tensor([1.0, 2.0], dtype=pg.float32, requires_grad=True)
    w = pg.tensor([1.0, 2.0], dtype=pg.float64)
    (x * w).sum().backward()
    assert x.grad.dtype == pg.float32


def test_pg_grad_returns_without_accumulating():
    x = pg.tensor([1.0, 2.0], dtype=pg.float64, requires_grad=True)
    y = (x ** 3).sum()
    (gx,) = pg.grad(y, [x])
    assert x.grad is None
    np.testing.assert_allclose(gx.numpy(), [3.0, 12.0])


def test_pg_grad_unused_input():
    x = pg.tensor([1.0], requires_grad=True)
    z = pg.tensor([1.0], requires_grad=True)
    y = (x * 2).sum()
    with pytest.raises(GraphError, match="not used"):
        pg.grad(y, [x, z], retain_graph=True)
    gx, gz = pg.grad(y, [x, z], allow_unused=True)
    assert gz is None and gx.tolist() == [2.0]


def test_second_derivative_of_tanh_matches_numerical(backend):
    xs = np.array([-1.3, -0.2, 0.0, 0.7, 2.1])
    x = pg.tensor(xs, dtype=pg.float64, requires_grad=True, backend=backend)
    (g,) = pg.grad(x.tanh().sum(), [x], create_graph=True)
    (h,) = pg.grad(g.sum(), [x])
    eps = 1e-5
    d1 = lambda v: 1 - np.tanh(v) ** 2  # noqa: E731
    np.testing.assert_allclose(g.numpy(), d1(xs), rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), (d1(xs + eps) - d1(xs - eps)) / (2 * eps), rtol=1e-6, atol=1e-9)


def _mlp_loss(params, x, y):
    w1, b1, w2, b2 = params
    h = (x @ w1 + b1).tanh()
    out = h @ w2 + b2
    return ((out - y) ** 2).mean()


def test_hessian_vector_product_of_small_mlp_matches_numerical():
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (4, 1), (1,)]
    arrays = [rng.normal(size=s) for s in shapes]
    x = pg.tensor(rng.normal(size=(5, 3)), dtype=pg.float64)
    y = pg.tensor(rng.normal(size=(5, 1)), dtype=pg.float64)
    v = [rng.normal(size=s) for s in shapes]

    def grad_dot_v(arrs) -> float:
        ps = [pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in arrs]
        gs = pg.grad(_mlp_loss(ps, x, y), ps)
        return sum(float((g.numpy() * vi).sum()) for g, vi in zip(gs, v))

    params = [pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in arrays]
    grads = pg.grad(_mlp_loss(params, x, y), params, create_graph=True)
    gv = sum((g * pg.tensor(vi, dtype=pg.float64)).sum() for g, vi in zip(grads, v))
    hv = pg.grad(gv, params)
    eps = 1e-6
    for i, a in enumerate(arrays):
        num = np.zeros_like(a)
        for idx in np.ndindex(*a.shape):
            plus = [b.copy() for b in arrays]
            minus = [b.copy() for b in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            num[idx] = (grad_dot_v(plus) - grad_dot_v(minus)) / (2 * eps)
        np.testing.assert_allclose(hv[i].numpy(), num, rtol=1e-5, atol=1e-8)


def test_long_tensor_chain_backpropagates_without_recursion():
    x = pg.tensor(1.0, dtype=pg.float64, requires_grad=True)
    y = x
    n = 100_000
    for _ in range(n):
        y = y + 1e-6 * y
    assert sys.getrecursionlimit() < n
    y.backward()
    assert x.grad.item() == pytest.approx((1 + 1e-6) ** n, rel=1e-9)


def test_deterministic_results_run_to_run():
    def run():
        pg.manual_seed(1)
        w = pg.randn(8, 8, dtype=pg.float64, requires_grad=True)
        x = pg.randn(16, 8, dtype=pg.float64)
        loss = (x @ w).relu().softmax(-1).log().mean() + (w ** 2).sum()
        loss.backward()
        return loss.item(), w.grad.numpy().tobytes()
    assert run() == run()


def test_backward_finished_event_reports_the_pass():
    seen = []

    class Listener:
        @pg.hookimpl
        def polygrad_backward_finished(self, num_nodes, seconds, grads):
            seen.append((num_nodes, len(grads)))

    listener = Listener()
    pg.register_plugin(listener, name="test-listener")
    try:
        x = pg.tensor([1.0], requires_grad=True)
        (x.exp() * 2).sum().backward()
    finally:
        pg.unregister_plugin(listener)
    assert seen == [(3, 1)]
    assert math.isfinite(x.grad.item())


def test_pg_grad_wrt_an_intermediate_leaves_the_rest_of_the_graph_intact():
    x = pg.tensor([1.0, 2.0], dtype=pg.float64, requires_grad=True)
    h = x.exp()
    (gh,) = pg.grad(h.sum(), [h])
    assert gh.tolist() == [1.0, 1.0] and x.grad is None
    (h * 2).sum().backward()  # the exp node below h was neither run nor freed
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([1.0, 2.0]))


def test_a_node_says_its_op_and_whether_backward_freed_it():
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    assert repr(y._node) == "Node(sum, layout='dense', freed=False)"
    y.backward()
    assert repr(y._node) == "Node(sum, layout='dense', freed=True)"
