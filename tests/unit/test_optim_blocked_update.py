"""Optimizer updates of large host parameters run in blocks on polygrad's threads
(polygrad.optim.blocked_update): the same bits as the whole-array update, at 1, 2, 3 and 7 threads.

The size from which parameters are blocked is made zero here, so generated parameters of a few
dozen elements cut into several uneven blocks.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
import polygrad.optim as optim
from polygrad.optim import blocked_update

THREAD_COUNTS = (1, 2, 3, 7)

OPTIMIZERS = {
    "adam": lambda ps: optim.Adam(ps, lr=0.01),
    "adam_l2": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.02, betas=(0.8, 0.99)),
    "sgd": lambda ps: optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
}


@pytest.fixture
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(blocked_update, "PARALLEL_MIN", 0)
    before = pg.get_num_threads()
    yield
    pg.set_num_threads(before)


def _train(make, shape, dtype, seed: int, steps: int, threads: list[int]):
    """Parameters and state after ``steps`` updates, the thread count set before each."""
    rng = np.random.default_rng(seed)
    w = pg.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
    opt = make([w])
    for count in threads[:steps]:
        pg.set_num_threads(count)
        w.grad = pg.tensor(rng.standard_normal(shape).astype(dtype))
        opt.step()
    state = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in opt.state[id(w)].items()}
    return w.numpy().copy(), state


def _whole(make, shape, dtype, seed: int, steps: int, monkeypatch):
    """The slow path that defines the answer: every update on the whole arrays."""
    monkeypatch.setattr(blocked_update, "PARALLEL_MIN", 1 << 62)
    try:
        return _train(make, shape, dtype, seed, steps, [1] * steps)
    finally:
        monkeypatch.setattr(blocked_update, "PARALLEL_MIN", 0)


def _same(a, b) -> bool:
    (pa, sa), (pb, sb) = a, b
    if pa.dtype != pb.dtype or pa.shape != pb.shape or pa.tobytes() != pb.tobytes() or set(sa) != set(sb):
        return False
    for k in sa:
        x, y = sa[k], sb[k]
        if isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.shape == y.shape and x.dtype == y.dtype
                    and x.tobytes() == y.tobytes()):
                return False
        elif x != y:
            return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(OPTIMIZERS)), st.sampled_from([(1,), (50,), (6, 9), (3, 4, 5)]),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31))
def test_blocked_updates_are_bit_identical_to_whole_ones(tiny_blocks, monkeypatch, name, shape, dtype, seed):
    make = OPTIMIZERS[name]
    want = _whole(make, shape, dtype, seed, 3, monkeypatch)
    for count in THREAD_COUNTS:
        assert _same(_train(make, shape, dtype, seed, 3, [count] * 3), want), (name, count)
    assert _same(_train(make, shape, dtype, seed, 3, [2, 1, 7]), want)  # the count changes between steps


def test_large_parameters_are_really_cut_into_blocks(tiny_blocks, monkeypatch):
    calls: list[int] = []
    real = optim.Adam._update

    def spy(self, x, g, *args):
        calls.append(x.size)
        return real(self, x, g, *args)

    monkeypatch.setattr(optim.Adam, "_update", spy)
    _train(OPTIMIZERS["adam"], (50,), np.float32, 0, 1, [2])
    assert sum(calls) == 50 and len(calls) == 2 * blocked_update.BLOCKS_PER_THREAD  # 2 threads
    calls.clear()
    _train(OPTIMIZERS["adam"], (50,), np.float32, 0, 1, [1])
    assert calls == [50]  # one thread: the whole array at once


def test_an_update_that_is_not_elementwise_runs_whole(tiny_blocks):
    # a rule that reads the whole tensor (a norm, as LAMB's trust ratio) does not opt in
    class NormSGD(optim.SGD):
        elementwise_update = False

        def _update(self, x, g, lr, group, state, fast):
            return x - lr * g / float(np.linalg.norm(g))

    rng = np.random.default_rng(0)
    w = pg.tensor(rng.standard_normal(50), requires_grad=True)
    before = w.numpy().copy()
    g = rng.standard_normal(50)
    w.grad = pg.tensor(g)
    pg.set_num_threads(3)
    NormSGD([w], lr=0.1).step()
    np.testing.assert_allclose(w.numpy(), before - 0.1 * g / np.linalg.norm(g), rtol=1e-12)
