"""Tensor construction, dtypes, methods and error messages."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import DTypeError, IndexOutOfRangeError, ShapeError


def test_default_dtypes_follow_pytorch():
    assert pg.tensor([1.0, 2.0]).dtype == pg.float32
    assert pg.tensor([1, 2]).dtype == pg.int64
    assert pg.tensor([True]).dtype == pg.bool_
    assert pg.tensor(np.zeros(2)).dtype == pg.float64  # numpy arrays keep their dtype
    assert pg.tensor([1.0], dtype=pg.float64).dtype == pg.float64
    assert pg.zeros(2, 3).shape == (2, 3) and pg.ones((2,)).dtype == pg.float32
    assert pg.full((2,), 7).dtype == pg.int64
    assert pg.arange(4).tolist() == [0, 1, 2, 3]


def test_manual_seed_makes_random_reproducible():
    pg.manual_seed(3)
    a = pg.randn(4).numpy()
    b = pg.rand(4).numpy()
    pg.manual_seed(3)
    assert np.array_equal(a, pg.randn(4).numpy()) and np.array_equal(b, pg.rand(4).numpy())
    assert ((b >= 0) & (b < 1)).all()


def test_python_scalars_adopt_the_tensor_dtype():
    x = pg.tensor([1.0, 2.0])
    assert (x * 2).dtype == pg.float32 and (2.5 - x).dtype == pg.float32
    i = pg.tensor([1, 2])
    assert (i * 0.5).dtype == pg.float32 and (i * 0.5).tolist() == [0.5, 1.0]
    assert (i + 1).dtype == pg.int64


def test_operators_and_methods_match_numpy():
    a = np.arange(6, dtype=np.float64).reshape(2, 3) - 2.5
    t = pg.tensor(a)
    np.testing.assert_allclose((t ** 2).numpy(), a ** 2)
    np.testing.assert_allclose((1 / (t + 10)).numpy(), 1 / (a + 10))
    np.testing.assert_allclose(t.T.numpy(), a.T)
    np.testing.assert_allclose(t.softmax(-1).numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True))
    np.testing.assert_allclose(t.log_softmax(-1).numpy(), a - np.log(np.exp(a).sum(-1, keepdims=True)))
    np.testing.assert_allclose(t.mean(0).numpy(), a.mean(0))
    np.testing.assert_allclose(t.min(1).numpy(), a.min(1))
    np.testing.assert_allclose(t.abs().numpy(), np.abs(a))
    np.testing.assert_allclose(t.sigmoid().numpy(), 1 / (1 + np.exp(-a)))
    np.testing.assert_allclose(pg.logsumexp(t, 1).numpy(), np.log(np.exp(a).sum(1)))
    assert t.argmax(1).tolist() == [2, 2]
    assert t.reshape(-1).shape == (6,) and t.unsqueeze(0).shape == (1, 2, 3) and t.flatten().shape == (6,)
    assert t[None, 1, ...].shape == (1, 3) and t[t > 0].tolist() == [0.5, 1.5, 2.5]


def test_cross_entropy_matches_manual_computation():
    logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]])
    target = np.array([0, 2])
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = -logp[[0, 1], target].mean()
    assert pg.cross_entropy(pg.tensor(logits), target).item() == pytest.approx(expected)
    assert pg.cross_entropy(pg.tensor(logits), target, mask=np.array([True, False])).item() == \
        pytest.approx(-logp[0, 0])
    assert pg.mse(pg.tensor([1.0, 3.0]), pg.tensor([0.0, 0.0])).item() == pytest.approx(5.0)


def test_sigmoid_is_stable_for_large_inputs():
    x = pg.tensor([-1000.0, 0.0, 1000.0], dtype=pg.float64)
    assert x.sigmoid().tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("bad, error, pattern", [
    (lambda: pg.tensor([[1.0], [2.0, 3.0]]), (ShapeError, DTypeError), "tensor"),
    (lambda: pg.tensor(["a"]), DTypeError, "dtype"),
    (lambda: pg.ones(2, 3) @ pg.ones(2, 3), ShapeError, r"matmul.*\(2, 3\) @ \(2, 3\)"),
    (lambda: pg.ones(2, 3) + pg.ones(4), ShapeError, "add.*cannot be broadcast"),
    (lambda: pg.ones(2).reshape(3), ShapeError, "reshape"),
    (lambda: pg.ones(2)[5], IndexOutOfRangeError, "out of range"),
    (lambda: pg.tensor([1, 2]).exp().requires_grad_(), None, None),
    (lambda: pg.tensor([1, 2]).requires_grad_(), DTypeError, "floating"),
    (lambda: pg.ones(2, 3).sum(axis=3), ShapeError, "axis 3"),
    (lambda: pg.zeros(0).max(), ShapeError, "empty"),
    (lambda: pg.cross_entropy(pg.ones(2, 3), [0, 3]), ShapeError, "out of range"),
])
def test_bad_input_gets_clear_polygrad_errors(bad, error, pattern):
    if error is None:
        bad()
        return
    with pytest.raises(error, match=pattern):
        bad()


def test_item_and_bool_rules():
    assert pg.tensor([[3.5]]).item() == 3.5
    with pytest.raises(ShapeError):
        pg.tensor([1.0, 2.0]).item()
    with pytest.raises(ShapeError):
        bool(pg.tensor([1.0, 2.0]))


def test_data_setter_replaces_storage():
    p = pg.tensor([1.0, 2.0], requires_grad=True)
    with pg.no_grad():
        p.data = p - 1
    assert p.tolist() == [0.0, 1.0] and p.requires_grad and p.is_leaf


def test_mse_refuses_shapes_that_would_broadcast_silently():
    with pytest.raises(ShapeError, match=r"mse: prediction of shape \(3, 1\)"):
        pg.mse(pg.ones(3, 1), pg.ones(3))


def test_dense_only_ops_name_the_sparse_operand():
    A = pg.from_edge_index([[0, 1], [1, 0]], num_nodes=2)
    with pytest.raises(ShapeError, match=r"no sparse form.*\(2, 2\) \(csr\)"):
        pg.maximum(A, 0)


def test_min_minimum_abs_on_unsigned_and_bool_do_not_wrap():
    u = pg.tensor(np.array([0, 5], dtype=np.uint8))
    v = pg.tensor(np.array([5, 0], dtype=np.uint8))
    assert pg.minimum(u, v).tolist() == [0, 0] and u.min().item() == 0 and pg.abs(u).tolist() == [0, 5]
    assert pg.tensor([True, False]).min().item() is False


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # numpy's log(0) = -inf, as intended
def test_logsumexp_and_softmax_with_infinite_rows():
    assert pg.logsumexp(pg.tensor([-np.inf, -np.inf])).item() == -np.inf
    assert pg.logsumexp(pg.tensor([np.inf, 1.0])).item() == np.inf
    np.testing.assert_allclose(pg.tensor([[-np.inf, 0.0]]).softmax(-1).numpy(), [[0.0, 1.0]])


def test_mse_refuses_array_targets_that_would_broadcast():
    with pytest.raises(ShapeError, match="mse"):
        pg.mse(pg.ones(4, 1), np.zeros(4))
    assert pg.mse(pg.ones(2), 1.0).item() == 0.0


def test_floats_keep_their_width_against_ints_as_in_pytorch():
    x = pg.randn(3, requires_grad=True)
    assert (x * pg.arange(3)).dtype == pg.float32          # numpy would say float64
    (x * pg.arange(3)).sum().backward()
    assert x.grad.dtype == pg.float32 and x.grad.tolist() == [0.0, 1.0, 2.0]
    assert (pg.arange(4).reshape(2, 2) @ pg.randn(2, 2)).dtype == pg.float32
    assert pg.concat([pg.arange(2), pg.randn(2)]).dtype == pg.float32
    assert pg.where(pg.tensor([True, False]), pg.arange(2), pg.randn(2)).dtype == pg.float32
    assert (pg.randn(2) + pg.randn(2, dtype=pg.float64)).dtype == pg.float64
    i64, u64 = pg.tensor(np.array([1], dtype=np.int64)), pg.tensor(np.array([1], dtype=np.uint64))
    assert (i64 + u64).dtype == pg.int64
