"""A pure replay follows kernel faults injected *after* its capture, as eager does.

A replay must look its kernels up where dispatch does, at every call: a rewrite that bound a
replay to the backend's own kernels at capture time (a cross-entropy forward/backward pair,
reverted) kept returning finite numbers under a NaN-injecting fault that eager reported.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn
from polygrad.testing import inject_fault


def _step():
    rng = np.random.default_rng(0)
    x = pg.tensor(rng.normal(size=(6, 3)))
    w = pg.tensor(rng.normal(size=(3, 4)), requires_grad=True)
    y = rng.integers(0, 4, 6)

    def step():
        w.grad = None
        loss = nn.cross_entropy(x @ w, y)
        loss.backward()
        return loss

    return step, w


@pytest.mark.parametrize("op", ["cross_entropy", "matmul"])
def test_a_fault_injected_after_capture_reaches_the_replay(op):
    results = []
    for compiled in (False, True):
        step, w = _step()
        fn = pg.compile(step, pure=True) if compiled else step
        for _ in range(3):  # eager, capture, replay
            fn()
        with inject_fault("numpy", op, mode="nan"):
            loss = fn()
        results.append((loss.numpy().copy(), w.grad.numpy().copy()))
    (le, ge), (lc, gc) = results
    assert np.isnan(le) and np.isnan(lc)
    np.testing.assert_array_equal(np.isnan(ge), np.isnan(gc))
    assert np.array_equal(ge, gc, equal_nan=True)
