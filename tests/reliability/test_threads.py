"""Class 1a: backward passes in several threads that accumulate into the same leaves lose nothing.

Decision (docs/reliability.md): accumulation into ``.grad`` is serialised by a lock, so
concurrent ``backward()`` calls over graphs that share leaves are safe and exact.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import polygrad as pg
import polygrad.nn as nn

THREADS = 8
STEPS = 60


def _hammer(work) -> None:
    barrier = threading.Barrier(THREADS)
    errors: list = []

    def run():
        try:
            barrier.wait()
            for _ in range(STEPS):
                work()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("backend", ["numpy", "scalar"])
def test_concurrent_backward_loses_no_update(backend):
    x = pg.tensor(np.arange(4.0), dtype="float64", requires_grad=True, backend=backend)
    _hammer(lambda: (x * 3.0).sum().backward())
    np.testing.assert_array_equal(x.grad.numpy(), np.full(4, 3.0 * THREADS * STEPS))


def test_concurrent_backward_shared_model_parameters():
    """A model shared by worker threads (each its own batch): the summed grads are exact."""
    pg.manual_seed(0)
    lin = nn.Linear(3, 2, dtype="float64")
    batches = [np.full((2, 3), float(i + 1)) for i in range(THREADS)]
    counter = iter(range(10 ** 9))
    lock = threading.Lock()

    def work():
        with lock:
            i = next(counter) % THREADS
        lin(pg.tensor(batches[i])).sum().backward()

    _hammer(work)
    # every step adds d(sum(xW+b))/db = 2 per output
    np.testing.assert_allclose(lin.bias.grad.numpy(), np.full(2, 2.0 * THREADS * STEPS))


def test_pg_grad_in_threads_is_independent():
    """pg.grad returns gradients instead of accumulating: threads never see each other's."""
    x = pg.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    results: list = []
    lock = threading.Lock()

    def work():
        (g,) = pg.grad((x * x).sum(), x)
        with lock:
            results.append(g.numpy().tolist())

    _hammer(work)
    assert results == [[2.0, 4.0]] * (THREADS * STEPS)
    assert x.grad is None


def test_concurrent_backward_through_one_retained_graph():
    """Several threads backpropagating the same retained graph: each pass adds its full gradient."""
    x = pg.tensor([1.0, 2.0, 3.0], dtype="float64", requires_grad=True)
    y = ((x * x).exp() * 0.001).sum()
    _hammer(lambda: y.backward(retain_graph=True))
    want = THREADS * STEPS * 0.001 * 2 * x.numpy() * np.exp(x.numpy() ** 2)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


def test_concurrent_backward_through_one_freed_graph_raises_graph_error():
    """Without retain_graph the sequential rule holds: a second pass through freed nodes raises."""
    import sys
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: provoke mid-pass frees
    try:
        _race_freed_graph()
    finally:
        sys.setswitchinterval(old_interval)


def _race_freed_graph():
    for _ in range(40):
        x = pg.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
        y = x
        for _ in range(20):
            y = (y * 0.5).tanh() + x
        y = y.sum()
        errors: list = []

        def run(y=y, errors=errors):
            try:
                y.backward()
            except BaseException as exc:  # noqa: BLE001 - checked below: only GraphError allowed
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(errors) <= 1 and all(isinstance(e, pg.errors.GraphError) for e in errors), errors
        if not errors:  # both passes got through before the nodes were freed: both count fully
            ref = pg.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
            r = ref
            for _ in range(20):
                r = (r * 0.5).tanh() + ref
            r.sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), 2 * ref.grad.numpy())
