"""The losses' host inputs (classes, masks, class weights) under ``pg.compile`` and at extremes:
a pure replay follows a numpy array the caller edits in place (the guard watched a private int64
copy, so the capture's classes were replayed silently); a subnormal sum of class weights gives the
finite weighted mean; calls in the old argument order get a message that says what moved."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import ArgumentError, DTypeError

from tests.helpers import assert_bitwise


class _Data:
    pass


STEPS = {
    "plain": lambda z, d: pg.cross_entropy(z, d.y),
    "int32 classes": lambda z, d: pg.cross_entropy(z, d.y32),
    "weight": lambda z, d: pg.cross_entropy(z, d.y, d.w),
    "mask": lambda z, d: pg.cross_entropy(z, np.arange(9) % 3, mask=d.m),
    "index mask": lambda z, d: pg.cross_entropy(z, np.arange(9) % 3, mask=d.rows),
    "nll": lambda z, d: pg.nn.nll_loss(pg.log_softmax(z, -1), d.y),
    "smoothing": lambda z, d: pg.cross_entropy(z, d.y, label_smoothing=0.2),
}


@pytest.mark.parametrize("name", sorted(STEPS))
@pytest.mark.parametrize("pure", [True, False])
def test_a_replay_follows_host_arrays_edited_in_place(name: str, pure: bool) -> None:
    rng = np.random.default_rng(5)
    x = pg.tensor(rng.normal(size=(9, 4)))
    w = pg.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    d = _Data()
    d.y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2])
    d.y32 = d.y.astype(np.int32)
    d.w = np.array([1.0, 2.0, 0.5])
    d.m = np.array([1, 1, 1, 0, 0, 1, 1, 0, 1], bool)
    d.rows = np.array([0, 2, 4, 6])

    def step():
        w.grad = None
        loss = STEPS[name](x @ w, d)
        loss.backward()
        return loss

    compiled = pg.compile(step, pure=pure)
    for _ in range(3):
        compiled()
    d.y[:5] = 2
    d.y32[:5] = 2
    d.w[1] = 7.0
    d.m[0], d.m[3] = False, True
    d.rows[1] = 8
    got, got_grad = compiled().numpy().copy(), w.grad.numpy().copy()
    want = step().numpy()
    assert_bitwise(got, want)
    assert_bitwise(got_grad, w.grad.numpy())


def test_subnormal_summed_weights_give_the_finite_mean() -> None:
    """1/sum(w) overflows for a sum of ~3e-310; the mean itself is ~0.98 (PyTorch's)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 3))
    y = np.array([0, 2, 0, 2, 2, 0])  # no class 1: the counted weights sum to 9e-310
    wt = np.array([1e-310, 1.0, 2e-310])
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    want = -(wt[y] * logp[np.arange(6), y]).sum() / wt[y].sum()
    got = pg.cross_entropy(pg.tensor(z), y, wt).item()
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-12)
    got_nll = pg.nn.nll_loss(pg.tensor(logp), y, wt).item()
    assert got_nll == pytest.approx(want, rel=1e-12)


def test_float32_input_with_tiny_weights_gives_the_finite_mean() -> None:
    """Weights summing to 3e-40: a normal float64 sum whose reciprocal (3e39) overflows float32."""
    z = np.array([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]], dtype=np.float32)
    y = np.array([0, 2])
    got = pg.cross_entropy(pg.tensor(z), y, np.full(3, 1.5e-40)).item()
    want = pg.cross_entropy(pg.tensor(z), y).item()  # equal weights: the plain mean
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-5)


def test_old_argument_order_is_refused_with_what_moved() -> None:
    z = pg.tensor(np.zeros((4, 3)))
    y = np.array([0, 1, 2, 0])
    with pytest.raises(ArgumentError, match="4th positional.*reduction= and ignore_index= by keyword"):
        pg.cross_entropy(z, y, None, "sum")  # reduction was the 4th positional before
    with pytest.raises(ArgumentError, match="4th positional"):
        pg.nn.nll_loss(z, y, None, 0)  # ignore_index was
    with pytest.raises(DTypeError, match="mask=.*keyword only"):
        pg.cross_entropy(z, y, np.array([True, False, True, True]))  # the mask was the 3rd
    with pytest.raises(ArgumentError, match="reduction='none'"):
        pg.cross_entropy(z, y, reduce=False)  # a real legacy flag: what it meant


def test_uint64_classes_past_int64_are_refused() -> None:
    with pytest.raises(pg.errors.IndexOutOfRangeError):
        pg.cross_entropy(pg.tensor(np.zeros((2, 3))), np.array([0, 2 ** 63], dtype=np.uint64))
