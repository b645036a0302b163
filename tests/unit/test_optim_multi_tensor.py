"""Small parameters updated as one concatenation (polygrad.optim.multi_tensor) against the
one-parameter path, bit for bit.

The slow path is the same optimizer with ``_update`` overridden by a subclass (which the step
never puts together: a subclass's update is host code).  Parameters of mixed shapes and dtypes,
some without a gradient, a sparse one, and several steps (so the state read back is the
concatenation's views) must end with the same parameter and state bits.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import optim
from polygrad.optim import multi_tensor

from tests.helpers import assert_bitwise


def _slow(cls: type) -> type:
    class OneByOne(cls):  # type: ignore[valid-type,misc]
        def _update(self, *args: Any) -> Any:
            return super()._update(*args)
    return OneByOne


OPTIMIZERS = [
    (optim.Adam, {"lr": 0.01}),
    (optim.Adam, {"lr": 0.003, "weight_decay": 0.1}),
    (optim.AdamW, {"lr": 0.02}),
    (optim.SGD, {"lr": 0.1}),
    (optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
]


@st.composite
def _params(draw: Any) -> list:
    shapes = draw(st.lists(st.sampled_from([(), (1,), (3,), (2, 3), (4, 1), (0,), (5, 2)]), min_size=1, max_size=6))
    out = []
    for shape in shapes:
        dtype = draw(st.sampled_from([np.float32, np.float64]))
        size = int(np.prod(shape))
        x = np.asarray(draw(st.lists(st.floats(-4, 4, width=32), min_size=size, max_size=size)), dtype=dtype)
        grads = [np.asarray(draw(st.lists(st.floats(-4, 4, width=32), min_size=size, max_size=size)),
                            dtype=dtype).reshape(shape) if draw(st.booleans()) or k == 0 else None
                 for k in range(3)]
        out.append((x.reshape(shape), grads))
    return out


def _run(cls: type, kwargs: dict, params: list) -> list:
    tensors = [pg.tensor(x.copy(), requires_grad=True) for x, _ in params]
    opt = cls(tensors, **kwargs)
    for step in range(3):
        for t, (_, grads) in zip(tensors, params):
            t.grad = None if grads[step] is None else pg.tensor(grads[step])
        opt.step()
    seen: list = [t.numpy().copy() for t in tensors]
    for t in tensors:
        state = opt.state.get(id(t), {})
        seen.append([[k, np.array(v, copy=True) if hasattr(v, "shape") else v] for k, v in sorted(state.items())])
    return seen


@settings(max_examples=120, deadline=None)
@given(params=_params(), which=st.sampled_from(range(len(OPTIMIZERS))))
def test_updates_together_are_the_one_by_one_bits(params: list, which: int) -> None:
    cls, kwargs = OPTIMIZERS[which]
    assert_bitwise(_run(cls, kwargs, params), _run(_slow(cls), kwargs, params))


def test_parameters_sharing_a_rule_are_updated_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = multi_tensor.run_together

    def counting(rule: Any, members: Any) -> Any:
        calls.append(len(members))
        return real(rule, members)

    monkeypatch.setattr("polygrad.optim.optimizer.run_together", counting)
    f32 = [pg.tensor(np.ones((2, 3), np.float32), requires_grad=True) for _ in range(3)]
    f64 = [pg.tensor(np.ones(4), requires_grad=True) for _ in range(2)]
    opt = optim.Adam(f32 + f64, lr=0.1)
    for t in f32 + f64:
        t.grad = pg.tensor(np.full(t.shape, 0.5, dtype=t.dtype))
    opt.step()
    assert sorted(calls) == [2, 3]  # one call per dtype
    assert all(t.dtype == np.float32 and t.shape == (2, 3) for t in f32)


@pytest.mark.parametrize("cls, kwargs", OPTIMIZERS)
def test_a_sparse_parameter_with_a_sparse_gradient_gets_the_one_by_one_bits(cls: type, kwargs: dict) -> None:
    def run(c: type) -> list:
        w = pg.sparse_coo(np.array([[0, 1, 2], [1, 2, 0]]), np.array([0.5, -1.0, 2.0]), (3, 3),
                          dtype=pg.float64, requires_grad=True)
        d = pg.tensor(np.linspace(-1, 1, 6).reshape(3, 2), requires_grad=True)
        b = pg.tensor(np.array([0.25, -0.5]), requires_grad=True)
        opt = c([w, d, b], **kwargs)
        for _ in range(3):
            opt.zero_grad()
            ((w @ d) + b).relu().sum().backward()
            opt.step()
        return [w.values.numpy().copy(), d.numpy().copy(), b.numpy().copy()]

    assert_bitwise(run(cls), run(_slow(cls)))


def test_a_rule_with_non_array_results_runs_one_by_one() -> None:
    rule = optim.optimizer.Rule(lambda x, g, *numbers: (x - g, 1.0), {}, (), (), ("count",))
    members = [(np.ones(2), np.ones(2), {}), (np.ones(3), np.ones(3), {})]
    assert multi_tensor.run_together(rule, members) is None
