"""polygrad.apps.train.fit: the loop, the progress callback, and rollback to the last good checkpoint."""
from __future__ import annotations

import math

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.errors import NonFiniteError
from polygrad.apps.train import fit


class Scalar(nn.Module):
    """One parameter w; loss (w - 3)^2, minimised at w = 3."""

    def __init__(self, w0: float = 0.0):
        self.w = pg.tensor([w0], dtype=pg.float64, requires_grad=True)

    def loss(self):
        return ((self.w - 3.0) ** 2).sum()


def test_fit_trains_and_reports_every_epoch():
    pg.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 2))
    y = x @ np.array([[1.5], [-2.0]]) + 0.5
    model = nn.Linear(2, 1, dtype=pg.float64)
    opt = optim.SGD(model.parameters(), lr=0.1)
    seen = []
    hist = fit(model, opt, lambda: nn.mse(model(pg.tensor(x)), y), 150, callback=seen.append)
    assert len(hist.records) == 150 == len(seen) and [r.epoch for r in seen] == list(range(150))
    assert hist.losses[-1] < 1e-4 < hist.losses[0]
    assert hist.rollbacks == 0 and not hist.stopped_early
    assert all(r.seconds > 0 and r.epochs == 150 for r in seen)
    np.testing.assert_allclose(model.weight.numpy().ravel(), [1.5, -2.0], atol=1e-2)


def test_metrics_from_the_loss_function_reach_the_records():
    m = Scalar()
    opt = optim.SGD(m.parameters(), lr=0.1)
    hist = fit(m, opt, lambda: (m.loss(), {"w": float(m.w.item())}), 3)
    assert [r.metrics["w"] for r in hist.records] == pytest.approx([0.0, 0.6, 1.08])


def test_callback_returning_true_stops_training():
    m = Scalar()
    hist = fit(m, optim.SGD(m.parameters(), lr=0.1), m.loss, 50, callback=lambda r: r.epoch == 4)
    assert len(hist.records) == 5 and hist.stopped_early and "callback" in hist.stop_reason


def test_a_diverging_step_is_rolled_back_and_the_lr_lowered():
    # lr 1.2 on (w-3)^2 overshoots: |w - 3| grows by a factor 1.4 each step, the loss by 1.96
    m = Scalar()
    opt = optim.SGD(m.parameters(), lr=1.2)
    hist = fit(m, opt, m.loss, 40, rollback_threshold=0.05, lr_decay=0.5)
    assert hist.rollbacks >= 1
    first = next(r for r in hist.records if r.rolled_back)
    assert first.epoch == 1 and first.loss > hist.records[0].loss * 1.05
    assert hist.records[first.epoch + 1].lr == pytest.approx(0.6)   # halved
    assert hist.records[first.epoch + 1].loss == pytest.approx(hist.records[0].loss)  # restored
    assert m.w.item() == pytest.approx(3.0, abs=1e-6)               # and it then converges
    assert min(hist.losses) < 1e-10


def test_rollback_restores_parameters_and_optimizer_state_exactly():
    m = Scalar(0.0)
    opt = optim.Adam(m.parameters(), lr=0.5)
    snapshots = {}

    def loss_fn():
        snapshots[len(snapshots)] = (float(m.w.item()), opt.step_count)
        # a loss spike at the 4th evaluation, whatever the parameters
        return m.loss() * (10.0 if len(snapshots) == 4 else 1.0)

    hist = fit(m, opt, loss_fn, 6, rollback_threshold=0.05)
    rolled = [r.epoch for r in hist.records if r.rolled_back]
    assert rolled == [3]
    # after the rollback the model is back at the last good epoch's parameters and step count
    assert snapshots[4] == snapshots[2]
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_no_rollback_when_disabled():
    m = Scalar()
    hist = fit(m, optim.SGD(m.parameters(), lr=1.2), m.loss, 5, rollback_threshold=None)
    assert hist.rollbacks == 0 and hist.losses[-1] > hist.losses[0]


def test_nan_loss_rolls_back_later_and_raises_at_the_start():
    m = Scalar()
    calls = []

    def loss_fn():
        calls.append(1)
        return m.loss() * (float("nan") if len(calls) == 3 else 1.0)

    hist = fit(m, optim.SGD(m.parameters(), lr=0.1), loss_fn, 5)
    assert [r.rolled_back for r in hist.records] == [False, False, True, False, False]
    assert math.isfinite(m.w.item())
    m2 = Scalar()
    with pytest.raises(NonFiniteError, match="epoch 0"):
        fit(m2, optim.SGD(m2.parameters(), lr=0.1), lambda: m2.loss() * float("nan"), 3)


def test_stops_after_max_rollbacks():
    m = Scalar()
    count = [0]

    def rising():  # 1, 2, 3, ... whatever the parameters: every epoch after the first rolls back
        count[0] += 1
        return m.loss() * 0.0 + float(count[0])

    hist = fit(m, optim.SGD(m.parameters(), lr=0.1), rising, 20, max_rollbacks=3)
    assert hist.rollbacks == 3 and hist.stopped_early and "3 rollbacks" in hist.stop_reason


def test_good_checkpoints_are_written_to_disk(tmp_path):
    m = Scalar()
    opt = optim.SGD(m.parameters(), lr=0.1)
    path = tmp_path / "best.npz"
    hist = fit(m, opt, m.loss, 5, checkpoint_path=path)
    saved = pg.load(path)
    assert saved["epoch"] == 4 and saved["loss"] == pytest.approx(hist.losses[4])
    m2 = Scalar(123.0)
    m2.load_state_dict(saved["model"])
    assert ((m2.w - 3.0) ** 2).sum().item() == pytest.approx(hist.losses[4])
    assert saved["optimizer"]["step_count"] == 4


def test_bad_arguments():
    m = Scalar()
    opt = optim.SGD(m.parameters(), lr=0.1)
    for kwargs in (dict(epochs=-1), dict(epochs=1, lr_decay=0), dict(epochs=1, rollback_threshold=-0.1),
                   dict(epochs=1, checkpoint_every=0)):
        epochs = kwargs.pop("epochs")
        with pytest.raises(ValueError):
            fit(m, opt, m.loss, epochs, **kwargs)
    with pytest.raises(TypeError, match="single-element"):
        fit(m, opt, lambda: m.w * 1.0 + pg.zeros(2, dtype=pg.float64), 1)


def test_a_snapshot_is_a_private_copy_of_parameters_and_optimizer_state():
    """fit's rollback point must not follow later writes into the live storage (p.numpy() is the
    storage itself on numpy) nor share arrays with the optimizer's state."""
    from polygrad.apps.train import _snapshot

    pg.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = pg.ones_like(p)
    opt.step()
    snap = _snapshot(0, 1.0, model, opt)
    before = {k: v.numpy().copy() for k, v in snap.model.items()}
    state_before = {k: {n: v.numpy().copy() for n, v in st.items() if isinstance(v, pg.Tensor)}
                    for k, st in snap.optimizer["state"].items()}
    for p in model.parameters():
        p.numpy()[...] = 123.0  # the user writes into the live storage
    opt.step()  # and training moves on
    for k, v in snap.model.items():
        assert np.array_equal(v.numpy(), before[k])
    for k, st in snap.optimizer["state"].items():
        for n, v in st.items():
            if isinstance(v, pg.Tensor):
                assert np.array_equal(v.numpy(), state_before[k][n])
