"""The numpy backend's fused MATMUL backward against the VJP rule it replaces, bit for bit.

``polygrad.backends.matmul_vjp`` makes the rule's kernel calls (reshape, permute, matmul, and
autodiff's unbroadcast sums) without dispatching them; every gradient must be the rule's exactly:
vector operands, batched and broadcast operands, either operand alone needing a gradient,
non-finite values.  The gradients also match numerical differentiation in float64, and
``create_graph`` (which needs the rule's differentiable ops) still differentiates twice.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.ir.ops import Op
from polygrad.runtime.registry import registry
from polygrad.testing.temporary import registry_snapshot

from tests.helpers import assert_bitwise, numerical_grads

KEY = (Op.MATMUL, "dense")


def _fused_kernel_registered() -> bool:
    registry.load()
    return KEY in registry.vjp_tables.get("numpy", {})


#: (a's shape, b's shape) from (n, k, m, batch): every operand form matmul accepts
FORMS = [
    lambda n, k, m, B: ((n, k), (k, m)),
    lambda n, k, m, B: ((k,), (k, m)),
    lambda n, k, m, B: ((n, k), (k,)),
    lambda n, k, m, B: ((k,), (k,)),
    lambda n, k, m, B: ((B, n, k), (k, m)),
    lambda n, k, m, B: ((n, k), (B, k, m)),
    lambda n, k, m, B: ((1, n, k), (B, k, m)),
    lambda n, k, m, B: ((B, n, k), (B, k, m)),
    lambda n, k, m, B: ((B, n, k), (k,)),
    lambda n, k, m, B: ((k,), (B, k, m)),
]

SPECIAL = st.sampled_from([0.0, -0.0, 1e300, -1e300, math.inf, -math.inf, math.nan])


def _array(draw: Any, shape: tuple, dtype: Any) -> np.ndarray:
    size = math.prod(shape)
    element = st.one_of(st.floats(-8, 8, width=32), SPECIAL) if draw(st.booleans()) else st.floats(-8, 8, width=32)
    values = np.asarray(draw(st.lists(element, min_size=size, max_size=size)), dtype=np.float64).reshape(shape)
    with np.errstate(over="ignore"):  # 1e300 is inf in float32
        return values.astype(dtype)


def _grads(a: np.ndarray, b: np.ndarray, needs: tuple, w: np.ndarray) -> list:
    ta = pg.tensor(a, requires_grad=needs[0])
    tb = pg.tensor(b, requires_grad=needs[1])
    with np.errstate(all="ignore"):
        out = ta @ tb
        (out * pg.tensor(w)).sum().backward()
    return [out.numpy().copy(), None if ta.grad is None else ta.grad.numpy().copy(),
            None if tb.grad is None else tb.grad.numpy().copy()]


@pytest.mark.skipif(not _fused_kernel_registered(), reason="the numpy backend registers no fused MATMUL backward")
@settings(max_examples=200, deadline=None)
@given(data=st.data(), form=st.sampled_from(FORMS), dims=st.tuples(*[st.integers(1, 4)] * 4),
       dtype=st.sampled_from([np.float64, np.float32]),
       needs=st.sampled_from([(True, True), (True, False), (False, True)]))
def test_fused_matmul_backward_is_the_rule_bit_for_bit(data: Any, form: Any, dims: tuple, dtype: Any,
                                                     needs: tuple) -> None:
    shape_a, shape_b = form(*dims)
    a, b = _array(data.draw, shape_a, dtype), _array(data.draw, shape_b, dtype)
    with np.errstate(all="ignore"):
        out_shape = np.matmul(a, b).shape
    w = _array(data.draw, out_shape, dtype)
    fused = _grads(a, b, needs, w)
    with registry_snapshot():
        del registry.vjp_tables["numpy"][KEY]  # autodiff falls back on the VJP rule
        rule = _grads(a, b, needs, w)
    assert_bitwise(fused, rule)


def test_backward_calls_the_fused_kernel() -> None:
    calls = []
    fused = registry.vjp_tables["numpy"][KEY]

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["needs"])
        return fused(*args, **kwargs)

    with registry_snapshot():
        registry.vjp_tables["numpy"][KEY] = counting
        a, b = pg.tensor(np.ones((2, 3)), requires_grad=True), pg.tensor(np.ones((3, 2)))
        (a @ b).sum().backward()
    assert calls == [(True, False)]
    assert a.grad.numpy().tolist() == [[2.0] * 3] * 2


def test_large_products_take_the_pooled_kernel_and_still_match_the_rule() -> None:
    rng = np.random.default_rng(0)
    a, b, w = rng.normal(size=(700, 64)), rng.normal(size=(64, 48)), rng.normal(size=(700, 48))
    fused = _grads(a, b, (True, True), w)
    with registry_snapshot():
        del registry.vjp_tables["numpy"][KEY]
        rule = _grads(a, b, (True, True), w)
    assert_bitwise(fused, rule)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 2)), ((4,), (4, 3)), ((3, 4), (4,)), ((2, 3, 4), (4, 2)),
                                    ((1, 3, 4), (2, 4, 2))])
def test_gradients_match_numerical_differentiation(shapes: tuple) -> None:
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=s) for s in shapes]
    w = rng.normal(size=np.matmul(*arrays).shape)
    ta, tb = (pg.tensor(x, requires_grad=True) for x in arrays)
    (ta @ tb * pg.tensor(w)).sum().backward()
    num = numerical_grads(lambda x, y: x @ y, arrays, "numpy", weights=w)
    np.testing.assert_allclose(ta.grad.numpy(), num[0], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(tb.grad.numpy(), num[1], rtol=1e-7, atol=1e-9)


def test_create_graph_still_differentiates_twice() -> None:
    # d/da sum((a @ b)^2) = 2 (a @ b) b^T; its gradient wrt b of sum(.) needs the rule's ops
    rng = np.random.default_rng(2)
    a_np, b_np = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    a, b = pg.tensor(a_np, requires_grad=True), pg.tensor(b_np, requires_grad=True)
    (ga,) = pg.grad(((a @ b) ** 2).sum(), [a], create_graph=True)
    assert ga.requires_grad
    ga.sum().backward()
    num = numerical_grads(lambda x, y: (2 * ((x @ y) @ y.T)).sum(), [a_np, b_np], "numpy")
    np.testing.assert_allclose(b.grad.numpy(), num[1], rtol=1e-6, atol=1e-8)
