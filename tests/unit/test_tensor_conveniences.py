"""PyTorch conveniences PyG code uses: t(), nonzero(), new_zeros/new_ones/new_full/new_empty,
f"{loss:.4f}", masked_fill / index_put (out of place, differentiable) and the error of x[i] = v.

Values against numpy references; gradients against central differences; and, where torch is
installed, against PyTorch itself (the same results, the same errors)."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import DTypeError, GraphError, ShapeError
from polygrad.testing import check_grads

try:
    import torch
except ImportError:  # the torch comparisons skip; the rest runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: nothing to compare with")


def _data(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def test_t_transposes_2d_and_keeps_lower_ranks():
    a = _data(3, 4)
    np.testing.assert_array_equal(pg.tensor(a).t().numpy(), a.T)
    assert pg.tensor(_data(5)).t().shape == (5,)
    assert pg.tensor(2.0).t().shape == ()
    with pytest.raises(ShapeError, match="<= 2 dimensions"):
        pg.tensor(_data(2, 3, 4)).t()
    check_grads(lambda x: x.t() * pg.tensor(_data(4, 3, seed=1)), [a])


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 2)])
def test_nonzero_matches_numpy_and_torch(shape):
    a = np.round(_data(*shape)) if shape else np.array(1.0)
    x = pg.tensor(a)
    idx = x.nonzero()
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx.numpy(), np.argwhere(a))
    parts = x.nonzero(as_tuple=True)
    assert isinstance(parts, tuple)
    if torch is not None:
        t = torch.tensor(a)
        np.testing.assert_array_equal(idx.numpy(), t.nonzero().numpy())
        theirs = t.nonzero(as_tuple=True)
        assert len(parts) == len(theirs)
        for p, q in zip(parts, theirs):
            np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_nonzero_of_a_zero_scalar_and_a_bool_mask():
    assert pg.tensor(0.0).nonzero().shape == (0, 0)
    assert pg.tensor(3.0).nonzero().shape == (1, 0)
    assert [p.numpy().tolist() for p in pg.tensor(0.0).nonzero(as_tuple=True)] == [[]]
    mask = pg.tensor(np.array([True, False, True]))
    assert mask.nonzero(as_tuple=True)[0].numpy().tolist() == [0, 2]


def test_new_tensors_take_dtype_and_backend_from_self():
    x = pg.tensor(_data(2, 3), dtype=pg.float64, backend="scalar")
    for made, value in [(x.new_zeros(2, 3), 0.0), (x.new_zeros((4,)), 0.0), (x.new_ones(3), 1.0),
                        (x.new_full((2, 2), 7.5), 7.5), (x.new_empty(2), 0.0)]:
        assert made.dtype == np.float64 and made.backend == "scalar"
        assert (made.numpy() == value).all()
    assert x.new_ones(2, dtype="int64").dtype == np.int64
    assert pg.tensor([1, 2]).new_zeros(2).dtype == np.int64  # an int tensor's dtype, as PyTorch
    assert x.new_zeros(2, requires_grad=True).requires_grad
    with pytest.raises(DTypeError):
        x.new_zeros(2.5)


def test_format_spec_formats_a_0d_tensor_as_its_number():
    loss = pg.tensor(0.123456, dtype=pg.float64)
    assert f"{loss:.4f}" == "0.1235"
    assert f"{pg.tensor(3):>4d}" == "   3"
    assert f"{loss}" == "0.123456"
    assert f"{pg.tensor([1.0, 2.0])}" == str(pg.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="Tensor.__format__"):
        f"{pg.tensor([1.0, 2.0]):.4f}"
    with pytest.raises(TypeError, match="Tensor.__format__"):
        f"{pg.tensor([1.0]):.4f}"  # one element but 1-d: PyTorch refuses too


@needs_torch
@pytest.mark.parametrize("value", [0.5, [1.5], [1.0, 2.0]])
def test_format_agrees_with_torch(value):
    ours, theirs = pg.tensor(value, dtype=pg.float64), torch.tensor(value, dtype=torch.float64)
    for spec in (".3f", ""):
        try:
            want = format(theirs, spec)
        except TypeError:
            with pytest.raises(TypeError):
                format(ours, spec)
            continue
        if spec:
            assert format(ours, spec) == want


def test_setitem_says_what_to_use_instead():
    x = pg.tensor(_data(3, 2))
    with pytest.raises(GraphError, match=r"masked_fill.*pg\.where.*index_put"):
        x[x.numpy() > 0] = 0
    with pytest.raises(RuntimeError):  # a GraphError is a RuntimeError
        x[0] = 1.0


def test_masked_fill_values_broadcast_and_gradients():
    a = _data(3, 4)
    mask = a > 0.3
    out = pg.tensor(a).masked_fill(mask, -1.0)
    np.testing.assert_array_equal(out.numpy(), np.where(mask, -1.0, a))
    row_mask = np.array([True, False, False, True])  # broadcast over rows, as PyTorch
    np.testing.assert_array_equal(pg.tensor(a).masked_fill(row_mask, 0.0).numpy(), np.where(row_mask, 0.0, a))
    check_grads(lambda x: x.masked_fill(mask, 2.0), [a])
    check_grads(lambda x, v: pg.tensor(a).masked_fill(mask, v) * x, [a, np.array(0.7)])  # a 0-d tensor value
    assert pg.tensor([1, 2, 3]).masked_fill(np.array([True, False, True]), 0).dtype == np.int64
    with pytest.raises(DTypeError, match="bool"):
        pg.tensor(a).masked_fill(np.ones((3, 4)), 0.0)
    with pytest.raises(ShapeError, match="0-d"):
        pg.tensor(a).masked_fill(mask, pg.tensor([1.0, 2.0]))


def test_index_put_overwrites_accumulates_and_differentiates():
    a = _data(4, 3)
    rows, cols = np.array([0, 2, 3]), np.array([1, 1, 0])
    vals = _data(3, seed=1)
    want = a.copy()
    want[rows, cols] = vals
    np.testing.assert_array_equal(pg.tensor(a).index_put((rows, cols), pg.tensor(vals)).numpy(), want)
    rep = np.array([0, 2, 0])
    want_acc = a.copy()
    np.add.at(want_acc, rep, 1.5)
    np.testing.assert_allclose(pg.tensor(a).index_put([rep], 1.5, accumulate=True).numpy(), want_acc)
    mask = a > 0
    want_mask = np.where(mask, 0.0, a)
    np.testing.assert_array_equal(pg.tensor(a).index_put((pg.tensor(mask),), 0.0).numpy(), want_mask)
    row_vals = _data(3, seed=2)  # one row of values for every selected row
    want_rows = a.copy()
    want_rows[[1, 3]] = row_vals
    np.testing.assert_array_equal(pg.tensor(a).index_put((np.array([1, 3]),), pg.tensor(row_vals)).numpy(), want_rows)
    check_grads(lambda x, v: x.index_put((rows, cols), v), [a, vals])
    check_grads(lambda x, v: x.index_put((rep,), v, accumulate=True), [a, _data(3, 3, seed=3)])
    with pytest.raises(ShapeError, match="more than once"):
        pg.tensor(a).index_put((rep,), 1.0)
    with pytest.raises(ShapeError, match="do not broadcast"):
        pg.tensor(a).index_put((rows, cols), pg.tensor(_data(4)))


@needs_torch
def test_masked_fill_and_index_put_agree_with_torch():
    a = _data(5, 3)
    mask = a < 0
    t = torch.tensor(a, requires_grad=True)
    x = pg.tensor(a, requires_grad=True)
    rows, cols = np.array([4, 0, 2]), np.array([2, 2, 0])
    vals = _data(3, seed=4)
    tv, pv = torch.tensor(vals, requires_grad=True), pg.tensor(vals, requires_grad=True)
    theirs = (t.masked_fill(torch.tensor(mask), 3.0).index_put((torch.tensor(rows), torch.tensor(cols)), tv)
              .index_put((torch.tensor(rows),), torch.tensor(1.0, dtype=torch.float64), accumulate=True))
    ours = x.masked_fill(mask, 3.0).index_put((rows, cols), pv).index_put((rows,), 1.0, accumulate=True)
    np.testing.assert_array_equal(ours.numpy(), theirs.detach().numpy())
    g = _data(5, 3, seed=5)
    (theirs * torch.tensor(g)).sum().backward()
    (ours * pg.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(pv.grad.numpy(), tv.grad.numpy(), rtol=1e-12)
