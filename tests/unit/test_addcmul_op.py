"""``Op.ADDCMUL``: the fused form of ``input + tensor1 * tensor2`` (``GINConv``'s root term).

The promise is bitwise: output and every gradient are the composite's (MUL then ADD, the slow
path it replaces), whether the gradient comes from the backend's fused backward or the rule;
gradients also agree with central differences (float64), with PyTorch's addcmul, and GINConv
keeps PyG's gradients.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.ir.ops import FUSED, Op
from polygrad.runtime.registry import registry
from polygrad.tensor import addcmul
from polygrad.testing import check_grads
from tests.helpers import assert_bitwise, floats_with_specials, without_kernel

KEY = (Op.ADDCMUL, "dense")


def run(arrays: tuple, needs: tuple, seed: np.ndarray):
    """(output, gradients, the op the output came from) of ``addcmul`` on fresh leaves."""
    ts = [pg.tensor(a, requires_grad=n) for a, n in zip(arrays, needs)]
    y = addcmul(*ts)
    y.backward(pg.tensor(seed))
    return y.numpy(), [None if t.grad is None else t.grad.numpy() for t in ts], y._node.op


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30]


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n, m = draw(st.integers(0, 4)), draw(st.integers(1, 4))
    out = (n, m)
    smaller = st.sampled_from([(n, m), (m,), (1, m), (n, 1), (1,), ()])
    a_shape, b_shape = draw(st.sampled_from([(out, draw(smaller)), (draw(smaller), out)]))
    arrays = tuple(floats_with_specials(draw, shape, dtype, SPECIAL) for shape in (draw(smaller), a_shape, b_shape))
    needs = tuple(draw(st.lists(st.booleans(), min_size=3, max_size=3)))
    if not any(needs):
        needs = (True, True, True)
    return arrays, needs, floats_with_specials(draw, out, dtype, SPECIAL)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_fused_op_gives_the_composites_bits(problem):
    arrays, needs, seed = problem
    with np.errstate(all="ignore"):
        out, grads, op = run(arrays, needs, seed)  # fused forward, fused backward
        assert op == Op.ADDCMUL
        with without_kernel(registry.vjp_tables, KEY):  # fused forward, the rule's backward
            r_out, r_grads, _ = run(arrays, needs, seed)
        with without_kernel(registry.tables, KEY):  # the composite: MUL, ADD and their rules
            c_out, c_grads, c_op = run(arrays, needs, seed)
    assert c_op == Op.ADD
    for got in (out, r_out):
        assert_bitwise(got, c_out)
    for got in (grads, r_grads):
        for g, want in zip(got, c_grads):
            assert (g is None) == (want is None)
            if g is not None:
                assert_bitwise(g, want)


def test_the_composite_runs_where_the_op_would_differ():
    x = pg.tensor(np.ones((2, 3)), requires_grad=True)
    assert Op.ADDCMUL in FUSED
    assert addcmul(x, x, x)._node.op == Op.ADD           # x * x: the mul rule's own case
    big = pg.tensor(np.ones((4, 2, 3)))
    assert addcmul(big, x, x.detach())._node.op == Op.ADD  # the input broadcasts the product
    assert addcmul(x, x.detach(), pg.tensor(np.ones(3)))._node.op == Op.ADDCMUL


def test_gradient_matches_central_differences_float64():
    rng = np.random.default_rng(0)
    check_grads(addcmul, [rng.normal(size=(3,)), rng.normal(size=(4, 3)), rng.normal(size=(1,))],
                rtol=1e-7, atol=1e-9)


def test_gin_conv_runs_addcmul_with_pygs_eps_gradient():
    pg.manual_seed(0)
    conv = nn.GINConv(nn.Linear(2, 3), train_eps=True)
    x = pg.tensor(np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32), requires_grad=True)
    edges = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    y = conv(x, edges)
    assert y._node.inputs[1]._node.op == Op.ADDCMUL
    y.sum().backward()
    # d/d eps of sum(nn(out + (1 + eps) x)) = sum over nodes of (x W)_i . 1
    want = (x.numpy() @ conv.nn.weight.numpy()).sum()
    np.testing.assert_allclose(conv.eps.grad.numpy(), [want], rtol=1e-5)


def test_matches_pytorch_addcmul_float64():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: no comparison against torch.addcmul")
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(3,)), rng.normal(size=(5, 3)), rng.normal(size=(1,))]
    seed = rng.normal(size=(5, 3))
    out, grads, _ = run(tuple(arrays), (True, True, True), seed)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    yt = torch.addcmul(*ts)
    yt.backward(torch.tensor(seed))
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-12)
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)
