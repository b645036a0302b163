"""The generated recipe walk (``backward_plan._materializer``) against the generic one it replaces
(``Recipe.walk``): for every backward pass a default-mode call takes the recipe shortcut for, both
run on the same graph and must return the same tensors, nodes and leaves (by identity) or both
refuse -- over the forward-plan tests' random diverging programs (parameters frozen before or
after the forward, gradients kept or cleared, one, two or no backward passes) and hand-made
changes of what a recipe re-checks (a ``requires_grad`` flipped, a ``.grad`` of another dtype).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
from hypothesis import HealthCheck, given, settings

import polygrad as pg
from polygrad.compile import backward_plan
from polygrad.compile.backward_plan import Recipe, _Key, _materializer

from ..helpers import assert_bitwise
from .test_compile_forward_plan import programs, run


@contextlib.contextmanager
def twin_walks() -> Iterator[list]:
    """Each recipe's walk run generated and generically; the outcomes (None or not) collected."""
    original = Recipe.materialize
    outcomes: list = []

    def both(self: Recipe, root: Any) -> Any:
        slow = self.walk(root)
        fast = _materializer(self)(root)
        assert (slow is None) == (fast is None)
        if slow is not None:
            for a, b in zip(slow, fast):
                assert len(a) == len(b) and all(x is y for x, y in zip(a, b))
        outcomes.append(fast is not None)
        return fast

    Recipe.materialize = both  # type: ignore[method-assign]
    try:
        yield outcomes
    finally:
        Recipe.materialize = original  # type: ignore[method-assign]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_recipe_walk_equals_the_generic_one(spec: dict) -> None:
    eager, _ = run(spec, compiled=False)
    with twin_walks():
        compiled, _ = run(spec, compiled=True)
    assert_bitwise(compiled, eager, "compiled vs eager")


def test_recipe_rechecks_refuse_on_both_walks() -> None:
    rng = np.random.default_rng(5)
    x = pg.tensor(rng.normal(size=(4, 3)))
    w = pg.tensor(rng.normal(size=(3, 2)), requires_grad=True)
    b = pg.tensor(np.zeros(2), requires_grad=True)

    def step(clear: bool = True) -> list:
        if clear:
            w.grad = b.grad = None
        loss = ((x @ w + b).relu() * 0.5).sum()
        loss.backward()
        return [loss.numpy(), None if w.grad is None else w.grad.numpy(), None if b.grad is None else b.grad.numpy()]

    def calls(fn: Any) -> list:
        out = [fn(), fn(), fn()]
        b.requires_grad = False  # a node input's requires_grad differs: the recipe refuses
        out.append(fn())
        b.requires_grad = True
        out += [fn(), fn(clear=False)]  # leaves have a .grad now: refused, then a recipe of its own
        out.append(fn(clear=False))
        w.grad = pg.tensor(np.zeros((3, 2), dtype=np.float32))  # a .grad of another dtype
        try:
            out.append(fn(clear=False))
        except Exception as exc:  # noqa: BLE001 - eager's error must be compiled's too
            out.append(type(exc).__name__)
        out += [fn(), fn()]
        return out

    w0, b0 = w.numpy().copy(), b.numpy().copy()
    eager = calls(step)
    w.update_(w0.copy())
    b.update_(b0.copy())
    fn = pg.compile(step)
    with twin_walks() as outcomes:
        compiled = calls(fn)
    assert_bitwise(compiled, eager, "recipe re-checks")
    assert True in outcomes and False in outcomes  # the shortcut both ran and was refused


def test_keys_hash_once_and_compare_by_structure() -> None:
    a, b = _Key((("add", (2, 3)), (), "f8")), _Key((("add", (2, 3)), (), "f8"))
    assert a == b and hash(a) == hash(b) and a is not b
    assert {a: 1}[b] == 1
    assert a != _Key((("mul", (2, 3)), (), "f8")) and a != a.parts
    assert backward_plan.MAX_PLANS > 0


def test_recipes_hold_the_caches_key_object() -> None:
    """A recipe finds its plan list with the very key object the cache holds (no deep compare of
    the structure per backward pass), also after its structure was recorded again."""
    rng = np.random.default_rng(6)
    x = pg.tensor(rng.normal(size=(4, 3)))
    w = pg.tensor(rng.normal(size=(3, 2)), requires_grad=True)

    def step() -> float:
        w.grad = None
        loss = (x @ w).relu().sum()
        loss.backward()
        return loss.item()

    fn = pg.compile(step)
    for _ in range(4):
        fn()
    (plans,) = fn.plans._plans.values()
    plans.clear()  # as when a plan is dropped after a failing kernel: the structure records again
    for _ in range(4):
        fn()
    recipes = [r for e in fn._forward_plan for r in e.recipes]
    assert recipes and fn.plans.stats["shortcut"] >= 2
    assert all(any(k is r.key for k in fn.plans._plans) for r in recipes[:1])
    assert all(p.key is k for k, ps in fn.plans._plans.items() for p in ps)
