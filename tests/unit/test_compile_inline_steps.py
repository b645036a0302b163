"""The cross-entropy inlining pass (compile/inline_steps.py) against eager: a pure replay that runs
the loss's steps as kernel entries of its own -- the backward reading the forward's ``x - max``,
``exp`` and row sums instead of recomputing them -- gives eager's bits, for generated logits with
NaN payloads of both signs, signed zeros, infinities and huge values, float32/64, C- and
Fortran-ordered, every reduction, one class, no rows; and it stands for the fused kernel only as
long as the registry still holds that kernel."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.compile import inline_steps
from polygrad.ir.ops import Op
from polygrad.runtime.registry import registry
from polygrad.testing import inject_fault
from tests.helpers import assert_bitwise, observed

CE = (Op.CROSS_ENTROPY, "dense")


@pytest.fixture(autouse=True)
def _tables_built():
    """The registry builds its kernel tables on first dispatch; these tests read them."""
    pg.tensor(np.zeros(1)) + 1.0


def _nan(dtype: type, negative: bool, payload: int) -> float:
    """A quiet NaN of ``dtype`` with this sign and (nonzero) payload bits."""
    if dtype is np.float32:
        bits = np.uint32(0x7FC00000 | (payload & 0x3FFFFF) | (0x80000000 if negative else 0))
        return np.array([bits], dtype=np.uint32).view(np.float32)[0]
    bits64 = np.uint64(0x7FF8000000000000 | (payload & 0xFFFFFFFFFFFF) | (0x8000000000000000 if negative else 0))
    return np.array([bits64], dtype=np.uint64).view(np.float64)[0]


def _logits(data: st.DataObject, dtype: type, n: int, c: int) -> np.ndarray:
    x = np.asarray(data.draw(st.lists(st.floats(-30, 30, width=32), min_size=n * c, max_size=n * c)),
                   dtype=dtype).reshape(n, c)
    specials = data.draw(st.lists(st.tuples(st.integers(0, max(n * c - 1, 0)),
                                            st.sampled_from(["nan", "-nan", "inf", "-inf", "-0", "0", "huge", "-huge"]),
                                            st.integers(1, 2 ** 20)), max_size=4))
    big = np.finfo(dtype).max / 4
    for at, kind, payload in specials if n * c else ():
        x.flat[at] = (_nan(dtype, kind == "-nan", payload) if kind.endswith("nan") else
                      {"inf": np.inf, "-inf": -np.inf, "-0": -0.0, "0": 0.0, "huge": big, "-huge": -big}[kind])
    return np.asfortranarray(x) if data.draw(st.booleans()) else x


def _captures(f) -> list:
    return [e for entry in f._cache.values() if entry.capture is not None for e in entry.capture.program]


def _run(x: np.ndarray, y: np.ndarray, reduction: str, compiled: bool, calls: int = 5):
    # Fortran-ordered logits reach the kernels as a transpose of a C-ordered leaf (pg.tensor copies
    # what it is given into C order)
    fortran = x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous
    if fortran:
        x = np.ascontiguousarray(x.T)

    def step(t):
        loss = nn.cross_entropy(t.T if fortran else t, y, reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        return loss

    f = pg.compile(step, pure=True) if compiled else step
    seen = []
    for _ in range(calls):
        t = pg.tensor(x, requires_grad=True)
        seen.append([observed(f(t)), observed(t.grad)])
    return seen, f


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_inlined_cross_entropy_replays_eager_bits(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    n, c = data.draw(st.integers(0, 9)), data.draw(st.integers(1, 6))
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    x = _logits(data, dtype, n, c)
    y = np.asarray(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager, _ = _run(x, y, reduction, compiled=False)
        replayed, f = _run(x, y, reduction, compiled=True)
    assert f.stats["replays"] >= 2, f.stats
    program = _captures(f)
    assert not any(e[0] in (3, 4) and e[2] == CE for e in program)  # the steps replayed, not the kernel
    assert_bitwise(replayed, eager)


def test_backward_reads_the_forward_steps_instead_of_recomputing_them():
    x = np.random.default_rng(0).standard_normal((6, 4))
    _, f = _run(x, np.arange(6) % 4, "mean", compiled=True)
    kernels = [e[2][0] for e in _captures(f) if e[0] == 3]
    # forward: max, neg, add, exp, sum (the shift and the row sums) once each; the backward's
    # recomputation of them reads the forward's slots
    assert kernels.count(Op.EXP) == 1 and kernels.count(Op.MAX) == 1 and kernels.count(Op.LOG) == 1
    assert kernels.count(Op.RECIPROCAL) == 1


def test_a_kernel_replaced_after_the_capture_runs_eagerly():
    """A fault injected into the fused kernel after capture: the replay's check sees the table
    changed and the call runs eagerly, meeting the fault as eager does."""
    x = np.random.default_rng(1).standard_normal((5, 3))
    y = np.array([0, 1, 2, 0, 1])
    _, f = _run(x, y, "mean", compiled=True)
    before = f.stats["dropped"]
    with inject_fault("numpy", "cross_entropy", mode="nan") as fault:
        t = pg.tensor(x, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = f(t)
    assert fault.triggered >= 1 and f.stats["dropped"] == before + 1
    assert np.isnan(loss.numpy())


def test_an_injected_step_fault_meets_the_replay_as_it_meets_eager():
    """A fault in one of the steps (neg): eager's fused kernel calls the faulty kernel through
    dispatch's table, and so does the replay (which then runs the call eagerly)."""
    x = np.random.default_rng(2).standard_normal((4, 3))
    y = np.array([0, 1, 2, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, f = _run(x, y, "sum", compiled=True)
        with inject_fault("numpy", "neg", mode="nan"):
            eager, _ = _run(x, y, "sum", compiled=False, calls=1)
            t = pg.tensor(x, requires_grad=True)
            replayed = [observed(f(t)), observed(t.grad)]
    assert_bitwise(replayed, eager[0])


def test_a_kernel_without_declared_steps_stays_one_entry(monkeypatch):
    kernel = registry.tables["numpy"][CE]

    def plain(*args, **kwargs):  # a backend's own cross-entropy: no steps declared
        return kernel(*args, **kwargs)

    monkeypatch.setitem(registry.tables["numpy"], CE, plain)
    x = np.random.default_rng(3).standard_normal((4, 3))
    _, f = _run(x, np.array([0, 1, 2, 0]), "mean", compiled=True)
    program = _captures(f)
    assert any(e[0] == 3 and e[2] == CE for e in program)
    assert inline_steps._steps_of(pg.tensor(np.zeros(1))._be, vjp=False) is None


@pytest.mark.parametrize("attribute", ["missing", "other_kernel", "other_backend"])
def test_declarations_that_do_not_name_the_kernel_or_dispatch_are_refused(monkeypatch, attribute):
    kernel = registry.tables["numpy"][CE]
    _, steps = kernel.polygrad_steps

    class Steps:
        follows_dispatch_of = "elsewhere"

    def plain(*args, **kwargs):
        return kernel(*args, **kwargs)

    if attribute == "other_kernel":
        plain.polygrad_steps = (kernel, steps)  # type: ignore[attr-defined]  # copied along, names another
    elif attribute == "other_backend":
        plain.polygrad_steps = (plain, Steps())  # type: ignore[attr-defined]
    monkeypatch.setitem(registry.tables["numpy"], CE, plain)
    be = pg.tensor(np.zeros(1))._be
    assert inline_steps._steps_of(be, vjp=False) is None


def test_a_one_shot_fault_in_a_shared_step_runs_the_call_eagerly():
    """Eager's fused backward calls exp again where the replay reads the forward's: a fault that
    fires once (``times=1``) met eager's first exp and would have met the replay's only one at a
    different point -- the replay's check sees the replaced kernel and runs the call eagerly."""
    x = np.random.default_rng(4).standard_normal((6, 5))
    y = np.array([0, 1, 2, 3, 4, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, f = _run(x, y, "mean", compiled=True)
        with inject_fault("numpy", "exp", mode="nan", times=1):
            eager, _ = _run(x, y, "mean", compiled=False, calls=1)
        with inject_fault("numpy", "exp", mode="nan", times=1):
            t = pg.tensor(x, requires_grad=True)
            replayed = [observed(f(t)), observed(t.grad)]
    assert_bitwise(replayed, eager[0])
