"""The Tensor front end's fast paths against the slow paths they shortcut, bit for bit.

``a + b``, ``a * b``, ``a @ b`` on two plain dense tensors, and ``+``, ``-``, ``*`` between a float
tensor and a Python int or float, go straight to the primitive (skipping the sparse checks and the
operand wrapping of :func:`polygrad.tensor.add` and friends); Python-number operands are cached
0-d constants; ``x.sum()`` / ``x.mean()`` skip the PyTorch-name wrapper and share the attributes
of a reduction over all axes.  Each must give what the slow path gives: the same values, dtype,
shape, graph (op, requires_grad) and gradients, or the same error.
"""
from __future__ import annotations

import importlib
import math
import operator
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.engine.dispatch import apply
from polygrad.engine.inference import normalize_axes
from polygrad.ir.ops import Op
from polygrad.tensor.linalg import matmul as slow_matmul

from tests.helpers import assert_bitwise

E = importlib.import_module("polygrad.tensor.elementwise")  # (pg.tensor is the function)

DTYPES = [np.float64, np.float32, np.int64]
SHAPES = [(), (3,), (2, 3), (1, 3), (2, 1)]
SCALARS = st.one_of(st.integers(-5, 5), st.integers(-2**70, 2**70), st.sampled_from([True, False]),
                    st.floats(allow_nan=True, allow_infinity=True, width=64),
                    st.sampled_from([0.0, -0.0, 1.0, 1e-4, math.nan, -math.inf]))

#: (dunder, the slow function the dunder stood for before its fast path, operands swapped?)
BINARY: list[tuple[Callable, Callable, bool]] = [
    (operator.add, E.add, False), (operator.mul, E.mul, False), (operator.sub, E.sub, False),
    (lambda a, b: b + a, E.add, True), (lambda a, b: b * a, E.mul, True), (lambda a, b: b - a, E.sub, True),
]


def _tensor(draw: Any, dtype: Any, shape: tuple, grad: bool) -> pg.Tensor:
    values = np.asarray(draw(st.lists(st.integers(-4, 4), min_size=math.prod(shape), max_size=math.prod(shape))))
    arr = values.reshape(shape).astype(dtype) * (0.75 if np.dtype(dtype).kind == "f" else 1)
    return pg.tensor(arr, requires_grad=grad and np.dtype(dtype).kind == "f")


def _outcome(fn: Callable[[], pg.Tensor], leaves: list) -> Any:
    """What a computation shows: values, dtype, shape, requires_grad, op, then every leaf's gradient
    after backpropagating through the result (or the error, as type and message)."""
    for leaf in leaves:
        leaf.grad = None
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the slow path's error must be the fast path's
        return f"{type(exc).__name__}: {exc}"
    seen: list = [out.numpy().copy(), str(out.dtype), list(out.shape), out.requires_grad, str(out.op)]
    if out.requires_grad:
        (out * out).sum().backward()
        seen += [None if leaf.grad is None else leaf.grad.numpy().copy() for leaf in leaves]
    return seen


@st.composite
def tensor_pairs(draw: Any) -> tuple:
    dtype_a, dtype_b = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
    a = _tensor(draw, dtype_a, draw(st.sampled_from(SHAPES)), draw(st.booleans()))
    b = _tensor(draw, dtype_b, draw(st.sampled_from(SHAPES)), draw(st.booleans()))
    return a, b


@settings(max_examples=150, deadline=None)
@given(tensor_pairs(), st.sampled_from(range(len(BINARY))), st.booleans())
def test_dense_operands_equal_the_slow_path(pair: tuple, k: int, grad_mode: bool) -> None:
    a, b = pair
    dunder, slow, swapped = BINARY[k]
    leaves = [t for t in (a, b) if t.requires_grad]
    with pg.enable_grad() if grad_mode else pg.no_grad():
        fast = _outcome(lambda: dunder(a, b), leaves)
        reference = _outcome(lambda: slow(b, a) if swapped else slow(a, b), leaves)
    assert_bitwise(fast, reference, f"{dunder} {a.dtype}{a.shape} {b.dtype}{b.shape}")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(SHAPES), st.booleans(), SCALARS,
       st.sampled_from(range(len(BINARY))), st.data())
def test_python_number_operands_equal_the_slow_path(dtype: Any, shape: tuple, grad: bool, x: Any, k: int,
                                                     data: Any) -> None:
    a = _tensor(data.draw, dtype, shape, grad)
    dunder, slow, swapped = BINARY[k]
    leaves = [a] if a.requires_grad else []
    fast = _outcome(lambda: dunder(a, x), leaves)
    E._CONSTANTS.clear()  # the slow path builds its constant afresh
    reference = _outcome(lambda: slow(x, a) if swapped else slow(a, x), leaves)
    assert_bitwise(fast, reference, f"{dunder} {a.dtype}{a.shape} and {x!r}")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(2, 3), (3,), (3, 2)]), st.sampled_from([(3, 2), (3,), (2, 4)]), st.booleans())
def test_dense_matmul_equals_the_slow_path(shape_a: tuple, shape_b: tuple, grad: bool) -> None:
    rng = np.random.default_rng(0)
    a = pg.tensor(rng.normal(size=shape_a), requires_grad=grad)
    b = pg.tensor(rng.normal(size=shape_b), requires_grad=True)
    leaves = [t for t in (a, b) if t.requires_grad]
    assert_bitwise(_outcome(lambda: a @ b, leaves), _outcome(lambda: slow_matmul(a, b), leaves), f"{shape_a}@{shape_b}")


def test_sparse_operands_still_take_the_sparse_path() -> None:
    dense = pg.tensor(np.array([[1.0, 0.0], [0.0, 2.0]]), requires_grad=True)
    sparse = pg.tensor(np.array([[0.0, 3.0], [4.0, 0.0]])).to_sparse()
    matmuls = [(operator.matmul, slow_matmul, False), (lambda a, b: b @ a, slow_matmul, True)]
    for dunder, slow, swapped in BINARY + matmuls:
        for a, b in [(dense, sparse), (sparse, dense), (sparse, 2.0), (sparse, 2)]:
            try:
                fast = dunder(a, b)
            except Exception as exc:  # noqa: BLE001 - then the slow path raises the same
                with pytest.raises(type(exc)):
                    slow(b, a) if swapped else slow(a, b)
                continue
            reference = slow(b, a) if swapped else slow(a, b)
            assert type(fast) is type(reference) and fast.layout == reference.layout
            assert_bitwise(fast.to_dense().numpy(), reference.to_dense().numpy(), f"{dunder} {a.layout} {b!r:.20}")


def _constant_fresh(x: Any, dtype: Any) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


@settings(max_examples=100, deadline=None)
@given(SCALARS, st.sampled_from([np.float64, np.float32, np.int64]))
def test_cached_constants_are_the_numbers_they_stand_for(x: Any, dtype: Any) -> None:
    if type(x) is bool or (type(x) is float and np.dtype(dtype).kind != "f"):
        return  # not a constant the front end caches for this dtype
    be = pg.tensor([1.0])._be
    try:
        fresh = _constant_fresh(x, dtype)
    except OverflowError:
        with pytest.raises(pg.errors.DTypeError):
            E._constant(x, np.dtype(dtype), be)
        return
    for _ in range(2):  # made, then (where kept) found in the table
        c = E._constant(x, np.dtype(dtype), be)
        assert c.shape == () and c.dtype == np.dtype(dtype) and not c.requires_grad and c._node is None
        assert_bitwise(c.numpy(), fresh, repr(x))


def test_float_zeros_and_nan_are_not_shared_with_other_values() -> None:
    be = pg.tensor([1.0])._be
    f64 = np.dtype(np.float64)
    assert np.signbit(E._constant(-0.0, f64, be).numpy()) and not np.signbit(E._constant(0.0, f64, be).numpy())
    assert not np.signbit(E._constant(0.0, f64, be).numpy()) and np.signbit(E._constant(-0.0, f64, be).numpy())
    x = pg.tensor(np.array([1.0, -1.0]))
    for _ in range(2):
        assert_bitwise((x * -0.0).numpy(), np.array([1.0, -1.0]) * -0.0, "x * -0.0")
        assert_bitwise((x * 0.0).numpy(), np.array([1.0, -1.0]) * 0.0, "x * 0.0")
    assert math.isnan(E._constant(math.nan, f64, be).item())
    for kind, value, _, _ in E._CONSTANTS:  # neither kept (-0.0 == 0.0 and NaN != NaN as keys)
        assert not (kind is float and (value == 0.0 or value != value)), value


def test_the_constant_table_stays_bounded() -> None:
    x = pg.tensor([1.0])
    for i in range(3 * E._MAX_CONSTANTS):
        x * (i + 0.5)
    assert len(E._CONSTANTS) <= E._MAX_CONSTANTS


def test_training_leaves_the_shared_constants_unchanged() -> None:
    """The constants a step shares (1, 0.5, 1e-4, a mean's 1/n) hold their values after forward,
    backward and optimizer steps: nothing writes into an operand's array."""
    E._CONSTANTS.clear()
    rng = np.random.default_rng(0)
    w = pg.tensor(rng.normal(size=(3, 2)), requires_grad=True)
    x = pg.tensor(rng.normal(size=(5, 3)))
    opt = pg.optim.SGD([w], lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        loss = (1 - (x @ w) * 0.5).relu().mean() + 1e-4 * (w * w).sum() + 0
        loss.backward()
        opt.step()
    assert E._CONSTANTS
    for (kind, value, dtype, _), t in E._CONSTANTS.items():
        assert_bitwise(t.numpy(), np.asarray(kind(value), dtype=dtype), repr(value))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([(), (3,), (2, 3), (2, 1, 3)]), st.booleans(), st.data())
def test_sum_and_mean_methods_equal_the_primitive(shape: tuple, keepdims: bool, data: Any) -> None:
    x = pg.tensor(np.arange(math.prod(shape), dtype=np.float64).reshape(shape) * 0.3, requires_grad=True)
    axis = data.draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    ref_attrs = {"axes": normalize_axes(Op.SUM, axis, x.ndim), "keepdims": keepdims}
    ref_sum = apply(Op.SUM, (x,), ref_attrs)
    count = math.prod(x.shape[a] for a in ref_attrs["axes"])
    ref_mean = E.mul(ref_sum, 1.0 / count if count else math.nan)
    for got, want in [(x.sum(axis, keepdims), ref_sum), (x.sum(dim=axis, keepdim=keepdims), ref_sum),
                      (pg.sum(x, axis, keepdims), ref_sum), (x.mean(axis, keepdims), ref_mean),
                      (x.mean(dim=axis, keepdim=keepdims), ref_mean), (pg.mean(x, axis, keepdims), ref_mean)]:
        assert_bitwise(got.numpy(), want.numpy(), f"axis={axis} keepdims={keepdims}")
        assert got._node.attrs == want._node.attrs and got.op == want.op


def test_reductions_over_all_axes_share_their_attributes() -> None:
    """One attrs dict per (op, ndim, keepdims): pg.compile's forward plan matches it by identity."""
    a, b = pg.tensor(np.ones((2, 3)), requires_grad=True), pg.tensor(np.zeros((4, 5)), requires_grad=True)
    assert a.sum()._node.attrs is b.sum()._node.attrs
    assert a.sum()._node.attrs == {"axes": (0, 1), "keepdims": False}
    assert a.sum(keepdims=True)._node.attrs is not a.sum()._node.attrs
    assert a.sum(axis=0)._node.attrs is not a.sum(axis=0)._node.attrs  # other axes: built per call
