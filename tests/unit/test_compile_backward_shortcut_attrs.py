"""Default-mode ``pg.compile``: the backward shortcut (a recipe reused without ordering the graph)
must compare the array attributes the forward plan matched by op alone -- a getitem's index, the
cross-entropy's classes.  It did not: a step called with alternating targets replayed the first
call's targets in every other gradient (the loss was right, the gradient silently wrong)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg

from tests.helpers import assert_bitwise

LOSSES = {
    "cross_entropy": lambda z, y: pg.cross_entropy(z, y),
    "weighted": lambda z, y: pg.cross_entropy(z, y, np.array([1.0, 2.0, 0.5])),
    "getitem": lambda z, y: -pg.log_softmax(z, -1)[np.arange(z.shape[0]), y].mean(),
}


def _twins(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(9, 4))
    w = rng.normal(size=(4, 3))
    return x, w


def _step_on(x: pg.Tensor, w: pg.Tensor, loss_of):
    def step(y):
        w.grad = None
        loss = loss_of(x @ w, y)
        loss.backward()
        return loss
    return step


@pytest.mark.parametrize("name", sorted(LOSSES))
@settings(max_examples=15, deadline=None)
@given(targets=st.lists(st.lists(st.integers(0, 2), min_size=9, max_size=9), min_size=2, max_size=6),
       calls=st.lists(st.integers(0, 5), min_size=3, max_size=10))
def test_gradients_follow_the_targets_of_each_call(name: str, targets: list, calls: list) -> None:
    x, w = _twins(5)
    xc, wc = pg.tensor(x), pg.tensor(w, requires_grad=True)
    xe, we = pg.tensor(x), pg.tensor(w, requires_grad=True)
    compiled = pg.compile(_step_on(xc, wc, LOSSES[name]))
    eager = _step_on(xe, we, LOSSES[name])
    for k in calls:
        y = np.array(targets[k % len(targets)])
        assert_bitwise(compiled(pg.tensor(y)).numpy(), eager(pg.tensor(y)).numpy())
        assert_bitwise(wc.grad.numpy(), we.grad.numpy())


def test_alternating_targets_take_the_full_path_each_time() -> None:
    """Two batches in turn (the reviewer's case): every gradient equals eager's."""
    x, w = _twins(5)
    xc, wc = pg.tensor(x), pg.tensor(w, requires_grad=True)
    xe, we = pg.tensor(x), pg.tensor(w, requires_grad=True)
    compiled = pg.compile(_step_on(xc, wc, LOSSES["cross_entropy"]))
    eager = _step_on(xe, we, LOSSES["cross_entropy"])
    batches = [np.array([0, 1, 2, 0, 1, 2, 0, 1, 2]), np.array([2, 2, 1, 0, 0, 1, 1, 2, 0])]
    for i in range(8):
        y = batches[i % 2]
        compiled(pg.tensor(y))
        eager(pg.tensor(y))
        assert_bitwise(wc.grad.numpy(), we.grad.numpy())
