"""Class 6 (monitor): a monitor records only its own thread, and reports NaN-producing kernels."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import polygrad as pg


def test_monitor_ignores_other_threads_ops():
    stop = threading.Event()
    started = threading.Event()

    def noisy():
        started.set()
        while not stop.is_set():
            x = pg.tensor([1.0, 2.0], requires_grad=True)
            (x.exp() * 3).sum().backward()

    t = threading.Thread(target=noisy)
    t.start()
    started.wait()
    try:
        with pg.monitor() as m:
            y = pg.tensor([1.0, 2.0]) + 1   # exactly one op in this thread
    finally:
        stop.set()
        t.join()
    rec = m.steps[-1]
    assert sum(rec.ops.values()) == 1, rec.ops
    assert ("add", "numpy", "dense") in rec.ops
    assert rec.grad_norms == []           # the other thread's backward passes are not ours
    assert y.numpy().tolist() == [2.0, 3.0]


def test_two_monitors_in_two_threads_each_see_their_own():
    results = {}
    barrier = threading.Barrier(2)

    def work(name, n):
        with pg.monitor() as m:
            barrier.wait()
            for _ in range(n):
                pg.tensor([1.0]) * 2
            barrier.wait()
        results[name] = sum(m.steps[-1].ops.values())

    threads = [threading.Thread(target=work, args=("a", 5)), threading.Thread(target=work, args=("b", 11))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": 5, "b": 11}


def test_all_threads_option_records_everything():
    with pg.monitor(all_threads=True) as m:
        t = threading.Thread(target=lambda: pg.tensor([1.0]) * 2)
        t.start()
        t.join()
    assert sum(m.steps[-1].ops.values()) == 1


def test_nan_producing_kernel_is_reported(caplog):
    from polygrad.testing import inject_fault
    with caplog.at_level(logging.WARNING, logger="polygrad.runtime.monitor"):
        with pg.monitor() as m, inject_fault("numpy", "exp", mode="nan"):
            pg.tensor([0.0, 1.0]).exp()
            pg.tensor([0.0, 1.0]).exp()
    rec = m.steps[-1]
    assert rec.nan_ops == {"exp/numpy/dense": 2}
    assert sum("produced NaN from NaN-free inputs" in w for w in rec.warnings) == 1   # warned once
    assert "exp" in caplog.text and "NaN" in caplog.text
    assert "nan-producing ops 2" in rec.line()


def test_nan_propagated_from_input_is_not_blamed_on_the_kernel():
    with pg.monitor() as m:
        pg.tensor([np.nan, 1.0]).exp()
    assert not m.steps[-1].nan_ops


def test_nan_check_can_be_switched_off():
    with pg.monitor(check_nan=False) as m, np.errstate(all="ignore"):
        pg.tensor([-1.0]).log()
    assert not m.steps[-1].nan_ops


@pytest.mark.parametrize("backend", ["scalar", "numpy"])
def test_nan_from_math_is_reported_on_every_backend(backend):
    with pg.monitor() as m:
        with np.errstate(all="ignore"):
            pg.tensor([0.0], backend=backend) / pg.tensor([0.0], backend=backend)
    assert any(k.startswith("mul/") for k in m.steps[-1].nan_ops), m.steps[-1].nan_ops
