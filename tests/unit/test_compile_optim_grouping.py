"""``pg.compile(pure=True)`` keeps eager's grouping of the concatenated optimizer update when the
update numbers of parameters change after capture.

Eager updates small parameters whose rules have equal numbers (learning rate, betas, weight decay,
bias corrections) as one concatenation (:mod:`polygrad.optim.multi_tensor`), and numpy's ``+`` and
``*`` of two NaN operands keep one or the other depending on where the element falls in the array
(vector body or scalar tail).  So when two parameter groups captured with different numbers later
get equal ones (``ReduceLROnPlateau`` reaching ``min_lr``, a schedule decaying to 0, a user setting
equal rates), eager starts updating them as one concatenation; a replay of the two captured calls
gave other NaN bits (finite values are the same).  The replay now re-derives eager's grouping and
faults (the call runs eagerly, and the step is captured again) when it differs from the captured
one; the other direction (grouped at capture, different numbers later) was already a fault.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import optim
from polygrad.optim.lr_scheduler import ReduceLROnPlateau
from tests.helpers import sum_of_products_step
from tests.unit.test_compile_optim_nan_bits import _bits, _nan
from tests.unit.test_compile_optim_nan_bits import _case as nan_bits_case

CALLS = 8


def _set_equal(opt: Any, k: int) -> None:
    if k == 4:
        opt.param_groups[1]["lr"] = opt.param_groups[0]["lr"]


def _set_apart(opt: Any, k: int) -> None:
    if k == 4:
        opt.param_groups[1]["lr"] = 2 * opt.param_groups[0]["lr"]


def _plateau(opt: Any, k: int) -> None:
    """ReduceLROnPlateau halves both groups' rates on every call (the metric never improves)
    until both sit at ``min_lr``: from then on they are equal."""
    sched = opt.__dict__.setdefault("_test_plateau", ReduceLROnPlateau(opt, factor=0.5, patience=0,
                                                                        min_lr=0.004))
    sched.step(1.0)


#: (optimizer, its arguments, the two groups' learning rates, what happens between calls, lr_schedule)
SCENARIOS: dict[str, tuple] = {
    "user sets equal rates": (optim.Adam, {}, (0.01, 0.02), _set_equal, None),
    "user sets equal rates (SGD)": (optim.SGD, {"momentum": 0.9}, (0.1, 0.2), _set_equal, None),
    "ReduceLROnPlateau reaches min_lr": (optim.Adam, {}, (0.01, 0.02), _plateau, None),
    "a schedule decaying to 0": (optim.SGD, {}, (0.1, 0.2), None, lambda k: max(0.0, 1.0 - k / 4)),
    "a schedule decaying to 0 (Adam)": (optim.Adam, {}, (0.1, 0.2), None, lambda k: max(0.0, 1.0 - k / 4)),
    "equal rates set apart": (optim.Adam, {}, (0.01, 0.01), _set_apart, None),
}


def _params_and_state(opt: Any, params: list) -> list:
    """Each parameter's bits, then its optimizer state's (arrays as bits, numbers as they are)."""
    seen: list = []
    for p in params:
        seen.append(_bits(p))
        seen += [_bits(v) if hasattr(v, "shape") else v for _, v in sorted(opt.state[id(p)].items())]
    return seen


def _run(scenario: tuple, dtype: type, values: list, inputs: list, compiled: bool) -> tuple[list, Any]:
    cls, kwargs, lrs, between, schedule = scenario
    params = [pg.tensor(v.copy(order="K"), dtype=dtype, requires_grad=True) for v in values]
    half = len(params) // 2
    extra = {"lr_schedule": schedule} if schedule is not None else {}
    opt = cls([{"params": params[:half], "lr": lrs[0]}, {"params": params[half:], "lr": lrs[1]}], **kwargs, **extra)

    step = sum_of_products_step(opt, params)

    f = pg.compile(step, pure=True) if compiled else step
    seen = []
    with np.errstate(all="ignore"):
        for k, xs in enumerate(inputs):
            if between is not None:
                between(opt, k)
            seen.append(_bits(f(*[pg.tensor(x, dtype=dtype) for x in xs])))
            seen += _params_and_state(opt, params)
    return seen, f


def _assert_same(want: list, got: list) -> None:
    assert len(want) == len(got)
    for i, (u, v) in enumerate(zip(want, got)):
        if isinstance(u, np.ndarray):
            assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), (i, u, v)
        else:
            assert u == v, (i, u, v)


def _reviewers_case(dtype: type) -> tuple[list, list]:
    """A 33-element weight and a 4-element bias (one group each): the bias's NaN parameter and
    NaN gradient meet in the scalar tail of its own update and in the vector body of the
    concatenation after the weight (or the other way round), with different signs."""
    pos, neg = _nan(dtype, False, 1 << 22), _nan(dtype, True, 5)
    w = np.linspace(-1, 1, 33).astype(dtype)
    w[[3, 30, 32]] = pos
    b = np.array([pos, 0.5, neg, 1.0], dtype=dtype)
    xs = [[np.where(np.arange(33) % 2 == 0, v, 1.0).astype(dtype), np.array([v, v, v, 1.0], dtype=dtype)]
          for v in (neg, pos, neg, neg, pos, neg, pos, neg)]
    return [w, b], xs[:CALLS]


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_grouping_change_after_capture_keeps_eager_nan_bits(name: str, dtype: type) -> None:
    values, inputs = _reviewers_case(dtype)
    want, _ = _run(SCENARIOS[name], dtype, values, inputs, False)
    got, f = _run(SCENARIOS[name], dtype, values, inputs, True)
    _assert_same(want, got)
    assert f.stats["replays"] >= 1, f.stats  # replays ran (before the change, and after recapture)


@pytest.mark.parametrize("name", ["user sets equal rates", "a schedule decaying to 0"])
def test_the_grouping_change_is_a_fault_then_a_new_capture(name: str) -> None:
    """The change is noticed at the replay (a dropped capture, the call eager), and the step is
    captured again with eager's new grouping, which later calls replay."""
    from polygrad.compile.program import CALL
    from polygrad.optim.replay_numbers import GroupingCheck
    values, inputs = _reviewers_case(np.float64)
    _, f = _run(SCENARIOS[name], np.float64, values, inputs, True)
    # calls: eager, two captures, a replay, the change (a fault: eager), two captures, a replay
    assert (f.stats["dropped"], f.stats["captures"], f.stats["replays"]) == (1, 4, 2), f.stats
    calls = [e for entry in f._cache.values() for e in entry.capture.program if e[0] == CALL]
    # the new capture updates both groups in one call: nothing left to check
    assert calls and not any(isinstance(e[4], GroupingCheck) for e in calls)


def test_the_grouping_guard_is_not_needed_when_every_member_is_in_one_call() -> None:
    """One parameter group sharing one rule: a single concatenated call, whose numbers already
    must stay equal (no separate grouping check is recorded)."""
    from polygrad.compile.program import CALL
    from polygrad.optim.replay_numbers import GroupingCheck
    values, inputs = _reviewers_case(np.float64)
    cls, kwargs, _, _, _ = SCENARIOS["user sets equal rates"]
    _, f = _run((cls, kwargs, (0.01, 0.01), None, None), np.float64, values, inputs, True)
    calls = [e for entry in f._cache.values() if entry.capture is not None
             for e in entry.capture.program if e[0] == CALL]
    assert calls and not any(isinstance(e[4], GroupingCheck) for e in calls)


def _case() -> Any:
    return nan_bits_case(shapes_from=((1,), (3,), (4,), (9,), (17,), (33,), (3, 5)), calls=6)


@settings(max_examples=40, deadline=None)
@given(case=_case(), name=st.sampled_from(list(SCENARIOS)))
def test_grouping_changes_keep_eager_bits_for_random_values(case: tuple, name: str) -> None:
    dtype, values, inputs = case
    want, _ = _run(SCENARIOS[name], dtype, values, inputs, False)
    got, _ = _run(SCENARIOS[name], dtype, values, inputs, True)
    _assert_same(want, got)




@pytest.mark.parametrize("lrs, change", [((0.1, 0.2), 0.1), ((0.1, 0.1), 0.3)])
def test_a_grouping_change_in_a_second_optimizer_runs_the_call_eagerly(lrs: tuple, change: float) -> None:
    """Two optimizers in one step (a GAN): the second one's grouping changes after capture (its
    groups' rates set equal, or set apart).  The check runs before the first optimizer's step, so
    the replay faults before anything is updated and the call runs eagerly with eager's bits --
    not after the first step, where it could only raise."""
    dtype = np.float32
    values, inputs = _reviewers_case(dtype)

    def run(compiled: bool) -> tuple[list, Any]:
        a = [pg.tensor(v.copy(), requires_grad=True) for v in values]
        b = [pg.tensor(v.copy(), requires_grad=True) for v in values]
        o1 = optim.Adam(a, lr=0.01)
        o2 = optim.Adam([{"params": b[:1], "lr": lrs[0]}, {"params": b[1:], "lr": lrs[1]}])

        def step(x: Any, y: Any) -> Any:
            o1.zero_grad()
            o2.zero_grad()
            loss = (a[0] * x).sum() + (a[1] * y).sum() + (b[0] * x).sum() + (b[1] * y).sum()
            loss.backward()
            o1.step()
            o2.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for k, (x, y) in enumerate(inputs):
                if k == 4:
                    o2.param_groups[1]["lr"] = change
                seen.append(_bits(f(pg.tensor(x), pg.tensor(y))))
                for opt, ps in ((o1, a), (o2, b)):
                    seen += _params_and_state(opt, ps)
        return seen, f

    want, _ = run(False)
    got, f = run(True)
    _assert_same(want, got)
    assert f.stats["dropped"] == 1 and f.stats["replays"] >= 2, f.stats


@pytest.mark.parametrize("cls, kwargs", [(optim.Adam, {"lr": 0.01}), (optim.SGD, {"lr": 0.1, "momentum": 0.9})])
def test_parameters_of_one_group_in_different_states_get_their_own_numbers(cls: type, kwargs: dict) -> None:
    """A parameter skipped by one call (no gradient) lags its group's others: Adam's step (bias
    corrections), SGD's momentum buffer (none yet).  Eager then updates it apart; a replay computes
    each state's rule -- the one-rule-per-state shortcut (``_rule_inputs``) must not hand it the
    others' numbers."""
    dtype = np.float64
    values, inputs = _reviewers_case(dtype)
    values = [values[0], values[1], values[1][::-1].copy()]

    def run(compiled: bool) -> tuple[list, Any]:
        ps = [pg.tensor(v.copy(), requires_grad=True) for v in values]
        opt = cls(ps, **kwargs)

        def step(x: Any, y: Any, skip: bool) -> Any:
            opt.zero_grad()
            loss = (ps[0] * x).sum() + (ps[1] * y).sum()
            if not skip:
                loss = loss + (ps[2] * y).sum()
            loss.backward()
            opt.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for k, (x, y) in enumerate(inputs + inputs):
                seen.append(_bits(f(pg.tensor(x), pg.tensor(y), k == 3)))
                seen += _params_and_state(opt, ps)
        return seen, f

    want, _ = run(False)
    got, f = run(True)
    _assert_same(want, got)
    assert f.stats["replays"] >= 4, f.stats


def test_a_subclass_that_overrides_the_rule_alone_gets_a_rule_per_parameter() -> None:
    """``_rule_inputs`` describes the ``_rule`` of the class that declares it: a subclass with its
    own ``_rule`` (which may read anything of the state) is not given the shortcut."""
    from polygrad.optim.replay_numbers import _rule_inputs

    class Mine(optim.Adam):
        def _rule(self, lr: float, group: Any, state: dict) -> Any:
            return super()._rule(lr * state.get("scale", 1.0), group, state)

    p = [pg.tensor(np.ones(3), requires_grad=True)]
    assert _rule_inputs(optim.AdamW(p)) is not None and _rule_inputs(optim.SGD(p, lr=0.1)) is not None
    assert _rule_inputs(Mine(p)) is None


# -- review fixes (round 8) ----------------------------------------------------------------------------

def _nan_laden(shape: tuple, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=shape).astype(np.float32)
    bits = v.view(np.uint32)
    nan_at = rng.random(shape) < 0.5
    bits[nan_at] = rng.choice(np.array([0x7FC00001, 0xFFC00002, 0x7FC0BEEF, 0xFFC00000], dtype=np.uint32),
                              size=int(nan_at.sum()))
    return v


@pytest.mark.parametrize("hyper", ["lr", "weight_decay"])
def test_a_nan_hyper_parameter_keeps_eagers_bits(hyper: str) -> None:
    """Eager computes a rule per parameter, so NaN numbers (an lr set to nan) differ between
    parameters (NaN != NaN) and eager updates each alone; the replay's one rule per group made
    them compare equal and kept the captured concatenation (other NaN bits).  Now the replay
    updates them apart, as eager."""
    def run(compiled: bool):
        ps = [pg.tensor(_nan_laden(s, 20 + i), requires_grad=True) for i, s in enumerate([(16,), (9,), (4,)])]
        opt = optim.Adam(ps, lr=0.01, weight_decay=0.1)
        xs = [[pg.tensor(_nan_laden(p.shape, 100 + 7 * k + i)) for i, p in enumerate(ps)] for k in range(7)]

        def step(*x):
            opt.zero_grad()
            loss = sum(((p * xi).sum() for p, xi in zip(ps, x)), pg.tensor(np.float32(0.0)))
            loss.backward()
            opt.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        for k in range(7):
            if k == 4:
                opt.param_groups[0][hyper] = float("nan")
            f(*xs[k])
        state = [opt.state[id(p)][name].tobytes() for p in ps for name in ("exp_avg", "exp_avg_sq")] \
            if hasattr(opt, "state") and all(id(p) in opt.state for p in ps) else []
        return [p.numpy().tobytes() for p in ps], state, getattr(f, "stats", None)

    eager, compiled = run(False), run(True)
    assert compiled[0] == eager[0] and compiled[1] == eager[1]
    assert compiled[2]["replays"] >= 4  # replayed on, each member apart (multi_tensor.Apart)


def test_a_scheduler_stepped_before_the_optimizer_does_not_stop_training_when_rates_meet() -> None:
    """The grouping check cannot fault after a host call that cannot be repeated (a scheduler's
    step inside the step): the rates of two groups decaying to 0 used to raise StaleCapture mid-
    training; now the replay keeps the captured grouping and gives eager's finite numbers."""
    from polygrad.optim.lr_scheduler import LambdaLR

    def run(compiled: bool):
        w = pg.tensor(np.linspace(-1, 1, 6), requires_grad=True)
        b = pg.tensor(np.array([0.5, -0.5, 1.5]), requires_grad=True)
        opt = optim.Adam([{"params": [w], "lr": 0.01}, {"params": [b], "lr": 0.02}])
        sched = LambdaLR(opt, [lambda e: max(0.0, 1 - e / 4), lambda e: max(0.0, 1 - e / 4)])

        def step(x, y):
            opt.zero_grad()
            sched.step()
            loss = (w * x).sum() + (b * y).sum()
            loss.backward()
            opt.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        x, y = pg.tensor(np.arange(6.0)), pg.tensor(np.arange(3.0))
        for _ in range(8):
            f(x, y)
        return [p.numpy().tobytes() for p in (w, b)]

    assert run(True) == run(False)


def test_a_host_callback_that_draws_keeps_the_random_stream_across_a_fault() -> None:
    """A replay that faults re-runs the call eagerly after restoring the generator; a user's host
    callback that draws counts as drawing (it did not: the stream moved on twice)."""
    from polygrad.compile import host_call

    def run(compiled: bool):
        pg.manual_seed(3)
        b = pg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        c = pg.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
        opt = optim.SGD([b, c], lr=0.01)

        def draw():
            pg.rng().random()

        def step(x):
            opt.zero_grad()
            host_call(draw, idempotent=True)
            draw()
            loss = ((b * c) * x).sum()
            loss.backward()
            opt.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        for k in range(6):
            if k == 4:
                opt.param_groups[0]["momentum"] = 0.9  # the rule changes: the replay faults
            f(pg.tensor(np.array([1.0, 2.0, 3.0])))
        return pg.rng().bit_generator.state["state"]["state"], [p.numpy().tobytes() for p in (b, c)]

    assert run(True) == run(False)


@pytest.mark.parametrize("cls, kwargs", [(optim.Adam, {}), (optim.SGD, {"momentum": 0.9}), (optim.SGD, {})])
@pytest.mark.parametrize("scheduler_first", [False, True])
def test_a_concatenation_whose_numbers_part_runs_its_members_as_eager_groups_them(
        cls: type, kwargs: dict, scheduler_first: bool) -> None:
    """Three groups captured with equal rates (one concatenation); then the third's rate parts
    (a LambdaLR stepped inside the step, before or after the optimizer): eager updates the first
    two together and the third alone, and so does the replay (multi_tensor.Apart), with eager's
    NaN bits, and without stopping the training where the scheduler ran first."""
    from polygrad.optim.lr_scheduler import LambdaLR

    def run(compiled: bool):
        params = [pg.tensor(_nan_laden(s, 40 + i), requires_grad=True) for i, s in enumerate([(9,), (16,), (5,)])]
        opt = cls([{"params": [p], "lr": 0.01} for p in params], **kwargs)
        sched = LambdaLR(opt, [lambda e: 1.0, lambda e: 1.0, lambda e: 1.0 if e < 4 else 0.5])
        inner = sum_of_products_step(opt, params)

        def step(*xs):
            if scheduler_first:
                sched.step()
            loss = inner(*xs)
            if not scheduler_first:
                sched.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for k in range(8):
                xs = [pg.tensor(_nan_laden(p.shape, 200 + 5 * k + i)) for i, p in enumerate(params)]
                seen.append(_bits(f(*xs)))
                seen += _params_and_state(opt, params)
        return seen, f

    (want, _), (got, f) = run(False), run(True)
    assert len(want) == len(got) and all(np.array_equal(u, v) for u, v in zip(want, got))
    assert f.stats["replays"] >= 4, f.stats
