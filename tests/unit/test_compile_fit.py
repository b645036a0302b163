"""fit(compile="pure") against fit(compile=False): the same history, parameters and optimizer state,
bit for bit.

Pure mode replays zero_grad + loss + backward with the optimizer's step inside (undone where eager
would not have stepped: a rollback, the stop after too many, a non-finite first loss; the snapshot
taken from the state before it), or, for an optimizer that may write into its arrays, the step as
a replay of its own after the rollback decision (``polygrad.apps.train._compiled_update``).  The
generated cases drive both through what fit does around the step: rollbacks (which reload the
optimizer's state and lower its learning rate), parameter groups, momentum and Adam's moments,
weight decay, learning-rate schedules and the stop after too many rollbacks.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.apps.train import _compiled_update, fit
from tests.helpers import assert_bitwise, observed


class InPlaceSGD(optim.SGD):
    """A user's optimizer that overrides ``_update`` and writes into the parameter's array: fit's pure
    mode must not hold the arrays from before its step as that step's undo (it replays the step as a
    step of its own instead, after the rollback decision)."""

    def _update(self, x: Any, g: Any, lr: float, group: Any, state: dict, fast: bool) -> Any:
        if fast:
            x -= lr * g  # in place: the array from before the step changes too
            return x
        return x - lr * g


class DampedAdam(optim.Adam):
    """A user's Adam whose ``_advance_state`` writes into the state's arrays (its first moment
    halved after each step): the update rule is still the built-in one, but the step writes into
    arrays, so fit's pure mode must not take references as the step's undo."""

    def _advance_state(self, state: dict) -> None:
        super()._advance_state(state)
        m = state["exp_avg"]
        m *= 0.5  # in place (a numpy array or a Tensor's in-place op)


def _optimizer(kind: str, model: nn.Module, lr: float, wd: float, groups: bool, schedule: bool) -> optim.Optimizer:
    params: Any = model.parameters()
    if groups:  # the first layer decays, the rest does not (the GCN recipe's groups)
        first, rest = params[:2], params[2:]
        params = [{"params": first, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    kwargs: dict[str, Any] = {} if groups else {"weight_decay": wd}
    if schedule:
        kwargs["lr_schedule"] = lambda k: 1.0 / (1.0 + 0.1 * k)
    if kind == "sgd":
        return optim.SGD(params, lr=lr, **kwargs)
    if kind == "inplace":
        return InPlaceSGD(params, lr=lr, **kwargs)
    if kind == "damped":
        return DampedAdam(params, lr=lr, **kwargs)
    if kind == "momentum":
        return optim.SGD(params, lr=lr, momentum=0.9, **kwargs)
    if kind == "adamw":
        return optim.AdamW(params, lr=lr, **kwargs) if not groups else optim.AdamW(params, lr=lr)
    return optim.Adam(params, lr=lr, **kwargs)


def _run(case: dict, compile: Any) -> tuple:
    rng = np.random.default_rng(case["seed"])
    x = pg.tensor(rng.normal(size=(12, 3)).astype(case["dtype"]))
    y = pg.tensor(rng.normal(size=(12, 1)).astype(case["dtype"]))
    pg.manual_seed(case["seed"])
    model = nn.MLP(3, [4, 1], dtype=pg.float64 if case["dtype"] == np.float64 else pg.float32)
    opt = _optimizer(case["optimizer"], model, case["lr"], case["wd"], case["groups"], case["schedule"])
    history = fit(model, opt, lambda: ((model(x) - y) ** 2).mean(), case["epochs"],
                  rollback_threshold=case["threshold"], lr_decay=case["decay"], max_rollbacks=case["max_rollbacks"],
                  compile=compile)
    records = [(r.loss, r.lr, r.rolled_back) for r in history.records]
    state = opt.state_dict()
    moments = [observed(list(st.values())) for _, st in sorted(state["state"].items())]
    return (records, history.rollbacks, history.stop_reason, history.best_epoch, observed(model.parameters()),
            moments, state["step_count"], [g["lr"] for g in opt.param_groups])


cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "dtype": st.sampled_from([np.float32, np.float64]),
    "optimizer": st.sampled_from(["sgd", "momentum", "adam", "adamw", "inplace", "damped"]),
    "lr": st.sampled_from([1e-3, 0.05, 0.5, 3.0]),  # the large ones diverge: rollbacks
    "wd": st.sampled_from([0.0, 5e-4]),
    "groups": st.booleans(),
    "schedule": st.booleans(),
    "threshold": st.sampled_from([None, 0.0, 0.05]),
    "decay": st.sampled_from([0.5, 1.0]),
    "max_rollbacks": st.integers(0, 3),
    "epochs": st.integers(1, 9),
})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_fit_pure_mode_with_its_compiled_update_equals_eager_bit_for_bit(case):
    assert_bitwise(list(_run(case, "pure")), list(_run(case, False)))


def test_the_compiled_update_replays_and_steps_as_the_optimizer_does():
    """The optimizer's step as its own pure step: captured, then replayed, with eager's bits --
    including after a learning-rate change (fit's rollback) and a state reload between calls."""
    def run(compiled: bool) -> list:
        pg.manual_seed(0)
        model = nn.Linear(3, 2, dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.1)
        update = _compiled_update(opt) if compiled else opt.step
        x = pg.tensor(np.random.default_rng(0).normal(size=(5, 3)))
        seen, saved = [], None
        for k in range(8):
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            if k == 3:
                saved = opt.state_dict()
            if k == 5:  # what fit's rollback does between two steps
                opt.load_state_dict(saved)
                for g in opt.param_groups:
                    g["lr"] *= 0.5
            update()
            seen.append(observed(model.parameters()))
        if compiled:
            assert update.stats["replays"] >= 3, update.stats
        return seen

    assert_bitwise(run(True), run(False))


def test_the_gcn_demo_replays_only_the_training_rows_of_its_last_layer(monkeypatch):
    """The demo's loss reads the training rows alone (the accuracy too), so its pure replay computes
    just those rows of the last SpMM (compile/rewrite.py): a guard against a demo that returns every
    node's logits again, which would forbid the rewrite (a timing-free check of the speed-up)."""
    import polygrad.apps.train as train
    from polygrad.apps.demos import load_graph, train_gcn
    from polygrad.compile.program import ASSERT_FINITE

    made = []
    real = train._compiled_step

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(train, "_compiled_step", spy)
    ds = load_graph(None, "cora", False)
    result = train_gcn(ds, seed=0, epochs=5, compile=True)
    assert result["history"].replays == 2
    (step,) = made
    (entry,) = step._cache.values()
    program = entry.capture.program
    assert any(e[0] == ASSERT_FINITE for e in program)  # the rewrite's check: it applied


def test_a_non_finite_first_loss_raises_before_the_step_in_pure_mode_too():
    """Eager raises before its step; pure mode steps inside its compiled call, so it must undo that
    step before raising: the parameters are the same afterwards."""
    import pytest

    from polygrad.errors import NonFiniteError

    def run(compile: Any) -> list:
        pg.manual_seed(0)
        model = nn.Linear(2, 1, dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.1)
        x = pg.tensor(np.array([[1.0, np.nan]]))
        with pytest.raises(NonFiniteError):
            fit(model, opt, lambda: (model(x) ** 2).mean(), 3, compile=compile)
        return [observed(model.parameters()), opt.step_count, sorted(len(s) for s in opt.state.values())]

    assert_bitwise(run("pure"), run(False))


# -- pure mode's checkpoints held by reference (polygrad.apps.train._HeldSnapshot) ---------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_pure_modes_held_checkpoints_equal_its_copied_ones_bit_for_bit(case):
    """The fast path against the one it replaces: pure mode with its checkpoints held by reference
    (copied only when a rollback loads one) and with every checkpoint copied as before."""
    import pytest

    import polygrad.apps.train as train

    held = list(_run(case, "pure"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "_only_parameters", lambda model, optimizer: False)
        copied = list(_run(case, "pure"))
    assert_bitwise(held, copied)


def _writing_run(compile: Any, unused: bool) -> list:
    """Adam with rollbacks on every rise, and a callback that writes into every parameter's live
    array after each epoch (in place); ``unused``: one parameter never gets a gradient, so the
    optimizer leaves its array live -- a checkpoint must copy it, not hold it."""
    rng = np.random.default_rng(3)
    x = pg.tensor(rng.normal(size=(12, 3)))
    y = pg.tensor(rng.normal(size=(12, 1)))
    pg.manual_seed(0)
    model = nn.MLP(3, [4, 1], dtype=pg.float64)
    if unused:
        setattr(model, "idle", pg.tensor(rng.normal(size=(2, 2)), requires_grad=True))
    opt = optim.Adam(model.parameters(), lr=0.5)
    loads: list[int] = []

    def write_in_place(rec: Any) -> None:
        for p in model.parameters():
            p._data *= 1.5  # the live array, in place: a held checkpoint must not see it
        loads.append(int(rec.rolled_back))

    history = fit(model, opt, lambda: ((model(x) - y) ** 2).mean(), 12, rollback_threshold=0.0,
                  max_rollbacks=8, callback=write_in_place, compile=compile)
    assert history.rollbacks > 0  # the case drives rollbacks, which load the checkpoints
    state = opt.state_dict()
    return [[(r.loss, r.lr, r.rolled_back) for r in history.records], observed(model.parameters()),
            [observed(list(st.values())) for _, st in sorted(state["state"].items())], loads]


def test_held_checkpoints_ignore_writes_into_live_parameters_and_copy_what_stays_live(monkeypatch):
    """A callback writing into the parameters in place changes only live arrays: the held ones are
    those the step replaced; a parameter without a gradient keeps its array live, so that epoch's
    checkpoint is copied (``_holdable``).  Both as eager, bit for bit, and the held path is taken."""
    import polygrad.apps.train as train

    held: list[bool] = []
    real = train._holdable

    def spy(*args: Any) -> bool:
        held.append(real(*args))
        return held[-1]

    monkeypatch.setattr(train, "_holdable", spy)
    for unused in (False, True):
        held.clear()
        assert_bitwise(_writing_run("pure", unused), _writing_run(False, unused))
        assert held and any(held) is not unused  # held where every array was replaced, else copied


@pytest.mark.parametrize("variant", ["reused_buffer", "kept_export"])
def test_a_checkpoint_never_holds_memory_the_user_can_write(variant):
    """A held checkpoint keeps the arrays the step replaced; one of them the user can still write
    through (``update_`` kept their buffer, ``numpy()`` handed out the storage) must be copied,
    or an edit through that reference changes what a rollback loads (found by review: eager 5
    rollbacks, held 8, losses apart from epoch 8).  Pure mode equals eager bit for bit."""

    def run(compile):
        rng = np.random.default_rng(3)
        x, y = pg.tensor(rng.normal(size=(12, 3))), pg.tensor(rng.normal(size=(12, 1)))
        pg.manual_seed(0)
        model = nn.MLP(3, [4, 1], dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.5)
        params = list(model.parameters())
        bufs = [np.zeros(p.shape) for p in params]
        exported: dict[int, np.ndarray] = {}

        def callback(rec):
            for i, p in enumerate(params):
                if variant == "reused_buffer":  # clip into one buffer per parameter, kept by update_
                    np.clip(p.numpy(), -3, 3, out=bufs[i])
                    p.update_(bufs[i])
                else:  # scribble on last epoch's exported storage
                    if i in exported:
                        exported[i][...] = 7.0
                    exported[i] = p.numpy()

        history = fit(model, opt, lambda: ((model(x) - y) ** 2).mean(), 15, rollback_threshold=0.0,
                      max_rollbacks=8, callback=callback, compile=compile)
        return [r.loss for r in history.records], history.rollbacks, [p.numpy().copy() for p in params]

    eager, pure = run(False), run("pure")
    assert eager[1] == pure[1] and eager[1] > 0
    assert eager[0] == pure[0]
    for a, b in zip(eager[2], pure[2]):
        assert_bitwise(a, b)
