"""The generated forward-plan entries (polygrad.compile.forward_fast) against the generic matcher
they replace (``Cursor.run`` / ``Cursor._execute`` with ``Entry.fast`` unset).

Under :func:`twin_paths` every op a default-mode call asks its plan about runs through both: the
generated function on the call's cursor and the generic matcher on a copy of it.  They must agree
on everything -- whether the op matched or left the plan (and where), the cursor's position, its
``whole`` flag and leaf numbering, and the result: bits, shape, dtype, ``requires_grad``, and its
graph node (op, attributes, layout, backend, which inputs are kept whole and which as data-less
stand-ins, the op's position).  The steps are the forward-plan tests' random diverging programs
plus the cases made to leave the plan or fault: another dtype, other attributes, a kernel swapped
in the registry, a kernel that raises (the fallback), grad mode, an event listener.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import polygrad as pg
from polygrad.compile import forward_fast
from polygrad.compile.forward_plan import Cursor
from polygrad.ir.ops import Op, kernel_key
from polygrad.runtime.registry import registry

from ..helpers import assert_bitwise
from .test_compile_forward_plan import programs, run


def _same_tensor(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), where
    assert (a.shape, a.dtype, a._be, a.requires_grad, a.grad, a.name) == (b.shape, b.dtype, b._be, b.requires_grad,
                                                                         b.grad, b.name), where
    na, nb = a._node, b._node
    assert (na is None) == (nb is None), where
    if na is not None:
        assert (na.op, na.attrs, na.layout, na.backend, na.scalar is None, na.made_by, na.made_at) == (
            nb.op, nb.attrs, nb.layout, nb.backend, nb.scalar is None, nb.made_by, nb.made_at), where
        assert len(na.inputs) == len(nb.inputs), where
        for x, y in zip(na.inputs, nb.inputs):
            if x is y:
                continue  # kept whole by both
            # a data-less stand-in on both sides, for the same tensor
            assert x._data is None and y._data is None and x._node is y._node, where
            assert (x.shape, x.dtype, x._be, x.requires_grad, x.name, x.grad) == (
                y.shape, y.dtype, y._be, y.requires_grad, y.name, y.grad), where


class _Counts:
    def __init__(self) -> None:
        self.matched = 0
        self.left = 0


@contextlib.contextmanager
def twin_paths() -> Iterator[_Counts]:
    """Every entry specialized inside: its generated function wrapped so that each op it is asked
    about also runs through the generic matcher, on a copy of the cursor, and the two compared."""
    from polygrad.compile import forward_plan

    specialize = forward_plan.specialize
    generic = Cursor.run
    counts = _Counts()

    def wrapped(entry: Any, same_attrs: Any) -> Any:
        fast = specialize(entry, same_attrs)
        if fast is None:
            return None

        def both(self: Cursor, pos: int, op: Op, inputs: tuple, attrs: dict, layout: str) -> Any:
            twin = Cursor(self.plan)
            twin.pos, twin.fresh, twin.left_at, twin.token = self.pos, self.fresh, self.left_at, self.token
            twin.ops, twin.leaves, twin.leaf_ids = self.ops, list(self.leaves), dict(self.leaf_ids)
            twin.whole = self.whole
            mine, entry.fast = entry.fast, None
            try:
                slow_error: Exception | None = None
                try:
                    slow = generic(twin, op, inputs, attrs, layout)
                except Exception as exc:  # noqa: BLE001 - compared with the generated path's below
                    slow_error, slow = exc, None
            finally:
                entry.fast = mine
            try:
                got = fast(self, pos, op, inputs, attrs, layout)
            except Exception as exc:  # noqa: BLE001
                assert slow_error is not None and type(exc) is type(slow_error) and str(exc) == str(slow_error)
                raise
            assert slow_error is None, f"only the generic matcher raised {slow_error!r}"
            where = f"op {op} at entry {pos}"
            assert (self.pos, self.left_at, self.ops, self.whole) == (twin.pos, twin.left_at, twin.ops,
                                                                      twin.whole), where
            assert self.leaves == twin.leaves and self.leaf_ids == twin.leaf_ids, where
            assert (self.fresh is None) == (twin.fresh is None), where
            if self.fresh is not None:
                assert len(self.fresh) == len(twin.fresh) and all(a is b for a, b in zip(self.fresh, twin.fresh)), where
            assert (got is None) == (slow is None), where
            if got is None:
                counts.left += 1
            else:
                counts.matched += 1
                _same_tensor(got, slow, where)
                assert_bitwise(got.numpy(), slow.numpy(), where)
            return got

        return both

    forward_plan.specialize = wrapped  # type: ignore[assignment]
    try:
        yield counts
    finally:
        forward_plan.specialize = specialize


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_entries_equal_the_generic_matcher(spec: dict) -> None:
    eager, _ = run(spec, compiled=False)
    with twin_paths():
        compiled, _ = run(spec, compiled=True)
    assert_bitwise(compiled, eager, "compiled vs eager")


def test_a_plain_step_runs_on_generated_entries() -> None:
    rng = np.random.default_rng(0)
    x = pg.tensor(rng.normal(size=(5, 2)))
    w = pg.tensor(rng.normal(size=(2, 3)), requires_grad=True)
    b = pg.tensor(np.zeros(3), requires_grad=True)

    def step() -> float:
        w.grad = b.grad = None
        loss = (1 - (x @ w + b).relu()).relu().mean() + 1e-4 * (w * w).sum()
        loss.backward()
        return loss.item()

    fn = pg.compile(step)
    with twin_paths() as counts:
        fn()
        assert all(e.fast is not None for e in fn._forward_plan)
        assert [fn() for _ in range(3)] == [step() for _ in range(3)]
    assert counts.matched == 3 * len(fn._forward_plan) and counts.left == 0
    generic_calls = []
    original = Cursor.generic
    fn = pg.compile(step)  # (entries specialized under twin_paths call the generic matcher too)
    fn()
    Cursor.generic = lambda self, *a: generic_calls.append(a) or original(self, *a)  # type: ignore[method-assign]
    try:
        assert [fn() for _ in range(2)] == [step() for _ in range(2)]
    finally:
        Cursor.generic = original  # type: ignore[method-assign]
    assert generic_calls == []  # a steady step's every op matched by its generated function alone


def _step_of(kind: str) -> tuple[Any, list]:
    rng = np.random.default_rng(3)
    x = pg.tensor(rng.normal(size=(4, 3)))
    w = pg.tensor(rng.normal(size=(3, 3)), requires_grad=True)

    def step(v: Any = None, axis: int = 1) -> list:
        w.grad = None
        h = (x if v is None else v) @ w
        loss = (h.relu().sum(axis=axis, keepdims=True) * 0.5).tanh().mean()
        loss.backward()
        return [loss.numpy(), w.grad.numpy()]

    return step, [x, w]


@pytest.mark.filterwarnings("ignore::polygrad.errors.FallbackWarning")
@pytest.mark.parametrize("change", ["dtype", "attrs", "kernel_swapped", "kernel_raises", "no_grad", "listener",
                                    "requires_grad"])
def test_leaving_and_faulting_entries_equal_the_generic_matcher(change: str) -> None:
    """Each change makes an op differ from its entry, or its kernel fail, in a way the generated
    function must see as the generic matcher does: both leave at the same op, or both fall back."""
    table = registry.tables["numpy"]
    key = kernel_key(Op.RELU, "dense")
    old = table[key]
    fail = [False]

    def flaky(a: Any, **kw: Any) -> Any:  # the same kernel object throughout; raises on demand
        if fail[0]:
            raise RuntimeError("injected")
        return old(a, **kw)

    table[key] = flaky
    results = []
    try:
        for compiled in (False, True):
            step, (x, w) = _step_of(change)
            fn = pg.compile(step) if compiled else step
            # (a listener hears both paths under twin_paths: there the generated one alone, against eager)
            twins = compiled and change != "listener"
            with twin_paths() if twins else contextlib.nullcontext() as counts:
                out = [fn(), fn()]
                out.append(fn())
                if change == "dtype":
                    out.append(fn(pg.tensor(x.numpy().astype(np.float32))))
                elif change == "attrs":
                    out.append(fn(axis=0))
                elif change == "kernel_swapped":
                    table[key] = lambda a, **kw: old(a, **kw) + 0.0
                    try:
                        out.append(fn())
                    finally:
                        table[key] = flaky
                elif change == "kernel_raises":
                    fail[0] = True
                    try:
                        out.append(fn())  # the kernel fault's fallback, on both paths
                    finally:
                        fail[0] = False
                elif change == "no_grad":
                    with pg.no_grad():
                        try:
                            fn()
                        except Exception as exc:  # noqa: BLE001 - backward without a graph: eager's error
                            out.append(type(exc).__name__)
                elif change == "listener":
                    seen: list = []

                    class Listener:
                        @pg.hookimpl
                        def polygrad_op_executed(self, op: str, backend: str, layout: str, inputs: Any,
                                                 output: Any) -> None:
                            seen.append((op, tuple(t.shape for t in inputs), output.shape))

                    plugin = Listener()
                    pg.register_plugin(plugin, name="test-forward-fast-listener")
                    try:
                        out.append(fn())
                        out.append(fn())
                    finally:
                        pg.unregister_plugin(plugin)
                    out.append(seen)
                elif change == "requires_grad":
                    w.requires_grad = False
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001 - nothing requires grad: eager's error
                        out.append(type(exc).__name__)
                    w.requires_grad = True
                out += [fn(), fn()]
            if twins:
                assert counts.matched > 0
                assert counts.left > 0 or change == "kernel_raises", change
            results.append(out)
    finally:
        table[key] = old
    assert_bitwise(results[1], results[0], change)


def test_templates_are_shared_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of one shape of op share one compiled template; past the bound, entries keep the
    generic matcher (and still match)."""
    step, _ = _step_of("plain")
    fn = pg.compile(step)
    fn()
    fn()
    assert all(e.fast is not None for e in fn._forward_plan if not e.slow)
    monkeypatch.setattr(forward_fast, "_templates", {})
    monkeypatch.setattr(forward_fast, "MAX_TEMPLATES", 0)
    fn.clear()
    eager_step, _ = _step_of("plain")
    with twin_paths() as counts:
        assert_bitwise([fn() for _ in range(3)], [eager_step() for _ in range(3)], "generic entries")
    assert all(e.fast is None for e in fn._forward_plan)
    assert counts.matched == 0 and fn.stats["forward_matched"] > 0  # matched, by the generic matcher


def test_an_input_from_another_op_of_the_call_clears_whole_on_both_paths() -> None:
    """Every check passes but an input comes from another earlier op of the call than when the
    entry was recorded (same shapes): the op still matches, the call is no longer ``whole`` (its
    backward must not take the recipe shortcut) -- on the generated path as on the generic one."""
    rng = np.random.default_rng(4)
    x = pg.tensor(rng.normal(size=(4, 3)))
    w1, w2 = (pg.tensor(rng.normal(size=(3, 3)), requires_grad=True) for _ in range(2))

    def step(swap: bool) -> list:
        w1.grad = w2.grad = None
        a, b = x @ w1, x @ w2
        loss = ((b if swap else a) * 2.0 + (a if swap else b).relu()).sum()
        loss.backward()
        return [loss.numpy(), w1.grad.numpy(), w2.grad.numpy()]

    fn = pg.compile(step)
    pattern = [False, False, True, False, True, True, False]
    with twin_paths() as counts:
        got = [fn(s) for s in pattern]
    assert_bitwise(got, [step(s) for s in pattern], "swapped origins")
    assert counts.matched > 0 and counts.left == 0


def test_an_op_that_leaves_then_raises_numbers_leaves_as_the_generic_matcher() -> None:
    """A leaf first, then an operand of another shape: the op leaves the plan (after the generic
    matcher numbered the leaf) and its inference raises; the step catches the error and goes on.
    Both paths number the leaves alike, and the numbers are eager's."""
    rng = np.random.default_rng(7)
    w = pg.tensor(rng.normal(size=(3, 3)), requires_grad=True)
    ok, bad = pg.tensor(rng.normal(size=(3, 3))), pg.tensor(rng.normal(size=(2, 5)))

    def step(other: Any) -> list:
        w.grad = None
        out: list = []
        try:
            h = w * other
        except pg.errors.PolygradError as exc:
            out.append(type(exc).__name__)
            h = w * 2.0
        loss = (h @ w).sum()
        loss.backward()
        return out + [loss.numpy(), w.grad.numpy()]

    fn = pg.compile(step)
    pattern = [ok, ok, bad, ok, bad, bad, ok, ok]
    with twin_paths() as counts:
        got = [fn(o) for o in pattern]
    assert_bitwise(got, [step(o) for o in pattern], "leave, raise, go on")
    assert counts.left > 0 and counts.matched > 0


def test_the_inlined_constructors_cover_every_slot():
    """forward_fast builds result tensors, stand-ins and graph nodes inline (what ``Tensor._make``,
    ``graph.stand_in`` and ``Node.__init__`` do): a slot added to either class must be set there
    too, so this fails until the generated source is updated with it."""
    import inspect

    from polygrad.engine.graph import Node
    from polygrad.tensor import Tensor

    src = inspect.getsource(forward_fast._factory)
    for cls, var in ((Tensor, "r"), (Tensor, "s{j}"), (Node, "nd")):
        for slot in cls.__slots__:
            if slot != "__weakref__":
                assert f"{var}.{slot} = " in src, f"forward_fast does not set {cls.__name__}.{slot} on {var}"
