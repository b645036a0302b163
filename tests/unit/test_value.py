"""Tests of polygrad.engine.value: gradients vs central differences, micrograd parity, deep graphs,
no reference cycles, backward_many, sum_of, IEEE edge cases."""
from __future__ import annotations

import gc
import importlib.util
import math
import os
import random
import sys
import types
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.errors import DTypeError, ShapeError
from polygrad.engine.value import Value, backward_many


requires_micrograd = pytest.mark.skipif(
    importlib.util.find_spec("micrograd") is None,
    reason="micrograd not installed (pip install micrograd, or pip install polygrad-core[bench])",
)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def analytic_grads(f, xs):
    leaves = [Value(float(x)) for x in xs]
    out = f(*leaves)
    out.backward()
    return out.data, [v.grad for v in leaves]


def numeric_grads(f, xs, h=1e-6):
    grads = []
    for i in range(len(xs)):
        hi = list(xs)
        lo = list(xs)
        hi[i] += h
        lo[i] -= h
        fp = f(*[Value(float(x)) for x in hi]).data
        fm = f(*[Value(float(x)) for x in lo]).data
        grads.append((fp - fm) / (2 * h))
    return grads


def assert_grads_match(f, xs, rtol=1e-6, atol=1e-7):
    _, ga = analytic_grads(f, xs)
    gn = numeric_grads(f, xs)
    for i, (a, n) in enumerate(zip(ga, gn)):
        assert math.isclose(a, n, rel_tol=rtol, abs_tol=atol), (i, a, n, xs)


# (name, function of Values, points to check at)
OPS = [
    ("add", lambda a, b: a + b, [(1.3, -0.7)]),
    ("sub", lambda a, b: a - b, [(1.3, -0.7)]),
    ("mul", lambda a, b: a * b, [(1.3, -0.7)]),
    ("div", lambda a, b: a / b, [(1.3, -0.7), (-2.0, 3.5)]),
    ("self_mul", lambda a: a * a, [(1.7,), (-0.3,)]),
    ("self_sub", lambda a: a - a * 2.0, [(0.4,)]),
    ("neg", lambda a: -a, [(0.9,)]),
    ("radd", lambda a: 2.5 + a, [(0.9,)]),
    ("rsub", lambda a: 2.5 - a, [(0.9,)]),
    ("rmul", lambda a: 2.5 * a, [(0.9,)]),
    ("rtruediv", lambda a: 2.5 / a, [(0.9,), (-1.7,)]),
    ("sub_const", lambda a: a - 2.5, [(0.9,)]),
    ("div_const", lambda a: a / 3.0, [(0.9,)]),
    ("pow2", lambda a: a ** 2, [(1.3,), (-0.6,)]),
    ("pow_half", lambda a: a ** 0.5, [(1.3,)]),
    ("pow_neg", lambda a: a ** -1.5, [(0.8,)]),
    ("pow_value", lambda a, b: a ** b, [(1.3, 0.7), (0.4, -1.2), (2.0, 3.0)]),
    ("pow_value_shared", lambda a: a ** a, [(1.3,), (0.5,)]),
    ("rpow", lambda a: 2.0 ** a, [(0.7,), (-1.3,)]),
    ("relu_pos", lambda a: a.relu(), [(0.8,)]),
    ("relu_neg", lambda a: a.relu(), [(-0.8,)]),
    ("tanh", lambda a: a.tanh(), [(0.3,), (-1.9,)]),
    ("exp", lambda a: a.exp(), [(0.3,), (-1.9,)]),
    ("log", lambda a: a.log(), [(0.3,), (4.2,)]),
    ("sigmoid", lambda a: a.sigmoid(), [(0.3,), (-2.9,), (7.0,)]),
    ("reciprocal", lambda a: a.reciprocal(), [(0.3,), (-2.9,)]),
    ("maximum_a", lambda a, b: a.maximum(b), [(1.5, -0.5)]),
    ("maximum_b", lambda a, b: a.maximum(b), [(-1.5, 0.5)]),
    ("maximum_tie", lambda a, b: a.maximum(b), [(0.75, 0.75)]),  # central diff gives 0.5 / 0.5
    ("maximum_const", lambda a: a.maximum(0.2), [(0.9,), (-0.9,), (0.2,)]),
    ("sum_of", lambda a, b, c: Value.sum_of([a, b * c, 3.0, a]), [(0.5, -1.5, 2.0)]),
]


@pytest.mark.parametrize("name,f,points", OPS, ids=[o[0] for o in OPS])
def test_op_gradient_vs_central_difference(name, f, points):
    for xs in points:
        assert_grads_match(f, xs)


def test_maximum_tie_convention_is_half_half():
    a, b = Value(2.0), Value(2.0)
    out = a.maximum(b)
    out.backward()
    assert out.data == 2.0
    assert (a.grad, b.grad) == (0.5, 0.5)
    c = Value(3.0)
    out = c.maximum(3.0)
    out.backward()
    assert c.grad == 0.5
    # not a tie: all to the larger one
    a, b = Value(1.0), Value(2.0)
    a.maximum(b).backward()
    assert (a.grad, b.grad) == (0, 1)


def test_relu_derivative_at_zero_is_zero():
    a = Value(0.0)
    out = a.relu()
    out.backward()
    assert out.data == 0.0 and a.grad == 0


# smooth random expressions, gradients vs central differences
_SMOOTH_UNARY = [
    lambda a: a.tanh(),
    lambda a: (a * 0.5).exp(),
    lambda a: a.sigmoid(),
    lambda a: (a * a + 0.5).log(),
    lambda a: (a * a + 1.0).reciprocal(),
    lambda a: -a,
    lambda a: a ** 2,
    lambda a: 1.5 - a,
]
_SMOOTH_BINARY = [
    lambda a, b: a + b,
    lambda a, b: a - b,
    lambda a, b: a * b,
    lambda a, b: a / (b * b + 1.0),
    lambda a, b: (a * a + 0.5) ** (b.tanh()),
    lambda a, b: Value.sum_of([a, b, a * b]),
]


def _random_smooth_expr(seed, n_leaves, n_ops):
    plan = []
    rng = random.Random(seed)
    for _ in range(n_ops):
        if rng.random() < 0.4:
            plan.append(("u", rng.randrange(len(_SMOOTH_UNARY)), rng.random()))
        else:
            plan.append(("b", rng.randrange(len(_SMOOTH_BINARY)), rng.random(), rng.random()))

    squash: list[bool] = []  # decided on the first (unperturbed) call, then fixed: f stays smooth

    def f(*leaves):
        pool = list(leaves)
        for i, step in enumerate(plan):
            if step[0] == "u":
                v = _SMOOTH_UNARY[step[1]](pool[int(step[2] * len(pool))])
            else:
                v = _SMOOTH_BINARY[step[1]](pool[int(step[2] * len(pool))], pool[int(step[3] * len(pool))])
            if len(squash) <= i:
                squash.append(abs(v.data) > 5)
            pool.append(v.tanh() if squash[i] else v)
        return Value.sum_of(pool[n_leaves:])

    return f


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    xs=st.lists(st.floats(-2.0, 2.0), min_size=3, max_size=3),
)
def test_random_smooth_graph_gradients(seed, xs):
    f = _random_smooth_expr(seed, 3, 12)
    assert_grads_match(f, xs, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# micrograd API and parity
# ---------------------------------------------------------------------------------------------
def test_micrograd_api_surface():
    a = Value(2.0)
    b = Value(-3.0)
    c = a * b
    d = c + a
    e = d.relu()
    f = a ** 2
    assert repr(a) == "Value(data=2.0, grad=0)"
    assert (a._op, c._op, d._op, e._op, f._op) == ("", "*", "+", "ReLU", "**2")
    assert c._prev == {a, b} and isinstance(c._prev, set)
    assert (a * a)._prev == {a}
    assert (a * a)._parents == (a, a)
    assert c._parents == (a, b)
    assert (a + 1)._prev == {a}  # constants are folded, not wrapped in leaf Values
    e.backward()
    assert repr(e) == "Value(data=0, grad=1)"  # micrograd: relu of a negative is the int 0
    # identity semantics: usable in sets and dicts, no value-equality
    x, y = Value(1.0), Value(1.0)
    assert x != y and x == x and len({x, y}) == 2 and hash(x) == hash(x)
    with pytest.raises(TypeError):
        x < y  # noqa: B015  (not overloaded, like micrograd)
    # ints stay ints, like micrograd
    assert (Value(2) * 3).data == 6 and isinstance((Value(2) * 3).data, int)


def test_micrograd_style_custom_node_and_backward_callable():
    # micrograd lecture-style extension: build a node, assign its _backward closure
    def cube(self):
        out = Value(self.data ** 3, (self,), "cube")

        def _backward():
            self.grad += 3 * self.data ** 2 * out.grad

        out._backward = _backward
        return out

    a = Value(2.0)
    out = cube(a) * 2.0
    assert cube(a)._op == "cube" and cube(a)._prev == {a}
    out.backward()
    assert out.data == 16.0 and a.grad == 24.0
    # reading _backward gives a callable applying the node's local chain rule once
    b, c = Value(3.0), Value(4.0)
    m = b * c
    m.grad = 1.0
    m._backward()
    assert (b.grad, c.grad) == (4.0, 3.0)


def test_backward_accumulates_like_micrograd():
    a = Value(3.0)
    out = a * a
    out.backward()
    assert a.grad == 6.0
    a2 = Value(3.0)
    (a2 * 2.0).backward()
    (a2 * 2.0).backward()
    assert a2.grad == 4.0


def _micrograd_random_program(seed, V, n_leaves=4, n_ops=40):
    """Random expression over the ops micrograd supports; V is the Value class to use."""
    rng = random.Random(seed)
    leaves = [V(rng.uniform(-2, 2)) for _ in range(n_leaves)]
    pool = list(leaves)
    for _ in range(n_ops):
        a = pool[rng.randrange(len(pool))]
        b = pool[rng.randrange(len(pool))]
        k = rng.randrange(14)
        c = rng.uniform(-2, 2)
        if k == 0:
            v = a + b
        elif k == 1:
            v = a - b
        elif k == 2:
            v = a * b
        elif k == 3:
            v = a / b if abs(b.data) > 0.1 else a / 2.0
        elif k == 4:
            v = a ** 2
        elif k == 5:
            v = a ** 3 if abs(a.data) < 10 else -a
        elif k == 6:
            v = a ** -1 if abs(a.data) > 0.1 else a * 0.5
        elif k == 7:
            v = a.relu()
        elif k == 8:
            v = -a
        elif k == 9:
            v = c + a
        elif k == 10:
            v = c - a
        elif k == 11:
            v = c * a
        elif k == 12:
            v = c / a if abs(a.data) > 0.1 else a - c
        else:
            v = a + c
        if abs(v.data) > 1e3:
            v = v * 1e-3
        pool.append(v)
    out = sum(pool[n_leaves:])
    return out, leaves, pool


def _close(x, y, scale):
    return x == y or abs(x - y) <= 1e-12 * max(1.0, scale)


@requires_micrograd
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_micrograd_parity_random_graphs(seed):
    import micrograd.engine as mg

    out_m, leaves_m, pool_m = _micrograd_random_program(seed, mg.Value)
    out_p, leaves_p, pool_p = _micrograd_random_program(seed, Value)
    # forward: the same expressions, so bit-for-bit equal data
    assert [v.data for v in pool_p] == [v.data for v in pool_m]
    out_m.backward()
    out_p.backward()
    # grads: equal up to the order of summation at fan-in nodes
    scale = max(abs(v.grad) for v in leaves_m)
    for vm, vp in zip(leaves_m, leaves_p):
        assert _close(vp.grad, vm.grad, scale), (vp.grad, vm.grad)


@requires_micrograd
def test_micrograd_moons_mlp_parity(monkeypatch):
    """micrograd's own nn.MLP and demo loss, run unchanged over polygrad.Value."""
    import micrograd.engine as mge
    import micrograd.nn as mgnn

    rng = random.Random(0)
    X = [[rng.uniform(-1.5, 2.5), rng.uniform(-1, 1.5)] for _ in range(30)]
    y = [1 if x1 > 0.25 else -1 for _, x1 in X]

    def train(V, steps=3):
        random.seed(1337)
        model = mgnn.MLP(2, [16, 16, 1])
        history = []
        for k in range(steps):
            inputs = [list(map(V, xrow)) for xrow in X]
            scores = list(map(model, inputs))
            losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(y, scores)]
            data_loss = sum(losses) * (1.0 / len(losses))
            reg_loss = 1e-4 * sum((p * p for p in model.parameters()))
            total = data_loss + reg_loss
            model.zero_grad()
            total.backward()
            history.append((total.data, [p.grad for p in model.parameters()]))
            lr = 1.0 - 0.9 * k / 100
            for p in model.parameters():
                p.data -= lr * p.grad
        return history, model

    hist_m, model_m = train(mge.Value)
    monkeypatch.setattr(mgnn, "Value", Value)  # micrograd's nn code now builds polygrad Values
    hist_p, model_p = train(Value)
    assert all(isinstance(p, Value) for p in model_p.parameters())
    for (lm, gm), (lp, gp) in zip(hist_m, hist_p):
        assert math.isclose(lp, lm, rel_tol=1e-12, abs_tol=1e-15)
        scale = max(abs(g) for g in gm)
        assert all(_close(a, b, scale) for a, b in zip(gp, gm))
    assert hist_p[0][0] == hist_m[0][0]  # first forward pass: bit-for-bit


# ---------------------------------------------------------------------------------------------
# deep graphs, determinism, memory
# ---------------------------------------------------------------------------------------------
def test_million_op_chain_backpropagates_without_recursion():
    a = Value(0.5)
    b = Value(2.0)
    x = a
    n = 1_000_000
    for i in range(n):
        if i % 1000 == 0:
            x = x + b           # b is used n/1000 times: grad == 1000
        elif i % 2:
            x = x * 1.0
        else:
            x = x + 1.0
    x.backward()
    assert a.grad == 1.0
    assert b.grad == n // 1000
    del x  # freeing a 1,000,000-deep chain must not overflow the C stack either


def test_deterministic_order_and_results():
    def build():
        rng = random.Random(7)
        leaves = [Value(rng.uniform(-1, 1)) for _ in range(20)]
        pool = list(leaves)
        for _ in range(300):
            a, b = rng.choice(pool), rng.choice(pool)
            pool.append((a * b + a).tanh() if rng.random() < 0.5 else a - b * 0.3)
        out = Value.sum_of(pool[20:]) * Value.sum_of(pool[-50:])
        out.backward()
        return [v.grad for v in leaves]

    assert build() == build()


POLYGRAD_DIR = os.path.dirname(os.path.abspath(importlib.util.find_spec("polygrad").origin))


def _is_polygrad(obj: object) -> bool:
    """An object polygrad made: an instance of a polygrad class, a polygrad function or method,
    or a frame running polygrad code."""
    if type(obj).__module__.split(".")[0] == "polygrad":
        return True
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return str(getattr(obj, "__module__", "")).split(".")[0] == "polygrad"
    if isinstance(obj, types.FrameType):
        return obj.f_code.co_filename.startswith(POLYGRAD_DIR)
    return False


def polygrad_cyclic_garbage() -> list:
    """Collect cyclic garbage and return the part polygrad is in: garbage objects that are
    polygrad's (``_is_polygrad``) or hold one directly (a cell, list or dict in a cycle through a
    Value).  Cycles among other objects -- a busy dask client, hypothesis, another test's
    leftovers -- are collected and ignored: the check sees polygrad's cycles only."""
    gc.set_debug(gc.DEBUG_SAVEALL)   # keep what the collection finds, to look at it
    try:
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    ours = {id(o) for o in garbage if _is_polygrad(o)}
    found = [o for o in garbage if id(o) in ours or any(id(r) in ours for r in gc.get_referents(o))]
    del garbage
    gc.collect()  # free the foreign garbage now that it is no longer saved
    return found


def test_no_reference_cycles_graph_freed_by_refcount():
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        w = [Value(random.uniform(-1, 1)) for _ in range(8)]
        xs = [[Value(random.uniform(-1, 1)) for _ in range(8)] for _ in range(200)]
        outs = []
        for row in xs:
            h = sum((wi * xi for wi, xi in zip(w, row)), Value(0.0)).relu()
            outs.append((h * h.tanh() + h.exp().log() - 1.0 / (h + 2.0)).sigmoid().maximum(0.1))
        loss = Value.sum_of(outs) ** 2
        backward_many([loss, outs[0]], [1.0, 0.5])
        refs = [weakref.ref(v) for v in (loss, outs[0], outs[-1], xs[3][2])]
        custom = Value(1.0, (loss,), "custom")
        refs.append(weakref.ref(custom))
        del loss, outs, xs, h, row, custom
        assert all(r() is None for r in refs), "graph nodes kept alive: a reference cycle?"
        found = polygrad_cyclic_garbage()
        assert found == [], f"polygrad made cyclic garbage: {[type(o).__name__ for o in found][:10]}"
        assert all(v.grad != 0 for v in w)  # leaves survive and hold their grads
    finally:
        if was_enabled:
            gc.enable()


def test_the_cycle_check_sees_polygrad_cycles_and_ignores_foreign_ones():
    """What made the test above flaky (other objects' cycles, e.g. a dask client's, collected
    during it) is ignored; a cycle through a Value, a polygrad closure or a polygrad frame is found."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        foreign: list = []
        foreign.append(foreign)                      # a cycle with nothing of polygrad's in it
        del foreign
        assert polygrad_cyclic_garbage() == []

        v = Value(1.0)
        v._arg = [v]                                 # a Value in a cycle (through a list)
        del v
        assert any(isinstance(o, Value) for o in polygrad_cyclic_garbage())

        holder: list = []
        fn = Value.__add__.__get__(Value(2.0))       # a polygrad method in a cycle
        holder.append(fn)
        fn.__self__._arg = holder
        del holder, fn
        assert polygrad_cyclic_garbage() != []
    finally:
        if was_enabled:
            gc.enable()


def test_value_uses_slots():
    v = Value(1.0)
    assert not hasattr(v, "__dict__")
    with pytest.raises(AttributeError):
        v.foo = 1


# ---------------------------------------------------------------------------------------------
# backward_many and sum_of
# ---------------------------------------------------------------------------------------------
def test_backward_many_equals_weighted_sum():
    def graph():
        a, b, c = Value(0.7), Value(-1.3), Value(2.1)
        f1 = (a * b).tanh() + c
        f2 = f1 * a + b.exp()          # f1 is an ancestor of f2
        f3 = c.sigmoid() * b
        return (a, b, c), (f1, f2, f3)

    seeds = [0.5, -2.0, 3.0]
    (a, b, c), outs = graph()
    backward_many(outs, seeds)
    got = [a.grad, b.grad, c.grad]
    (a2, b2, c2), outs2 = graph()
    Value.sum_of([g * o for g, o in zip(seeds, outs2)]).backward()
    want = [a2.grad, b2.grad, c2.grad]
    for x, y in zip(got, want):
        assert math.isclose(x, y, rel_tol=1e-14, abs_tol=1e-15)


def test_backward_many_duplicates_leaves_and_errors():
    a = Value(3.0)
    f = a * 2.0
    backward_many([f, f, a], [1.0, 1.0, 10.0])  # seeds add up; a leaf output just gets its seed
    assert f.grad == 2.0 and a.grad == 14.0
    with pytest.raises(ShapeError):
        backward_many([f], [1.0, 2.0])
    with pytest.raises(DTypeError):
        backward_many([f, 3.0], [1.0, 2.0])
    backward_many([], [])  # nothing to do


def test_sum_of_matches_builtin_sum_and_is_one_node():
    rng = random.Random(3)
    xs = [Value(rng.uniform(-1, 1)) for _ in range(1000)]
    s1 = Value.sum_of(x * x for x in xs)
    xs2 = [Value(x.data) for x in xs]
    s2 = sum(x * x for x in xs2)
    assert s1.data == s2.data  # same left-to-right accumulation as builtin sum
    assert s1._op == "sum" and len(s1._parents) == 1000
    s1.backward()
    s2.backward()
    assert [x.grad for x in xs] == [x.grad for x in xs2]


def test_sum_of_numbers_duplicates_and_empty():
    a = Value(2.0)
    s = Value.sum_of([a, 1.5, a, 2])
    assert s.data == 7.5 and s._parents == (a, a)
    s.backward()
    assert a.grad == 2.0
    e = Value.sum_of([])
    assert e.data == 0 and e._parents == ()
    e.backward()
    c = Value.sum_of([1.0, 2.0])
    assert c.data == 3.0 and c._parents == ()


# ---------------------------------------------------------------------------------------------
# IEEE conventions where micrograd would raise or go complex
# ---------------------------------------------------------------------------------------------
def test_ieee_edge_cases():
    assert (Value(0.0) ** -1).data == math.inf
    assert (Value(-0.0) ** -1).data == -math.inf
    assert (Value(1e200) ** 2).data == math.inf
    assert math.isnan((Value(-8.0) ** 0.5).data)
    assert (Value(1.0) / Value(0.0)).data == math.inf
    assert (1.0 / Value(0.0)).data == math.inf
    assert Value(0.0).reciprocal().data == math.inf
    assert Value(0.0).log().data == -math.inf
    assert math.isnan(Value(-1.0).log().data)
    assert Value(1000.0).exp().data == math.inf
    assert Value(-1000.0).sigmoid().data == 0.0
    assert Value(1000.0).sigmoid().data == 1.0
    assert math.isnan(Value(math.nan).maximum(1.0).data)
    # derivative of sqrt at 0 is +inf, not an exception
    x = Value(0.0)
    (x ** 0.5).backward()
    assert x.grad == math.inf
    x = Value(0.0)
    x.log().backward()
    assert x.grad == math.inf


def test_pow_value_exponent_nonpositive_base():
    # x < 0: x's gradient is fine, y's derivative is undefined -> NaN lands in y.grad only
    x, y = Value(-2.0), Value(3.0)
    out = x ** y
    out.backward()
    assert out.data == -8.0
    assert x.grad == 12.0
    assert math.isnan(y.grad)
    # x == 0 and y > 0: the y-derivative is the limit 0
    x, y = Value(0.0), Value(2.0)
    (x ** y).backward()
    assert x.grad == 0.0 and y.grad == 0.0
    # a number exponent never computes a y-derivative
    x = Value(-2.0)
    (x ** 3).backward()
    assert x.grad == 12.0


def test_recursion_limit_untouched():
    assert sys.getrecursionlimit() <= 10_000
