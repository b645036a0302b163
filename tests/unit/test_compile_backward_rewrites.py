"""What the default pg.compile mode's backward plans change in the kernels eager ran -- and that the
numbers stay eager's, bit for bit.

A plan (polygrad.compile.backward_plan) drops an EXPAND whose every reader is a broadcasting
elementwise kernel (the reader broadcasts the unexpanded buffer to the same output), calls a
kernel's declared small-output variant at call sites with small outputs (``polygrad_small``, as
pure mode's replay does), and delivers only each leaf's last gradient (the earlier ones were
inputs of the accumulation that made it).  Each is checked against eager on generated steps, and
the rules that keep an EXPAND one by one.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.compile.program import KERNEL, Kernel
from polygrad.ir.ops import Op

from tests.helpers import assert_bitwise, observed

bp = importlib.import_module("polygrad.compile.backward_plan")

SHAPES = [(), (3,), (1, 3), (2, 3), (2, 1)]
TERMS = ["square_sum", "mean", "sum_axis0", "sum_keep", "bias", "relu_margin", "scaled", "max"]


@st.composite
def steps(draw: Any) -> dict:
    return {"shapes": draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3)),
            "terms": draw(st.lists(st.tuples(st.sampled_from(TERMS), st.integers(0, 2)), min_size=1, max_size=5)),
            "dtype": draw(st.sampled_from([np.float64, np.float32])),
            "seed": draw(st.integers(0, 5))}


def _term(kind: str, p: pg.Tensor, x: pg.Tensor) -> pg.Tensor:
    if kind == "square_sum":
        return (p * p).sum()
    if kind == "mean":
        return p.mean()
    if kind == "sum_axis0":
        return (p * x).sum(axis=0).sum()
    if kind == "sum_keep":
        return (p.sum(keepdims=True) * x).sum()
    if kind == "bias":
        return ((x + p).relu()).mean()
    if kind == "relu_margin":
        return (1 - p * x).relu().mean()
    if kind == "scaled":
        return 1e-4 * (p * 3).sum() + 0
    return pg.maximum(p, x).sum()


def run(spec: dict, compiled: bool) -> tuple[list, Any]:
    rng = np.random.default_rng(spec["seed"])
    dtype = spec["dtype"]
    params = [pg.tensor(rng.normal(size=s).astype(dtype), requires_grad=True) for s in spec["shapes"]]
    x = pg.tensor(rng.normal(size=(2, 3)).astype(dtype))
    opt = pg.optim.SGD(params, lr=0.1, momentum=0.5)

    def step() -> pg.Tensor:
        opt.zero_grad()
        loss = sum(_term(kind, params[k % len(params)], x) for kind, k in spec["terms"])
        loss.backward()
        opt.step()
        return loss

    fn = pg.compile(step) if compiled else step
    seen = [fn() for _ in range(5)]
    return observed(seen + params + [p.grad for p in params]), fn


@settings(max_examples=120, deadline=None)
@given(steps())
def test_planned_backward_passes_equal_eager(spec: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # float32 overflow is eager's too
        eager, _ = run(spec, compiled=False)
        compiled, fn = run(spec, compiled=True)
    assert_bitwise(compiled, eager, str(spec))
    assert fn.plans.stats["planned"] >= 3  # the passes after the first ran as plans


def _moons_plan() -> Any:
    rng = np.random.default_rng(0)
    x, y = pg.tensor(rng.normal(size=(8, 2))), pg.tensor(np.sign(rng.normal(size=(8, 1))))
    params = [pg.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in [(2, 4), (4,), (4, 1), (1,)]]

    def step() -> pg.Tensor:
        for p in params:
            p.grad = None
        h = (x @ params[0] + params[1]).relu()
        loss = (1 - y * (h @ params[2] + params[3])).relu().mean() + 1e-4 * sum((p * p).sum() for p in params)
        loss.backward()
        return loss

    fn = pg.compile(step)
    for _ in range(3):
        fn()
    (plans,) = fn.plans._plans.values()
    return plans[-1], params


def test_a_moons_plan_drops_its_expands_and_delivers_each_gradient_once() -> None:
    plan, params = _moons_plan()
    kernels = [e for e in plan.steps if e[0] == KERNEL]
    assert not any(e.key[0] == Op.EXPAND for e in kernels)  # each spread a scalar into a MUL or WHERE
    assert sorted(d[0] for d in plan.deliveries) == list(range(len(params)))


def _k(op: Op, ins: tuple, out: int, shape: tuple, attrs: dict | None = None, be: Any = "be") -> Kernel:
    return Kernel(KERNEL, be, (op, "dense"), ins, attrs or {}, out, shape)


F64 = np.dtype(np.float64)


def _meta(*specs: tuple) -> list:
    return [("be", shape, dtype) for shape, dtype in specs]


def test_an_expand_read_only_by_broadcasting_kernels_is_dropped() -> None:
    meta = _meta(((), F64), ((2, 3), F64), ((2, 3), F64), ((2, 3), F64), ((2, 3), F64))
    steps = [_k(Op.EXPAND, (0,), 2, (2, 3), {"shape": (2, 3)}), _k(Op.MUL, (2, 1), 3, (2, 3)),
             _k(Op.ADD, (1, 2), 4, (2, 3))]
    out = bp._without_expands(steps, meta, set())
    assert [e.key[0] for e in out] == [Op.MUL, Op.ADD]
    assert out[0].inputs == (0, 1) and out[1].inputs == (1, 0)


@pytest.mark.parametrize("case", ["matmul_reader", "delivered", "dtype", "shape", "no_reader", "backend"])
def test_an_expand_is_kept_where_the_reader_would_differ(case: str) -> None:
    f32 = np.dtype(np.float32)
    meta = _meta(((1, 3), F64), ((2, 3), f32 if case == "dtype" else F64), ((2, 3), F64), ((2, 3), F64),
                 ((3, 3), F64))
    expand = _k(Op.EXPAND, (0,), 2, (2, 3), {"shape": (2, 3)})
    reader = {"matmul_reader": _k(Op.MATMUL, (2, 4), 3, (2, 3)),  # not elementwise
              "shape": _k(Op.MUL, (2, 2), 3, (2, 3)),  # (1, 3) twice would broadcast to (1, 3), not (2, 3)
              "backend": _k(Op.MUL, (2, 1), 3, (2, 3), be="other")}.get(case, _k(Op.MUL, (2, 1), 3, (2, 3)))
    steps = [expand] if case == "no_reader" else [expand, reader]
    delivered = {2} if case == "delivered" else set()
    assert bp._without_expands(steps, meta, delivered) == steps


def test_a_faulty_kernel_in_a_planned_backward_is_called_not_its_small_variant() -> None:
    """A fault injected into a kernel that declares a small variant (the pooled ufuncs) must reach
    a planned backward pass as it reaches eager: its NaNs are in both, bit for bit."""
    from polygrad.testing import inject_fault

    def run(compiled: bool) -> list:
        rng = np.random.default_rng(3)
        w = pg.tensor(rng.normal(size=(3, 2)), requires_grad=True)
        x = pg.tensor(rng.normal(size=(4, 3)))

        def step() -> list:
            w.grad = None
            loss = ((x @ w) * 0.5).relu().sum() + (w * w).sum()
            loss.backward()
            return [loss, w.grad]

        fn = pg.compile(step) if compiled else step
        out = [fn() for _ in range(3)]
        with inject_fault("numpy", "mul", mode="nan", times=None) as fault:
            out += [fn() for _ in range(2)]
        assert fault.triggered >= 4
        return observed(out + [fn()])

    assert_bitwise(run(True), run(False))
