"""elu's value is ``alpha * expm1(x)`` (round 8, through the primitive ``expm1``): accurate near
0, where ``exp(x) - 1`` gave 0 at ``-1e-8`` in float32; the gradient stays ``alpha * exp(x)``.
Checked against torch (skipped without it) on both backends, against numpy's expm1, and under
pg.compile (with the norm layers)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn
from polygrad.testing import check_grads

from tests.helpers import assert_bitwise

POINTS = [-1e-8, -1e-20, -0.0, 0.0, -1e-3, -0.3, -0.7, -1.0, -5.0, -20.0, -40.0, -800.0, -np.inf, 1e-8, 2.0, np.inf]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["numpy", "scalar"])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_elu_is_torchs_at_small_large_and_edge_inputs(dtype: Any, backend: str, alpha: float) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch comparison is skipped")
    v = np.array(POINTS, dtype=dtype)
    x = pg.tensor(v, requires_grad=True, backend=backend)
    y = pg.elu(x, alpha)
    y.sum().backward()
    tx = torch.tensor(v, requires_grad=True)
    ty = torch.nn.functional.elu(tx, alpha)
    ty.sum().backward()
    want, got = ty.detach().numpy(), y.numpy()
    assert np.array_equal(np.signbit(got), np.signbit(want))  # elu(-0.0) = -0.0
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite])
    assert np.all(np.abs(got[finite] - want[finite]) <= 4 * np.spacing(np.abs(want[finite]).astype(dtype)))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=4 * np.finfo(dtype).eps, atol=0)


def test_elu_near_zero_is_expm1_not_zero() -> None:
    for dtype in (np.float32, np.float64):
        v = -(10.0 ** -np.arange(1, 30, dtype=np.float64)).astype(dtype)
        got = pg.elu(pg.tensor(v)).numpy()
        want = np.expm1(v.astype(np.float64)).astype(dtype)
        assert np.all(np.abs(got - want) <= 4 * np.spacing(np.abs(want))), (got, want)


def test_elu_gradients_match_numerical_differentiation() -> None:
    check_grads(lambda x: pg.elu(x, 1.3), [np.array([-3.0, -0.5, -1e-4, 0.4, 2.0])])
    x = pg.tensor(np.array([-0.5, 0.3]), dtype="float64", requires_grad=True)
    (g,) = pg.grad(pg.elu(x).sum(), x, create_graph=True)
    (g2,) = pg.grad(g.sum(), x)  # second order: exp(x) below 0, 0 above (as PyTorch)
    np.testing.assert_allclose(g2.numpy(), [np.exp(-0.5), 0.0], rtol=1e-15)


def test_compiled_elu_and_norm_steps_replay_eagers_bits() -> None:
    rng = np.random.default_rng(3)
    x = pg.tensor(rng.normal(size=(12, 5)) * np.array([1.0, 1e-9, 1e200, 3.0, 1e-300]))
    lin = nn.Linear(5, 5, dtype=pg.float64)
    layer_norm = nn.LayerNorm(5, mode="node", dtype=pg.float64)
    batch_norm = nn.BatchNorm1d(5, track_running_stats=False, dtype=pg.float64)  # (running-stat updates
    # are host writes a pure replay refuses, before and after round 8)

    def step():
        for p in lin.parameters():
            p.grad = None
        h = pg.elu(layer_norm(lin(x)) - 0.5, 0.7)
        loss = batch_norm(h * 1e160).sum()
        loss.backward()
        return loss

    def outcome(fn: Any) -> list:
        loss = fn()
        return [loss.numpy().copy()] + [p.grad.numpy().copy() for p in lin.parameters()]

    compiled = pg.compile(step, pure=True)
    for i in range(5):
        assert_bitwise(outcome(compiled), outcome(step), f"call {i}")
    assert compiled.stats["replays"] >= 2


@pytest.mark.parametrize("backend", ["numpy", "scalar"])
def test_expm1_primitive_value_and_gradients(backend: str) -> None:
    """The primitive itself: numpy's expm1 on every backend (signed zero, -inf, overflow), its
    gradient ``exp(x)`` against finite differences, and second order through the rule."""
    v = np.array([-1e-10, -0.0, 0.0, 1e-12, -3.0, 2.0, -np.inf, 1000.0])
    got = pg.tensor(v, backend=backend).expm1().numpy()
    with np.errstate(over="ignore"):
        assert_bitwise(got, np.expm1(v))
    x = np.random.default_rng(3).normal(size=(3, 4))
    check_grads(lambda t: (t.expm1() * t).sum(), [x], backend=backend)
    y = pg.tensor(x, dtype=pg.float64, requires_grad=True, backend=backend)
    (g,) = pg.grad(y.expm1().sum(), [y], create_graph=True)
    (gg,) = pg.grad(g.sum(), [y])
    assert np.allclose(g.numpy(), np.exp(x)) and np.allclose(gg.numpy(), np.exp(x))
