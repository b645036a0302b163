"""``Op.ADDMM``: the fused form of ``mat1 @ mat2 + input`` (``nn.Linear``).

The promise is bitwise: output and every gradient are the composite's (MATMUL then ADD, the
slow path it replaces), whether the gradient comes from the backend's fused backward or the
rule; gradients also agree with central differences (float64) and with PyTorch's addmm.
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
from polygrad.tensor import addmm
from polygrad.testing import check_grads
from tests.helpers import assert_bitwise, floats_with_specials, without_kernel

KEY = (Op.ADDMM, "dense")


def run(arrays: tuple, needs: tuple, seed: np.ndarray):
    """(output, gradients, the op the output came from) of ``addmm`` on fresh leaves."""
    ts = [pg.tensor(a, requires_grad=n) for a, n in zip(arrays, needs)]
    y = addmm(*ts)
    y.backward(pg.tensor(seed))
    return y.numpy(), [None if t.grad is None else t.grad.numpy() for t in ts], y._node.op


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30]


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n, k, m = draw(st.integers(0, 5)), draw(st.integers(0, 4)), draw(st.integers(1, 4))
    bias_shape = draw(st.sampled_from([(m,), (1, m), (n, m), (n, 1), ()]))
    arrays = tuple(floats_with_specials(draw, shape, dtype, SPECIAL) for shape in (bias_shape, (n, k), (k, m)))
    needs = tuple(draw(st.lists(st.booleans(), min_size=3, max_size=3)))
    if not any(needs):
        needs = (True, True, True)
    return arrays, needs, floats_with_specials(draw, (n, m), dtype, SPECIAL)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_fused_op_gives_the_composites_bits(problem):
    arrays, needs, seed = problem
    with np.errstate(all="ignore"):
        out, grads, op = run(arrays, needs, seed)  # fused forward, fused backward
        assert op == Op.ADDMM
        with without_kernel(registry.vjp_tables, KEY):  # fused forward, the rule's backward
            r_out, r_grads, _ = run(arrays, needs, seed)
        with without_kernel(registry.tables, KEY):  # the composite: MATMUL, ADD and their rules
            c_out, c_grads, c_op = run(arrays, needs, seed)
    assert c_op == Op.ADD
    for got in (out, r_out):
        assert_bitwise(got, c_out)
    for got in (grads, r_grads):
        for g, want in zip(got, c_grads):
            assert (g is None) == (want is None)
            if g is not None:
                assert_bitwise(g, want)


def test_linear_runs_addmm_and_keeps_its_forms():
    lin = nn.Linear(3, 2)
    x = pg.tensor(np.ones((4, 3), dtype=lin.weight.dtype))
    assert lin(x)._node.op == Op.ADDMM and Op.ADDMM in FUSED
    assert nn.Linear(3, 2, bias=False)(x.requires_grad_())._node.op == Op.MATMUL
    batch = pg.tensor(np.ones((2, 4, 3), dtype=lin.weight.dtype))
    assert lin(batch).shape == (2, 4, 2) and lin(batch)._node.op == Op.ADD  # a batch: the composite
    with without_kernel(registry.tables, KEY):
        assert lin(x)._node.op == Op.ADD


def test_gradient_matches_central_differences_float64():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(3,)), rng.normal(size=(5, 4)), rng.normal(size=(4, 3))]
    check_grads(addmm, arrays, rtol=1e-7, atol=1e-9)
    check_grads(addmm, [rng.normal(size=(5, 1)), *arrays[1:]], rtol=1e-7, atol=1e-9)


def test_second_order_through_the_rule():
    rng = np.random.default_rng(1)
    b, x, w = (pg.tensor(rng.normal(size=s), requires_grad=True) for s in ((2,), (3, 4), (4, 2)))
    (gx,) = pg.grad((addmm(b, x, w) ** 2).sum(), x, create_graph=True)
    gx.sum().backward()  # d/dw of sum(2 (xw + b) w^T)
    want_w = 2 * (x.numpy().sum(0)[:, None] @ w.numpy().sum(0)[None, :]
                  + np.ones((4, 1)) @ (x.numpy() @ w.numpy() + b.numpy()).sum(0)[None, :])
    np.testing.assert_allclose(w.grad.numpy(), want_w, rtol=1e-12)


def test_bad_operands_are_named():
    a = pg.tensor(np.ones((3, 2)))
    with pytest.raises(pg.errors.ShapeError, match="inner dimensions"):
        addmm(pg.tensor(np.ones(2)), a, pg.tensor(np.ones((3, 2))))
    with pytest.raises(pg.errors.ShapeError):
        addmm(pg.tensor(np.ones((4, 2))), a, pg.tensor(np.ones((2, 2))))


def test_matches_pytorch_addmm_float64():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: no comparison against torch.addmm")
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(3,)), rng.normal(size=(5, 4)), rng.normal(size=(4, 3))]
    seed = rng.normal(size=(5, 3))
    out, grads, _ = run(tuple(arrays), (True, True, True), seed)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    yt = torch.addmm(*ts)
    yt.backward(torch.tensor(seed))
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-12)
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)
