"""``pg.compile(pure=True)`` gives eager's bits for an optimizer's state and parameters even when
they hold NaNs of both signs and payloads (hypothesis, float32 and float64).

Eager updates small parameters sharing a rule as one concatenation
(:mod:`polygrad.optim.multi_tensor`); numpy's ``+`` and ``*`` of two NaN operands keep one or the
other depending on where the element falls in the array (vector body or scalar tail), so a capture
that updated each parameter alone gave other NaN bits (``0xffc00000`` for eager's ``0x7fc00000``
in Adam's ``exp_avg``).  The capture now records the same concatenated call."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import optim
from tests.helpers import assert_bitwise, sum_of_products_step

OPTIMIZERS = [
    (optim.Adam, {"lr": 0.01}),
    (optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    (optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True}),
    (optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.1, "weight_decay": 0.01}),
]
#: tiny parameters (eager batches them) and ones past a SIMD vector of float32 or float64
SHAPES = [(1,), (2,), (3,), (4,), (7,), (8,), (9,), (16,), (17,), (33,), (3, 5), (2, 1, 4)]
CALLS = 5  # an eager call, two captures, replays


def _nan(dtype: type, negative: bool, payload: int) -> Any:
    uint, quiet_exp, mant_bits = ((np.uint32, 0x7F800000, 23) if dtype == np.float32
                                  else (np.uint64, 0x7FF0000000000000, 52))
    payload = payload % (1 << mant_bits) or 1
    sign = 1 << (8 * np.dtype(dtype).itemsize - 1)
    return np.array([quiet_exp | payload | (sign if negative else 0)], dtype=uint).view(dtype)[0]


def _element(dtype: type) -> st.SearchStrategy:
    width = 32 if dtype == np.float32 else 64
    return st.one_of(
        st.builds(lambda neg, pay: _nan(dtype, neg, pay), st.booleans(), st.integers(0, 1 << 52)),
        st.sampled_from([np.inf, -np.inf, -0.0, 0.0]),
        st.floats(-4.0, 4.0, width=width),
    )


@st.composite
def _case(draw: Any, shapes_from: Sequence[tuple] = tuple(SHAPES), calls: int = CALLS) -> tuple:
    """``(dtype, params, inputs)``: 2-4 parameters of shapes from ``shapes_from`` (2-D ones C- or
    Fortran-ordered) and ``calls`` calls' inputs, NaNs of both signs and payloads, inf and -0.0 among them."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shapes = draw(st.lists(st.sampled_from(shapes_from), min_size=2, max_size=4))
    elem = _element(dtype)

    def array(shape: tuple) -> np.ndarray:
        n = int(np.prod(shape))
        a = np.array(draw(st.lists(elem, min_size=n, max_size=n)), dtype=dtype).reshape(shape)
        return np.asfortranarray(a) if len(shape) > 1 and draw(st.booleans()) else a

    params = [array(s) for s in shapes]
    inputs = [[array(s) for s in shapes] for _ in range(calls)]
    return dtype, params, inputs


def _bits(a: Any) -> np.ndarray:
    a = np.array(a.numpy() if hasattr(a, "numpy") else a, copy=True)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _run(cls: type, kwargs: dict, case: tuple, compiled: bool) -> list:
    dtype, values, inputs = case
    params = [pg.tensor(v.copy(order="K"), dtype=dtype, requires_grad=True) for v in values]
    opt = cls(params, **kwargs)

    step = sum_of_products_step(opt, params)

    f = pg.compile(step, pure=True) if compiled else step
    seen = []
    with np.errstate(all="ignore"):
        for xs in inputs:
            loss = f(*[pg.tensor(x, dtype=dtype) for x in xs])
            seen.append(_bits(loss))
            for p in params:
                seen += [_bits(p), _bits(p.grad)]
                seen += [_bits(v) if hasattr(v, "shape") else v for _, v in sorted(opt.state[id(p)].items())]
    if compiled:
        assert f.stats["replays"] >= 1, f.stats  # the replay path was exercised, not only captures
    return seen


@settings(max_examples=60, deadline=None)
@given(case=_case(), which=st.sampled_from(range(len(OPTIMIZERS))))
def test_compiled_optimizer_state_has_eager_nan_bits(case: tuple, which: int) -> None:
    cls, kwargs = OPTIMIZERS[which]
    want, got = _run(cls, kwargs, case, False), _run(cls, kwargs, case, True)
    assert len(want) == len(got)
    for i, (u, v) in enumerate(zip(want, got)):
        if isinstance(u, np.ndarray):
            assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), (i, u, v)
        else:
            assert u == v, (i, u, v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tiny_parameter_batched_after_a_longer_one_keeps_eager_nan_bits(dtype: type) -> None:
    """The reviewer's case in small: Adam's moments of a 4-element bias updated after a 33-element
    weight, a positive NaN in the moments and a negative NaN gradient."""
    pos, neg = _nan(dtype, False, 1 << 22), _nan(dtype, True, 1 << 22)
    w = np.linspace(-1, 1, 33).astype(dtype)
    b = np.array([pos, 0.5, -0.5, 1.0], dtype=dtype)
    xs = [[np.ones(33, dtype), np.array([v, v, v, 1.0], dtype=dtype)] for v in (pos, neg, neg, pos, neg)]
    case = (dtype, [w, b], xs)
    want, got = _run(optim.Adam, {"lr": 0.01}, case, False), _run(optim.Adam, {"lr": 0.01}, case, True)
    for u, v in zip(want, got):
        assert np.array_equal(u, v), (u, v)


@pytest.fixture
def two_threads() -> Any:
    before = pg.get_num_threads()
    pg.set_num_threads(2)
    yield
    pg.set_num_threads(before)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN products on kernel threads (errstate is per thread)
@pytest.mark.parametrize("cls, kwargs", [OPTIMIZERS[0], OPTIMIZERS[2], OPTIMIZERS[3]])
def test_a_parameter_updated_in_blocks_keeps_eager_nan_bits(two_threads: Any, cls: type, kwargs: dict) -> None:
    """A parameter of at least ``PARALLEL_MIN`` elements is updated in blocks on polygrad's threads
    (polygrad.optim.blocked_update): a block's last elements are numpy's scalar tail where the whole
    array's are not, so the capture records the same blocked update."""
    from polygrad.optim.blocked_update import PARALLEL_MIN
    n = PARALLEL_MIN + 3  # blocks whose lengths are not a multiple of a SIMD vector
    pos, neg = _nan(np.float32, False, 1 << 22), _nan(np.float32, True, 5)
    w = np.full(n, pos, np.float32)
    b = np.array([pos, 1.0, neg], np.float32)
    xs = [[np.full(n, v, np.float32), np.array([v, 1.0, v], np.float32)] for v in (neg, pos, neg, neg, pos)]
    case = (np.float32, [w, b], xs)
    want, got = _run(cls, kwargs, case, False), _run(cls, kwargs, case, True)
    for u, v in zip(want, got):
        assert np.array_equal(u, v), (u, v)


def test_members_whose_numbers_part_are_updated_apart_as_eager_does() -> None:
    """Two groups' parameters share a rule, so eager and the capture update them as one
    concatenation; once one group's learning rate is set apart between calls, eager updates them
    apart, and so does the replay (it does not run the concatenated call)."""
    def run(compiled: bool) -> tuple:
        w = pg.tensor(np.linspace(-1, 1, 20).astype(np.float32), requires_grad=True)
        b = pg.tensor(np.array([0.5, -0.5, 1.0], np.float32), requires_grad=True)
        opt = optim.Adam([{"params": [w]}, {"params": [b]}], lr=0.01)

        def step(x: Any) -> Any:
            opt.zero_grad()
            loss = (w * x).sum() + (b * b).sum()
            loss.backward()
            opt.step()
            return loss

        f = pg.compile(step, pure=True) if compiled else step
        seen = []
        for k in range(7):
            if k == 4:
                opt.param_groups[1]["lr"] = 0.02
            f(pg.tensor(np.full(20, k + 1.0, np.float32)))
            seen += [_bits(w), _bits(b)]
            seen += [_bits(opt.state[id(p)][n]) for p in (w, b) for n in ("exp_avg", "exp_avg_sq")]
        return seen, f

    (want, _), (got, f) = run(False), run(True)
    for u, v in zip(want, got):
        assert np.array_equal(u, v)
    # the replay runs the members apart as eager does (multi_tensor.Apart): no fault needed
    assert f.stats["dropped"] == 0 and f.stats["replays"] >= 3, f.stats


def _state_set_to_float64(compiled: bool) -> list:
    w = pg.tensor(np.linspace(-1, 1, 33).astype(np.float32), requires_grad=True)
    b = pg.tensor(np.array([0.3, 0.5, -0.5, 1.0], np.float32), requires_grad=True)
    opt = optim.Adam([w, b], lr=0.01)

    def step(x):
        opt.zero_grad()
        loss = (w * x).sum() + (b * b).sum()
        loss.backward()
        opt.step()
        return loss

    fn = pg.compile(step, pure=True) if compiled else step
    for k in range(5):
        if k == 3:  # user code writes a float64 moment for b straight into the state
            st = opt.state[id(b)]
            st["exp_avg"] = st["exp_avg"].astype(np.float64)
        fn(pg.tensor(np.full(33, 0.1 * (k + 1), np.float32)))
    return [w.numpy(), b.numpy()] + [v for k in (id(w), id(b)) for v in opt.state[k].values() if hasattr(v, "dtype")]


def test_a_member_state_of_another_dtype_does_not_promote_the_others():
    """Review of round 7: the concatenated update of a replay followed one member's float64 state
    into a float64 ``w`` (eager updates the two apart); the replay now faults to eager."""
    got, want = _state_set_to_float64(True), _state_set_to_float64(False)
    assert [a.dtype for a in got] == [a.dtype for a in want]
    assert_bitwise(got, want)
