"""A pure replay guards which of its optimizers' parameters have a gradient.

An optimizer updates exactly the parameters with a ``.grad``; a parameter the step never reads can
be given one outside the step (an auxiliary loss backpropagated apart).  The review of round 7
found a replay kept skipping it where eager updated it (a finite wrong number, no error).
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import optim
from tests.helpers import assert_bitwise

PATTERNS = {"from-the-fourth-call": lambda k: k >= 3, "once": lambda k: k == 6, "every-other": lambda k: k % 2 == 1,
            "never": lambda k: False}


def _run(compiled: bool, make_opt, given) -> tuple[list, dict]:
    w = pg.tensor(np.linspace(0.5, 1.5, 3).astype(np.float32), requires_grad=True)
    c = pg.tensor(np.ones(2, np.float32), requires_grad=True)  # never read by the step
    opt = make_opt([w, c])

    def step(x):
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss

    fn = pg.compile(step, pure=True) if compiled else step
    out = []
    for k in range(12):
        opt.zero_grad()
        if given(k):
            c.grad = pg.tensor(np.full(2, 0.25 * k, np.float32))
        out.append(fn(pg.tensor(np.full(3, 1.0 + k, np.float32))).numpy().copy())
    return [w.numpy(), c.numpy(), *out], getattr(fn, "stats", {})


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("make_opt", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                                      lambda ps: optim.Adam(ps, lr=0.1)], ids=["sgd-momentum", "adam"])
def test_a_gradient_given_outside_the_step_is_followed(pattern, make_opt):
    got, stats = _run(True, make_opt, PATTERNS[pattern])
    want, _ = _run(False, make_opt, PATTERNS[pattern])
    assert_bitwise(got, want)
    if pattern != "every-other":  # (a guard that flips every call captures every call: eager's cost)
        assert stats["replays"] > 0  # the guard does not just turn compilation off
