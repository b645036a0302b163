"""fit on a lazy backend that starts work without waiting (``Backend.submit``) builds and submits the
next epoch's step before it reads this epoch's loss.  Every number must be the one the loop that
waits (``pipeline=False``) gives, bit for bit, whatever the epoch's decision: a rollback, a
non-finite loss, an error in ``loss_fn``, a failed step, a failing checkpoint save."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.apps.train import fit
from polygrad.runtime.registry import registry
from polygrad.testing.temporary import temporary_plugin

from tests.unit.test_lazy_backend import LazyBackend, Pending

LR = 0.05


class Submitted(Pending):
    """A lazy array handed over by ``submit``: which submission it came from."""

    def __init__(self, value: np.ndarray, submission: int):
        super().__init__(value)
        self.submission = submission


class SubmittingBackend(LazyBackend):
    """LazyBackend whose ``submit`` returns at once: it logs what each submission held and what
    each ``materialize`` waited for, so a test can tell which step a join waited for."""
    name = "submittest"

    def __init__(self):
        super().__init__()
        self.submissions: list[list[Submitted]] = []
        self.waited: list[list[Pending]] = []

    def submit(self, arrays):
        out = [Submitted(a.value, len(self.submissions)) for a in arrays]
        self.submissions.append(out)
        return out

    def materialize(self, arrays):
        self.waited.append(list(arrays))
        return super().materialize(arrays)


@pytest.fixture
def submitting():
    be = SubmittingBackend()
    with temporary_plugin(be):
        yield registry.get("submittest")


def _inputs():
    """The regression's inputs and targets, on the current backend."""
    return pg.tensor(np.linspace(-1, 1, 15).reshape(5, 3)), pg.tensor(np.arange(10.0).reshape(5, 2))


def _state_keyed_loss(model, opt, x, y, scales):
    """The loss scaled by ``scales[(steps taken, rollbacks so far)]``: a function of the training
    state only (not of how often it was called), so the loop that waits and the pipelined one see
    the same loss at the same state."""
    def loss_fn():
        decays = round(math.log2(LR / opt.param_groups[0]["lr"]))
        return pg.mse(model(x), y) * scales.get((opt.step_count, decays), 1.0)
    return loss_fn


def _run(pipeline: bool, scales: dict, epochs: int = 6, make_model=None, fail=None, make_optimizer=None, **kw):
    """fit on the submitting backend; everything a run leaves behind, as numpy, plus its error."""
    with pg.use_backend("submittest"):
        pg.manual_seed(0)
        model = make_model() if make_model else nn.Linear(3, 2)
        opt = make_optimizer(model) if make_optimizer else optim.Adam(model.parameters(), lr=LR)
        x, y = _inputs()
        loss_fn = fail(model, opt, x, y) if fail else _state_keyed_loss(model, opt, x, y, scales)
        history, error = None, None
        try:
            history = fit(model, opt, loss_fn, epochs, pipeline=pipeline, **kw)
        except Exception as exc:  # noqa: BLE001 - compared between the two runs
            error = f"{type(exc).__name__}: {exc}"
        return {
            "error": error,
            "losses": None if history is None else history.losses,
            "decisions": None if history is None else [(r.rolled_back, r.lr) for r in history.records],
            "summary": None if history is None else (history.rollbacks, history.best_epoch, history.stop_reason),
            "steps_ahead": None if history is None else history.steps_ahead,
            "state": {k: v.numpy() for k, v in model.state_dict().items()},
            "grads": [None if p.grad is None else p.grad.numpy() for p in model.parameters()],
            "optimizer": {k: {n: v.numpy() if isinstance(v, pg.Tensor) else v for n, v in s.items()}
                          for k, s in opt.state_dict()["state"].items()},
            "step_count": opt.step_count,
            "lrs": [g["lr"] for g in opt.param_groups],
            "rng": pg.rng().random(),
        }


def _assert_same(got: dict, want: dict) -> None:
    """Two runs agree bit for bit (NaN equals NaN), apart from how many epochs ran ahead."""
    for key in ("error", "decisions", "summary", "step_count", "lrs", "rng"):
        assert got[key] == want[key], key
    np.testing.assert_array_equal(np.asarray(got["losses"], dtype=float), np.asarray(want["losses"], dtype=float))
    for part in ("state", "optimizer"):
        assert got[part].keys() == want[part].keys()
        for k in got[part]:
            a, b = got[part][k], want[part][k]
            if isinstance(a, dict):
                for n in a:
                    np.testing.assert_array_equal(a[n], b[n])
            else:
                np.testing.assert_array_equal(a, b)
    assert len(got["grads"]) == len(want["grads"])
    for a, b in zip(got["grads"], want["grads"]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


def _waited_submissions(be: SubmittingBackend) -> list[set[int]]:
    return [{a.submission for a in arrays if isinstance(a, Submitted)} for arrays in be.waited]


def test_each_epoch_waits_for_its_own_step_while_the_next_is_submitted(submitting):
    got = _run(True, {}, epochs=5, rollback_threshold=None)
    assert got["steps_ahead"] == 4
    assert len(submitting.submissions) == 5
    # the join of epoch k waits for submission k's arrays -- all of them, none of the next step's
    # (the parameters' tensors already hold the next step's arrays when epoch k is joined)
    assert _waited_submissions(submitting) == [{k} for k in range(5)]
    for arrays, submitted in zip(submitting.waited, submitting.submissions):
        assert [id(a) for a in arrays] == [id(a) for a in submitted]
    _assert_same(got, _run(False, {}, epochs=5, rollback_threshold=None))


def test_no_pipeline_without_submit_with_a_callback_or_when_asked(submitting, lazy_plain):
    assert _run(False, {})["steps_ahead"] == 0
    with pg.use_backend("submittest"):
        model = nn.Linear(3, 2)
        opt = optim.Adam(model.parameters(), lr=LR)
        x = pg.tensor(np.ones((4, 3)))
        assert fit(model, opt, lambda: model(x).sum(), 3, callback=lambda r: None).steps_ahead == 0
    with pg.use_backend("lazytest"):  # materialize only: building ahead would wait for this step first
        model = nn.Linear(3, 2)
        opt = optim.Adam(model.parameters(), lr=LR)
        x = pg.tensor(np.ones((4, 3)))
        assert fit(model, opt, lambda: model(x).sum(), 3).steps_ahead == 0
    model = nn.Linear(3, 2)  # an eager backend
    assert fit(model, optim.Adam(model.parameters(), lr=LR), lambda: model(pg.ones(4, 3)).sum(), 3).steps_ahead == 0


@pytest.fixture
def lazy_plain():
    be = LazyBackend()
    with temporary_plugin(be):
        yield be


SCALES = st.dictionaries(st.tuples(st.integers(0, 7), st.integers(0, 2)),
                         st.sampled_from([float("nan"), float("inf"), 3.0, 100.0, 0.5]), max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scales=SCALES, epochs=st.integers(1, 8), threshold=st.sampled_from([None, 0.05, 0.5]),
       max_rollbacks=st.integers(1, 4), checkpoint_every=st.integers(1, 3))
def test_pipelined_fit_equals_the_waiting_loop_on_generated_schedules(submitting, scales, epochs, threshold,
                                                                      max_rollbacks, checkpoint_every):
    """Generated NaN / Inf / rise schedules: rollbacks, the stop after max_rollbacks, the error
    before any checkpoint -- the pipelined run discards the step it built ahead wherever the
    waiting loop would not have taken it, and ends with the same numbers."""
    kw = dict(epochs=epochs, rollback_threshold=threshold, max_rollbacks=max_rollbacks,
              checkpoint_every=checkpoint_every)
    got, want = _run(True, scales, **kw), _run(False, scales, **kw)
    _assert_same(got, want)
    if got["error"] is None:  # every epoch after one that took its step was built ahead
        rolled = [r for r, _ in got["decisions"]]
        assert got["steps_ahead"] == sum(not r for r in rolled[:-1])
        assert want["steps_ahead"] == 0


def _with_dropout_and_batchnorm():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))


@pytest.mark.parametrize("scales", [{(3, 0): float("nan")}, {(2, 0): 100.0, (4, 1): float("inf")}, {}])
def test_a_discarded_step_puts_back_buffers_and_the_random_generator(submitting, scales, tmp_path):
    """Dropout draws from polygrad's generator and batch norm moves its running statistics in the
    forward: a step built ahead and discarded must leave both as the waiting loop has them, and a
    checkpoint taken while the next step is built holds this epoch's statistics."""
    kw = dict(epochs=7, make_model=_with_dropout_and_batchnorm, rollback_threshold=0.05)
    got = _run(True, scales, checkpoint_path=tmp_path / "ahead.ckpt", **kw)
    want = _run(False, scales, checkpoint_path=tmp_path / "waiting.ckpt", **kw)
    _assert_same(got, want)
    assert any("running_mean" in k for k in got["state"])
    saved, expected = pg.load(tmp_path / "ahead.ckpt"), pg.load(tmp_path / "waiting.ckpt")
    assert saved["epoch"] == expected["epoch"] and saved["loss"] == expected["loss"]
    for k in expected["model"]:
        np.testing.assert_array_equal(saved["model"][k].numpy(), expected["model"][k].numpy())


def _raising_at(step: int, once: bool = False):
    """A loss_fn that raises at ``step`` steps taken (with ``once``, only the first time: an error
    the eager loop meets, and a second call would not)."""
    def make(model, opt, x, y):
        raised = []

        def loss_fn():
            if opt.step_count == step and not (once and raised):
                raised.append(step)
                raise ValueError(f"loss_fn failed at step {step}")
            return pg.mse(model(x), y)
        return loss_fn
    return make


@pytest.mark.parametrize("once", [False, True])
@pytest.mark.parametrize("step", [0, 1, 3])
def test_an_error_in_loss_fn_while_building_ahead_surfaces_where_the_waiting_loop_raises(submitting, step, once):
    """loss_fn raises for epoch ``step`` while fit builds that epoch's step ahead: fit raises it at
    that epoch, from the state after the previous step, without calling loss_fn again."""
    got = _run(True, {}, epochs=6, fail=_raising_at(step, once), rollback_threshold=None)
    _assert_same(got, _run(False, {}, epochs=6, fail=_raising_at(step, once), rollback_threshold=None))
    assert got["error"] == f"ValueError: loss_fn failed at step {step}"
    assert got["step_count"] == step


def _raising_after_forward(step: int):
    """loss_fn raises at ``step`` steps taken after its forward ran (batch norm's statistics moved,
    dropout drew): the eager loop raises from that state."""
    def make(model, opt, x, y):
        def loss_fn():
            out = model(x)
            if opt.step_count == step:
                raise ValueError(f"bad batch at step {step}")
            return pg.mse(out, y)
        return loss_fn
    return make


def _schedule_raising_at(step: int):
    """An optimizer whose schedule raises at ``step``: inside the step, after loss_fn and backward."""
    def make(model):
        return optim.Adam(model.parameters(), lr=LR, lr_schedule=lambda k: 1.0 / (step - k))
    return make


@pytest.mark.parametrize("step", [1, 3])
def test_an_error_after_the_forward_is_raised_from_the_state_it_left(submitting, step):
    """The step built ahead raised after its forward (or in the optimizer's step, after backward):
    fit raises at that epoch from the state the waiting loop raises from -- the forward's
    statistics and random draws, the new gradients -- not from the state before it."""
    kw = dict(epochs=6, make_model=_with_dropout_and_batchnorm, rollback_threshold=None)
    got = _run(True, {}, fail=_raising_after_forward(step), **kw)
    _assert_same(got, _run(False, {}, fail=_raising_after_forward(step), **kw))
    assert got["error"] == f"ValueError: bad batch at step {step}"
    got = _run(True, {}, make_optimizer=_schedule_raising_at(step), **kw)
    _assert_same(got, _run(False, {}, make_optimizer=_schedule_raising_at(step), **kw))
    assert got["error"] == "ZeroDivisionError: float division by zero" and got["step_count"] == step


def test_an_interrupt_while_building_ahead_leaves_no_unchecked_step(submitting):
    """Ctrl-C lands while fit builds the next step, before this epoch's loss was read: the step
    it submitted is undone (its loss may be NaN), as the waiting loop undoes an interrupted wait;
    the state is the last decided epoch's."""
    def make(model, opt, x, y):
        def loss_fn():
            if opt.step_count == 2:  # the step built ahead during epoch 1
                raise KeyboardInterrupt
            return pg.mse(model(x), y) * (float("nan") if opt.step_count == 1 else 1.0)
        return loss_fn

    with pg.use_backend("submittest"):
        pg.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = optim.Adam(model.parameters(), lr=LR)
        x, y = _inputs()
        with pytest.raises(KeyboardInterrupt):
            fit(model, opt, make(model, opt, x, y), 5, rollback_threshold=None)
        assert opt.step_count == 1   # epoch 0's step; epoch 1's (from a NaN loss) undone
        assert all(np.isfinite(p.numpy()).all() for p in model.parameters())


def test_a_parameter_left_out_of_the_optimizer_gets_the_waiting_loops_gradient(submitting):
    """A layer frozen by leaving it out of the optimizer still gets gradients; a step built ahead
    and discarded (a rollback) must not add its gradient to them."""
    def frozen_first_layer():
        return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))

    def run(pipeline):
        with pg.use_backend("submittest"):
            pg.manual_seed(0)
            model = frozen_first_layer()
            opt = optim.Adam(model.layers[1].parameters(), lr=LR)
            x, y = _inputs()
            # rises, not NaN: a NaN gradient would make both runs' sums NaN, equal or not
            history = fit(model, opt, _state_keyed_loss(model, opt, x, y, {(2, 0): 100.0, (3, 1): 50.0}),
                          6, pipeline=pipeline)
            return history.rollbacks, [p.grad.numpy() for p in model.layers[0].parameters()]

    (rolled, got), (_, want) = run(True), run(False)
    assert rolled >= 1
    for a, b in zip(got, want):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("lost", [0, 2, 4])
def test_a_lost_step_leaves_the_last_completed_one_and_discards_the_next(submitting, lost):
    """The wait for epoch ``lost``'s step fails (a worker lost): the step built ahead on it is
    discarded too, and fit raises with the state from before that step -- gradients, statistics
    and the random generator included -- as where each step is waited for at once."""
    runs = {}
    for pipeline in (True, False):
        waits = []

        def materialize(arrays, waits=waits):
            waits.append(arrays)
            if len(waits) == lost + 1:
                raise pg.errors.BackendError("backend 'submittest': a worker was lost")
            return SubmittingBackend.materialize(submitting, arrays)

        submitting.materialize = materialize
        runs[pipeline] = _run(pipeline, {}, epochs=6, make_model=_with_dropout_and_batchnorm, rollback_threshold=None)
        del submitting.materialize
    _assert_same(runs[True], runs[False])
    assert runs[True]["error"] == "BackendError: backend 'submittest': a worker was lost"
    assert runs[True]["step_count"] == lost


def test_a_failing_checkpoint_save_while_a_step_is_built_ahead(submitting, monkeypatch, tmp_path):
    """The save fails at epoch 2: the state is the one from before epoch 2's step, with epoch 2's
    gradients and statistics, not the next step's."""
    real_save = pg.save
    runs = {}
    for pipeline in (True, False):
        saves = []

        def save(obj, path):
            saves.append(path)
            if len(saves) == 3:
                raise OSError("disk full")
            return real_save(obj, path)

        monkeypatch.setattr(pg, "save", save)
        runs[pipeline] = _run(pipeline, {}, epochs=5, make_model=_with_dropout_and_batchnorm,
                              checkpoint_path=tmp_path / f"{pipeline}.ckpt")
    _assert_same(runs[True], runs[False])
    assert runs[True]["error"] == "OSError: disk full" and runs[True]["step_count"] == 2
