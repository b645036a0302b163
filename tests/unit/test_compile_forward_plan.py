"""The default pg.compile mode's forward plan (op-by-op matcher) against eager, bit for bit.

Each generated step issues a base sequence of ops over a few parameters; call by call it diverges
from the sequence the last call issued at a random point -- another op, another parameter, a
different input shape, a parameter's ``requires_grad`` flipped, a ``no_grad`` region -- and calls
``backward`` once, twice (two losses) or not at all.  Run eagerly and under ``pg.compile``, every
loss, parameter and gradient must be identical, whether the call followed the plan, left it, or
re-recorded it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.ir.ops import Op

from .test_compile_modes import assert_bitwise

OPS = ["add", "mul", "sub_x", "relu", "tanh", "scale", "matmul", "sum_keep", "square", "rsub", "int_scale",
       "mean_all", "promote", "radd_zero"]
VARIATIONS = ["same", "same", "op", "param", "shape", "rg", "no_grad", "drop_tail", "keep_grads", "rg_late"]
BACKWARDS = ["one", "one", "none", "two"]
CALLS = 6


@st.composite
def programs(draw: Any) -> dict:
    base = draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2)), min_size=1, max_size=7))
    calls = draw(st.lists(st.tuples(st.sampled_from(VARIATIONS), st.integers(0, 6), st.sampled_from(OPS),
                                    st.integers(0, 2), st.sampled_from(BACKWARDS)),
                          min_size=CALLS, max_size=CALLS))
    return {"base": base, "calls": calls, "seed": draw(st.integers(0, 3))}


def _op(h: Any, kind: str, p: Any, x: Any) -> Any:
    if kind == "add":
        return h + p
    if kind == "mul":
        return h * p
    if kind == "sub_x":
        return h - x
    if kind == "relu":
        return h.relu()
    if kind == "tanh":
        return h.tanh()
    if kind == "scale":
        return 0.5 * h
    if kind == "matmul":
        return h @ p.T.relu()  # [n, 3] @ [3, 3]: same shape back
    if kind == "sum_keep":
        return h.sum(axis=1, keepdims=True) + h
    if kind == "rsub":
        return 1 - h  # a Python int and a negation: the front end's scalar path, a cached constant
    if kind == "int_scale":
        return h * 2
    if kind == "mean_all":
        return h.mean() + h  # a reduction over all axes: attributes shared between calls
    if kind == "promote":
        xi = (x * 4).cast(pg.int64)
        return (h.cast(pg.float32) + xi).cast(pg.float64)  # float32 + int64: the int64 is cast first
    if kind == "radd_zero":
        return 0 + h
    return h * h


def run(spec: dict, compiled: bool) -> tuple[list, Any]:
    rng = np.random.default_rng(spec["seed"])
    params = [pg.tensor(rng.normal(size=(3, 3)), requires_grad=True) for _ in range(3)]
    xs = {n: pg.tensor(rng.normal(size=(n, 3))) for n in (3, 5)}

    def step(ops: list, n: int, backwards: str, no_grad_at: int, keep_grads: bool, late: Any) -> list:
        if not keep_grads:  # else gradients accumulate into last call's
            for p in params:
                p.grad = None
        x = xs[n]
        losses = []
        h = x
        for i, (kind, k) in enumerate(ops):
            if i == no_grad_at:
                with pg.no_grad():
                    z = _op(h, kind, params[k], x)
                h = h + z
            else:
                h = _op(h, kind, params[k], x)
        loss = (h * h).mean() + params[0].sum() * 0.0
        losses.append(loss.item())
        if late is not None:  # requires_grad flipped between the forward and the backward
            late.requires_grad = False
        if backwards != "none":
            loss.backward()
        if backwards == "two":  # a second loss from a fresh forward, backpropagated too
            loss2 = (params[1] * x[:1].T).tanh().sum()
            losses.append(loss2.item())
            loss2.backward()
        with pg.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= 0.1 * p.grad
        return losses

    fn = pg.compile(step) if compiled else step
    seen: list = []
    ops = list(spec["base"])
    for variation, at, kind, k, backwards in spec["calls"]:
        at = at % len(ops)
        n, no_grad_at, flipped, keep, late = 3, -1, None, False, None
        call_ops = list(ops)
        if variation == "op":
            call_ops[at] = (kind, call_ops[at][1])
        elif variation == "param":
            call_ops[at] = (call_ops[at][0], k)
        elif variation == "shape":
            n = 5
        elif variation == "rg":
            flipped = params[k]
            flipped.requires_grad = False
        elif variation == "no_grad":
            no_grad_at = at
        elif variation == "drop_tail":
            call_ops = call_ops[:at + 1]
        elif variation == "keep_grads":
            keep = True
        elif variation == "rg_late":
            late = flipped = params[k]
        try:
            seen.append(fn(call_ops, n, backwards, no_grad_at, keep, late))
        except Exception as exc:  # noqa: BLE001 - eager's error must be compiled's too
            seen.append(f"{type(exc).__name__}: {exc}")
        if flipped is not None:
            flipped.requires_grad = True
        seen.append([p.numpy().copy() for p in params])
        seen.append([None if p.grad is None else p.grad.numpy().copy() for p in params])
    return seen, fn


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_forward_plan_diverging_steps_equal_eager(spec: dict) -> None:
    eager, _ = run(spec, compiled=False)
    compiled, _ = run(spec, compiled=True)
    assert_bitwise(compiled, eager, "compiled vs eager")


def _moons_like() -> tuple[Any, list]:
    rng = np.random.default_rng(0)
    x = pg.tensor(rng.normal(size=(8, 2)))
    y = pg.tensor(np.sign(rng.normal(size=(8, 1))))
    params = [pg.tensor(rng.uniform(-1, 1, (2, 4)), requires_grad=True), pg.tensor(np.zeros(4), requires_grad=True),
              pg.tensor(rng.uniform(-1, 1, (4, 1)), requires_grad=True), pg.tensor(np.zeros(1), requires_grad=True)]

    def step(w: Any = None) -> float:
        for p in params:
            p.grad = None
        h = (x @ (params[0] if w is None else w) + params[1]).relu()
        loss = (1 - y * (h @ params[2] + params[3])).relu().mean() + 1e-4 * sum((p * p).sum() for p in params)
        loss.backward()
        with pg.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= 0.05 * p.grad
        return loss.item()

    return step, params


def test_steady_step_matches_every_op_and_plans_its_backward() -> None:
    step, params = _moons_like()
    fn = pg.compile(step)
    for _ in range(3):
        fn()
    before, left = fn.stats["forward_matched"], fn.stats["forward_left"]
    fn()
    assert fn.stats["forward_left"] == left  # the fourth call never left the plan
    assert fn.stats["forward_matched"] - before == len(fn._forward_plan) > 20
    assert fn.plans.stats["planned"] >= 2
    assert fn.plans.stats["shortcut"] >= 1  # the whole forward walked the plan: no toposort


@pytest.mark.parametrize("change", ["other_parameter", "requires_grad", "grad_mode", "dtype", "kernel"])
def test_a_changed_input_leaves_the_plan_and_equals_eager(change: str) -> None:
    results = []
    for compiled in (False, True):
        step, params = _moons_like()
        fn = pg.compile(step) if compiled else step
        out = [fn(), fn()]
        w = pg.tensor(params[0].numpy() * 2, requires_grad=True)
        if change == "other_parameter":
            out.append(fn(w))  # another leaf, same shape: the backward delivers to it
            out.append(w.grad.numpy())
        elif change == "requires_grad":
            params[1].requires_grad = False
            out.append(fn())
            params[1].requires_grad = True
        elif change == "grad_mode":
            with pg.no_grad():
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - backward without a graph: eager's error
                    out.append(type(exc).__name__)
        elif change == "dtype":
            w32 = pg.tensor(params[0].numpy().astype(np.float32), requires_grad=True)
            out.append(fn(w32))
        elif change == "kernel":  # the registry's kernel replaced between calls: the new one runs
            from polygrad.runtime.registry import registry
            from polygrad.ir.ops import Op, kernel_key
            table = registry.tables["numpy"]
            key = kernel_key(Op.RELU, "dense")
            old = table[key]
            table[key] = lambda a, **kw: old(a, **kw) * 1.0 + 0.0
            try:
                out.append(fn())
            finally:
                table[key] = old
        out += [fn(), fn()]
        out.append([p.numpy() for p in params])
        results.append(out)
    assert_bitwise(results[1], results[0], change)


def _graph_layout(root: Any) -> list:
    """Each node's op and which of its inputs it keeps without data (what saved_inputs decided)."""
    from polygrad.engine.graph import toposort
    return [(str(t._node.op), [inp._data is None for inp in t._node.inputs]) for t in toposort([root])]


@given(st.lists(st.sampled_from(["relu", "double", "exp"]), min_size=2, max_size=5))
@settings(max_examples=40, deadline=None)
def test_kept_inputs_follow_the_argument_not_the_plan(kinds: list) -> None:
    """A non-leaf argument made by an op whose gradient reads its output (relu, exp) is kept whole
    by the nodes that use it, another (x * 2) as a data-less stand-in: the matcher compares that
    state, so a planned call keeps what eager keeps."""
    rng = np.random.default_rng(1)
    w = pg.tensor(rng.normal(size=(3, 3)), requires_grad=True)

    def step(h: Any) -> Any:
        return ((h + w.sum(axis=0)) @ w).sum()

    fn = pg.compile(step)
    for kind in kinds:
        base = pg.tensor(rng.normal(size=(2, 3))) @ w
        h = base.relu() if kind == "relu" else base.exp() if kind == "exp" else base * 2.0
        eager_layout = _graph_layout(step(h))
        assert _graph_layout(fn(h)) == eager_layout, kind


@pytest.mark.parametrize("kind", ["promote", "slow_entry", "scalars"])
def test_steady_steps_stay_on_their_plan(kind: str) -> None:
    """Ops the plan is asked about after dispatch's own work (an int64 operand of a float32 one:
    cast first) or that it runs through the full apply (an index-array attribute: a slow entry)
    keep the call on its plan, entry for entry, as the plain ones do; and the numbers are eager's."""
    rng = np.random.default_rng(2)
    w = pg.tensor(rng.normal(size=(3, 3)), requires_grad=True)
    x32 = pg.tensor(rng.normal(size=(4, 3)).astype(np.float32))
    xi = pg.tensor(np.arange(12).reshape(4, 3))
    rows = np.array([0, 2, 3])

    def step() -> float:
        w.grad = None
        h = x32.cast(pg.float64) @ w
        if kind == "promote":
            h = (h.cast(pg.float32) + xi).cast(pg.float64)  # float32 + int64: the int64 is cast
        elif kind == "slow_entry":
            h = h[rows] * 2.0
        else:
            h = 1 - (0.5 * h + 2) * 3
        loss = h.relu().mean()
        loss.backward()
        with pg.no_grad():
            w.update_(w - 0.1 * w.grad)
        return loss.item()

    eager = [step() for _ in range(5)]
    w.update_(pg.tensor(np.random.default_rng(2).normal(size=(3, 3))))
    fn = pg.compile(step)
    compiled = [fn()]
    recorded = [e.op for e in fn._forward_plan]  # what the first call issued, recorded by the full apply
    assert kind != "promote" or recorded.count(Op.CAST) == 4
    compiled += [fn() for _ in range(4)]
    assert_bitwise(compiled, eager, kind)
    assert fn.stats["forward_left"] == 1  # only the first call (which had no plan) left it
    assert [e.op for e in fn._forward_plan] == recorded
    assert fn.plans.stats["shortcut"] >= 3
