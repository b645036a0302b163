"""What the recorded graph keeps alive: only the data a VJP will read (graph.saved_inputs), and
backward releases each forward tensor once its node has run.

Memory is measured with tracemalloc (numpy reports its array allocations to it), in units of one
N x F float32 block, so the assertions hold on any machine and say exactly which arrays are kept.
"""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

import polygrad as pg
import polygrad.nn  # noqa: F401  (pg.nn.dropout)
from polygrad.backends.numpy import branch_free_where
from polygrad.testing import check_grads

N, F = 20_000, 64
BLOCK = N * F * 4  # one N x F float32 array: 5 MB


def _chain(x, w1, b1, w2):
    """A GCN-like dense chain: (dropout(relu(x @ W1 + b1)) @ W2).sum()."""
    a = x @ w1 + b1
    r = a.relu()
    d = pg.nn.dropout(r, 0.5, training=True)
    return (d @ w2).sum()


def _leaves():
    rng = np.random.default_rng(0)
    x = pg.tensor(rng.standard_normal((N, F), dtype=np.float32))
    w1 = pg.tensor(rng.standard_normal((F, F), dtype=np.float32) * 0.1, requires_grad=True)
    b1 = pg.tensor(np.zeros(F, np.float32), requires_grad=True)
    w2 = pg.tensor(rng.standard_normal((F, 2), dtype=np.float32), requires_grad=True)
    return x, w1, b1, w2


def _traced(fn):
    """(memory still held after fn, peak during fn), both above what was held before, in blocks."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, (current - base) / BLOCK, (peak - base) / BLOCK


def test_forward_keeps_relu_output_dropout_mask_and_matmul_operand_only():
    leaves = _leaves()
    pg.manual_seed(0)
    loss, held, _ = _traced(lambda: _chain(*leaves))
    # kept: relu's output (its VJP reads it), the dropout mask (d = r * mask reads it for dr) and
    # the dropout output (read by d @ W2 for dW2); x @ W1 and x @ W1 + b1 are released -- 5
    # blocks before this change
    assert 2.9 < held < 3.3
    loss.backward()
    assert all(t.grad is not None for t in leaves[1:])


def test_backward_frees_forward_tensors_as_it_goes():
    leaves = _leaves()
    pg.manual_seed(0)
    _, held, peak = _traced(lambda: _chain(*leaves).backward())
    # at most relu's output, the mask, dL/dd and dL/dr alive at once (dL/da replaces dL/dd, a
    # 1/4-block bool mask on the side): 4 blocks and a bit, where keeping every forward input
    # until the end of backward peaked at 7
    assert peak < 4.6
    assert held < 0.1  # the forward's blocks were all released; the leaves' grads are tiny


def test_stand_ins_replace_only_unread_non_leaf_inputs():
    x = pg.tensor(np.ones((3, 4)), requires_grad=True)
    w = pg.tensor(np.ones((4, 4)), requires_grad=True)
    z = x @ w                      # matmul: x and w are leaves, kept as they are
    a = z + 1.0                    # add reads neither input: z becomes a stand-in
    r = a.relu()                   # relu reads its output, not a
    m = r * pg.tensor(np.full((3, 4), 2.0))  # mul: r is not read (the constant needs no grad)...
    assert z._node.inputs[0] is x and z._node.inputs[1] is w
    z_in = a._node.inputs[0]
    assert z_in is not z and z_in._data is None and z_in._node is z._node and z_in.shape == z.shape
    assert r._node.inputs[0]._data is None
    assert m._node.inputs[0] is r  # ...but relu's own VJP reads r, so it stays whole
    q = m + 1.0
    assert q._node.inputs[0]._data is None  # m's rule (mul) does not read its output


def test_output_read_by_own_rule_is_kept_whole():
    x = pg.tensor(np.linspace(-1, 1, 6), requires_grad=True)
    h = x * 3.0
    t = h.tanh()                   # tanh's VJP reads t itself
    s = t + 1.0                    # add reads nothing, but t must survive for tanh's VJP
    assert s._node.inputs[0] is t
    s.sum().backward()
    assert np.allclose(x.grad.numpy(), 3 * (1 - np.tanh(3 * np.linspace(-1, 1, 6)) ** 2))


@pytest.mark.parametrize("fn", [
    lambda x, w, b: ((x @ w + b).relu() * 2.0 + 1.0).sum(),
    lambda x, w, b: ((x @ w).relu() @ w.T + b[:4]).relu().sum(),
    lambda x, w, b: pg.where(x @ w > 0.1, (x @ w) * b, -(x @ w)).sum(),
    lambda x, w, b: ((x @ w).reshape(-1) + 1.0).relu().sum() + ((x @ w) * (x @ w)).sum(),
], ids=["relu-add-mul", "relu-twice", "where", "shared"])
def test_gradients_through_stand_ins_match_numerical(fn):
    rng = np.random.default_rng(1)
    check_grads(fn, [rng.standard_normal((5, 4)), rng.standard_normal((4, 6)), rng.standard_normal(6)])


def test_one_intermediate_read_by_one_consumer_and_not_another_gets_one_gradient():
    x = pg.tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    z = x * 2.0                    # non-leaf
    loss = (z + 1.0).sum() + (z * z).sum()   # ADD keeps a stand-in of z, MUL keeps z itself
    (gz,) = pg.grad(loss, [z], retain_graph=True)
    assert np.allclose(gz.numpy(), 1 + 2 * z.numpy())
    loss.backward()
    assert np.allclose(x.grad.numpy(), 2 * (1 + 2 * z.numpy()))


def test_retain_graph_backpropagates_through_stand_ins_twice():
    x = pg.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    loss = ((x * 3.0 + 1.0).relu() + 2.0).sum()
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    loss.backward()
    assert np.allclose(x.grad.numpy(), 2 * first)


def test_sparse_propagation_with_a_stand_in_operand_matches_numerical():
    # A @ (x @ W): the SpMM keeps x @ W as a stand-in (A's values need no gradient), and the
    # numpy backend's fused SpMM backward receives broadcast zeros in its place
    edge_index = np.array([[0, 1, 1, 2, 3, 3], [1, 0, 2, 3, 0, 3]])
    adj = pg.gcn_norm(pg.from_edge_index(edge_index, 4, dtype=pg.float64))
    xw_seen = []

    def fn(x, w):
        xw = x @ w
        out = adj @ xw
        xw_seen.append(out._node.inputs[1] if out._node is not None else None)
        return (out + 1.0).relu()

    rng = np.random.default_rng(2)
    check_grads(fn, [rng.standard_normal((4, 3)), rng.standard_normal((3, 2))])
    assert any(s is not None and s._data is None for s in xw_seen)


def test_double_backward_still_works_through_the_rules():
    x = pg.tensor(np.array([0.3, -0.7, 1.5]), requires_grad=True)
    y = ((x * x + 1.0).relu() * 2.0).sum()
    (g,) = pg.grad(y, [x], create_graph=True)
    (gg,) = pg.grad(g.sum(), [x])
    assert np.allclose(g.numpy(), 4 * x.numpy()) and np.allclose(gg.numpy(), 4.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("shapes", [((300, 256), (), (300, 256)), ((300, 256), (300, 256), ()),
                                    ((300, 256), (300, 256), (300, 256)), ((256,), (300, 256), (1, 256)),
                                    ((300, 1), (), (300, 256)), ((300, 256), (), ()),
                                    ((300, 256), (1,), (256,)), ((), (300, 256), (300, 256))])
def test_branch_free_where_is_bitwise_np_where(dtype, shapes):
    rng = np.random.default_rng(3)
    sc, sa, sb = shapes
    cond = np.asarray(rng.random(sc) < 0.5)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -2.0, 1e-45])
    if np.dtype(dtype).kind == "f":
        a, b = (rng.choice(specials, size=s).astype(dtype) for s in (sa, sb))
        zeros = (np.zeros(sa, dtype), -np.zeros(sa, dtype))
    else:
        a, b = (rng.integers(-9, 9, s).astype(dtype) for s in (sa, sb))
        zeros = (np.zeros(sa, dtype),)
    for first in (a, *zeros):
        got, want = branch_free_where(cond, first, b), np.where(cond, first, b)
        assert got.shape == want.shape and got.dtype == want.dtype and got.flags.writeable
        assert got.tobytes() == want.tobytes()
