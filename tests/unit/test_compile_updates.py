"""Optimizer updates recorded as ``Call`` entries of a pure capture (``Optimizer._rule``): a replay
runs each parameter's update rule with numbers derived again from the live hyper-parameters and
state, and must give eager's bits -- parameters, optimizer state, step counters -- whatever the
optimizer, its options and the dtype; what changes the rule's shape between calls runs eagerly."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.compile import Call, Host
from tests.helpers import assert_bitwise

compile_pure = functools.partial(pg.compile, pure=True)

OPTIMIZERS = {
    "sgd": lambda ps, lr, wd, m: optim.SGD(ps, lr=lr, weight_decay=wd),
    "sgd-momentum": lambda ps, lr, wd, m: optim.SGD(ps, lr=lr, momentum=m, dampening=0.1, weight_decay=wd),
    "sgd-nesterov": lambda ps, lr, wd, m: optim.SGD(ps, lr=lr, momentum=m, nesterov=True, weight_decay=wd),
    "adam": lambda ps, lr, wd, m: optim.Adam(ps, lr=lr, weight_decay=wd),
    "adamw": lambda ps, lr, wd, m: optim.AdamW(ps, lr=lr, weight_decay=wd),
}


def _setup(kind: str, lr: float, wd: float, momentum: float, dtype, seed: int, schedule=None):
    pg.manual_seed(seed)
    model = nn.MLP(3, [5, 2], dtype=dtype)
    x = pg.tensor(np.random.default_rng(seed).normal(size=(7, 3)), dtype=dtype)
    y = pg.tensor(np.random.default_rng(seed + 1).normal(size=(7, 2)), dtype=dtype)
    opt = OPTIMIZERS[kind](model.parameters(), lr, wd, momentum)
    if schedule is not None:
        opt.lr_schedule = schedule

    def step():
        opt.zero_grad()
        loss = nn.mse(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return model, opt, step


def _state(model, opt) -> list:
    sd = opt.state_dict()
    state = [[k, sorted((name, np.array(v.numpy() if isinstance(v, pg.Tensor) else v))
                        for name, v in st_.items())] for k, st_ in sorted(sd["state"].items())]
    return [[p.numpy().copy() for p in model.parameters()], state, opt.step_count]


def _compare(kind, lr, wd, momentum, dtype, seed, calls, between=None):
    """Eager and compiled runs of the same step from the same start; ``between(k, opt)`` runs before
    call ``k`` in both.  Returns the compiled function."""
    runs = []
    for compiled in (False, True):
        model, opt, step = _setup(kind, lr, wd, momentum, dtype, seed)
        fn = compile_pure(step) if compiled else step
        losses = []
        for k in range(calls):
            if between is not None:
                between(k, opt)
            losses.append(np.array(fn().numpy()))
        runs.append((losses, _state(model, opt), fn))
    (eager_losses, eager_state, _), (losses, state, fn) = runs
    for k, (a, b) in enumerate(zip(eager_losses, losses)):
        assert_bitwise(a, b, f"loss of call {k}")
    for where, a, b in zip(("parameters", "state", "step_count"), eager_state, state):
        if where == "state":
            for (ka, ia), (kb, ib) in zip(a, b):
                assert ka == kb and [n for n, _ in ia] == [n for n, _ in ib]
                for (name, va), (_, vb) in zip(ia, ib):
                    assert_bitwise(va, vb, f"state {ka} {name}")
        elif where == "parameters":
            for i, (pa, pb) in enumerate(zip(a, b)):
                assert_bitwise(pa, pb, f"parameter {i}")
        else:
            assert a == b
    return fn


def _program(fn):
    (entry,) = fn._cache.values()
    return entry.capture.program


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(OPTIMIZERS)), lr=st.floats(1e-3, 0.5), wd=st.sampled_from([0.0, 1e-3, 0.05]),
       momentum=st.floats(0.1, 0.95), dtype=st.sampled_from([pg.float32, pg.float64]), seed=st.integers(0, 2**16))
def test_recorded_updates_replay_bit_for_bit(kind, lr, wd, momentum, dtype, seed):
    fn = _compare(kind, lr, wd, momentum, dtype, seed, calls=7)
    assert fn.stats["replays"] == 4 and fn.stats["dropped"] == 0
    program = _program(fn)
    calls = [e for e in program if isinstance(e, Call)]
    # the four parameters (two weights, two biases) updated as one concatenation, as eager does
    # (the same NaN bits: polygrad.optim.multi_tensor.Together)
    assert len(calls) == 1 and len(calls[0].fn.shapes) == 4
    assert all(e.fn.__module__.startswith("polygrad.optim") for e in calls)
    hosts = [e.method for e in program if isinstance(e, Host)]
    assert [getattr(h, "__name__", type(h).__name__) for h in hosts] == ["zero_grad", "_Advance"]


def test_learning_rates_set_between_calls_and_schedules_are_read_live():
    def between(k, opt):
        for g in opt.param_groups:
            g["lr"] = 0.1 / (k + 1)
    _compare("adam", 0.1, 0.0, 0.9, pg.float64, 3, calls=8, between=between)
    model, opt, step = _setup("sgd-momentum", 0.2, 0.0, 0.9, pg.float64, 4, schedule=lambda k: 1.0 / (1 + k))
    eager = [step().item() for _ in range(6)]
    model, opt, step = _setup("sgd-momentum", 0.2, 0.0, 0.9, pg.float64, 4, schedule=lambda k: 1.0 / (1 + k))
    fn = compile_pure(step)
    assert [fn().item() for _ in range(6)] == eager and fn.stats["replays"] == 3


def test_a_rule_that_changes_shape_between_calls_runs_that_call_eagerly():
    def between(k, opt):
        if k == 5:   # momentum turned on: SGD's rule gains a buffer
            opt.param_groups[0]["momentum"] = 0.5
    fn = _compare("sgd", 0.1, 0.0, 0.0, pg.float64, 5, calls=9, between=between)
    assert fn.stats["dropped"] == 1 and fn.stats["replays"] >= 1


def test_state_loaded_between_calls_is_what_the_replay_reads():
    saved = {}

    def between(k, opt):
        if k == 2:
            saved["sd"] = opt.state_dict()
        if k == 6:
            opt.load_state_dict(saved["sd"])   # new state dicts: the replay must read them
    _compare("adam", 0.05, 1e-3, 0.9, pg.float32, 6, calls=9, between=between)


def test_cleared_state_runs_the_call_eagerly():
    def between(k, opt):
        if k == 5:
            opt.state.clear()
    fn = _compare("adam", 0.05, 0.0, 0.9, pg.float64, 7, calls=8, between=between)
    assert fn.stats["dropped"] == 1


def test_an_error_of_the_schedule_in_a_replay_is_the_users_and_keeps_the_capture():
    model, opt, step = _setup("adam", 0.1, 0.0, 0.9, pg.float64, 8, schedule=lambda k: 1.0 if k < 4 else -1.0)
    fn = compile_pure(step)
    for _ in range(4):
        fn()
    with pytest.raises(ValueError, match="lr_schedule"):
        fn()
    assert fn.stats["dropped"] == 0 and opt.step_count == 4


class _OwnUpdate(optim.Optimizer):
    """A third party's optimizer written against ``_update`` alone: it steps as host code."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    def _update(self, x, g, lr, group, state, fast):
        return x - lr * g


def test_an_optimizer_without_a_rule_steps_as_host_code():
    def make():
        pg.manual_seed(0)
        w = pg.randn(3, 2, requires_grad=True)
        opt = _OwnUpdate([w])

        def step():
            opt.zero_grad()
            loss = (w * w).sum()
            loss.backward()
            opt.step()
            return loss
        return w, step
    w, step = make()
    eager = [step().item() for _ in range(5)]
    w2, step2 = make()
    fn = compile_pure(step2)
    assert [fn().item() for _ in range(5)] == eager
    assert not any(isinstance(e, Call) for e in _program(fn))
    assert_bitwise(w.numpy(), w2.numpy())
