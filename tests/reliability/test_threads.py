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
from tests.helpers import wait_for_forked_child

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


# -- pg.set_num_threads: the setting, its validation, the default, fork safety (issue 21) -----------

def test_set_num_threads_round_trips_and_refuses_bad_counts():
    from polygrad.runtime.threads import ThreadCountError

    before = pg.get_num_threads()
    try:
        pg.set_num_threads(3)
        assert pg.get_num_threads() == 3
        pg.set_num_threads(np.int64(1))  # any integer type
        assert pg.get_num_threads() == 1
        for bad in (0, -2, 2.0, "2", True, None):
            with pytest.raises(ThreadCountError, match="pg.set_num_threads: the thread count must be an integer"):
                pg.set_num_threads(bad)
        assert pg.get_num_threads() == 1  # a refused value changes nothing
        assert issubclass(ThreadCountError, pg.errors.PolygradError) and issubclass(ThreadCountError, ValueError)
    finally:
        pg.set_num_threads(before)


def _python(code: str, **env: str):
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    return res


def test_the_environment_variable_sets_the_count_and_a_bad_one_is_named():
    ok = _python("import polygrad as pg; print(pg.get_num_threads())", POLYGRAD_NUM_THREADS="3")
    assert ok.returncode == 0 and ok.stdout.strip() == "3", ok.stderr
    bad = _python("import polygrad as pg; pg.get_num_threads()", POLYGRAD_NUM_THREADS="many")
    assert bad.returncode != 0 and "POLYGRAD_NUM_THREADS='many'" in bad.stderr


def test_the_default_is_the_cores_the_process_may_use(tmp_path):
    import os

    from polygrad.runtime.threads import available_cores

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    (tmp_path / "cpu.max").write_text("max 100000\n")           # cgroup v2, no quota
    assert available_cores(str(tmp_path)) == affinity
    (tmp_path / "cpu.max").write_text("150000 100000\n")        # 1.5 CPUs: rounded up
    assert available_cores(str(tmp_path)) == min(affinity, 2)
    (tmp_path / "cpu.max").write_text("50000 100000\n")         # half a CPU: still one thread
    assert available_cores(str(tmp_path)) == 1
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")    # cgroup v1: one CPU
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cores(str(v1)) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")        # v1, no quota
    assert available_cores(str(v1)) == affinity
    assert available_cores(str(tmp_path / "missing")) == affinity


def test_blas_follows_the_setting():
    from polygrad.runtime.threads import _loaded_openblas, set_blas_threads

    if not _loaded_openblas():
        pytest.skip("no OpenBLAS loaded in this process (numpy built against another BLAS)")
    assert set_blas_threads(1) >= 1


def test_a_block_that_raises_reraises_in_the_caller_after_the_others_finish():
    from polygrad.runtime.threads import run_blocks

    done = []

    def block(i):
        if i == 3:
            raise KeyError("block 3")
        done.append(i)

    with pytest.raises(KeyError, match="block 3"):
        run_blocks(block, [(i,) for i in range(8)], threads=2)
    assert 3 not in done


def test_a_child_forked_after_the_pool_started_runs_parallel_kernels():
    import os
    import warnings

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    from polygrad.backends import parallel
    from polygrad.runtime.threads import run_blocks

    run_blocks(lambda i: None, [(i,) for i in range(4)], threads=2)  # the pool's threads exist now
    n = parallel.DENSE_PARALLEL_MIN
    x = pg.tensor(np.arange(n, dtype=np.float32))
    want = (x * 2.0).numpy().copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: its copy of the pool has no threads; a new pool must be made
        code = 1
        try:
            pg.set_num_threads(2)
            ok = np.array_equal((x * 2.0).numpy(), want)
            hits = []
            run_blocks(lambda i: hits.append(i), [(i,) for i in range(6)], threads=2)
            code = 0 if ok and sorted(hits) == list(range(6)) else 1
        finally:
            os._exit(code)
    wait_for_forked_child(pid, 60, "the forked child hung on polygrad's thread pool")
