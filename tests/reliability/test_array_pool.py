"""The host array pool (polygrad.runtime.pool): a buffer is reused only when nothing can see it.

Attacks: every way a caller can keep a view of a pooled array alive (slices, transposes, a
memoryview, DLPack, a tensor, a user's ``t.numpy()``), threads allocating at once, stale contents
after reuse, an address-space limit that idle buffers would exhaust, sizes that keep changing,
and the switch to turn it off.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.pool import HOST_POOL, ArrayPool

from tests.helpers import wait_for_forked_child

from ._limited import run_limited

SMALL_MIN = 1 << 12  # a test pool pools arrays of 4 KiB and up


def _buffer(a: np.ndarray) -> np.ndarray:
    """The pool's buffer under a handed-out array (view -> asarray -> owner -> buffer)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return getattr(a, "buffer", a)


def test_small_arrays_are_not_pooled():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((10,), np.float32)
    assert a.base is None and pool.misses == 0 and pool.pooled_bytes() == 0


def test_buffer_is_reused_only_after_the_last_reference_goes():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((64, 64), np.float64)
    first = weakref.ref(_buffer(a))  # a weak reference does not keep the buffer busy
    b = pool.empty((64, 64), np.float64)
    assert not np.shares_memory(a, b)
    del a
    c = pool.empty((64, 64), np.float64)
    assert _buffer(c) is first() and pool.hits == 1
    assert not np.shares_memory(b, c)


@pytest.mark.parametrize("keep", [
    lambda a: a[::3],                       # a strided slice
    lambda a: a.T,                          # a transposed view
    lambda a: a.reshape(-1),                # a reshaped view
    lambda a: memoryview(a),                # the buffer protocol
    lambda a: np.from_dlpack(a),            # a DLPack consumer
    lambda a: a.view(np.int32),             # a reinterpretation
])
def test_anything_derived_from_an_array_keeps_its_buffer_busy(keep):
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((64, 64), np.float32)
    a[...] = 7.0
    kept = keep(a)
    del a
    gc.collect()
    b = pool.empty((64, 64), np.float32)
    b[...] = -1.0
    assert not np.shares_memory(np.asarray(kept), b)
    assert (np.asarray(kept).view(np.float32) == 7.0).all()


def test_different_sizes_and_dtypes_get_exact_sized_buffers():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((1024,), np.float64)
    del a
    b = pool.empty((2048,), np.float32)  # same byte count: reused, reinterpreted
    assert b.dtype == np.float32 and b.shape == (2048,) and pool.hits == 1
    c = pool.empty((4096,), np.float32)  # other size: a new buffer
    assert c.nbytes == 16384 and pool.misses == 2


def test_zeros_clears_a_reused_buffer():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((1000,), np.float64)
    a[...] = np.nan
    del a
    z = pool.zeros((1000,), np.float64)
    assert pool.hits == 1 and not z.any()


def test_threads_never_share_a_live_buffer():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    errors = []

    def worker(tag: int) -> None:
        for _ in range(300):
            a = pool.empty((2048,), np.float32)
            a.fill(tag)
            for _ in range(3):  # hold it a moment while others allocate
                pool.empty((2048,), np.float32).fill(-1)
            if not (a == tag).all():
                errors.append(tag)
            del a

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and pool.hits > 0


def test_pool_never_exceeds_max_bytes_and_release_frees_idle_buffers():
    pool = ArrayPool(min_bytes=SMALL_MIN, max_bytes=5 * 8192)
    live = [pool.empty((1024,), np.float64) for _ in range(8)]  # 8 x 8 KiB: only 5 fit the pool
    assert pool.pooled_bytes() <= 5 * 8192
    del live
    assert pool.idle_bytes() == pool.pooled_bytes() > 0
    pool.release()
    assert pool.pooled_bytes() == 0 and pool.idle_bytes() == 0


def test_numpy_kernels_write_every_element_of_a_reused_buffer():
    # outputs of pooled kernels equal numpy's even when the buffer held other data before
    n = HOST_POOL.min_bytes // 4  # float32 elements of one pooled buffer
    rng = np.random.default_rng(0)
    a = rng.normal(size=n).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    ta, tb = pg.tensor(a), pg.tensor(b)
    for _ in range(3):
        for got, want in [((ta + tb).numpy(), a + b), ((ta * tb).numpy(), a * b),
                          (ta.relu().numpy(), np.maximum(a, 0)), ((ta < tb).numpy(), a < b),
                          ((-ta).numpy(), -a)]:
            np.testing.assert_array_equal(got, want)
            del got
    assert HOST_POOL.hits > 0


def test_an_array_the_user_holds_is_never_overwritten():
    n = HOST_POOL.min_bytes // 4
    x = pg.tensor(np.ones(n, dtype=np.float32))
    held = (x * 3.0).numpy()        # the user keeps the output's array
    for _ in range(4):               # later ops may reuse idle buffers, never this one
        (x * 5.0).numpy()
    assert (held == 3.0).all()


def test_training_matches_with_the_pool_on_and_off():
    code = """
import numpy as np, polygrad as pg
from polygrad import nn, optim
pg.manual_seed(0)
x = pg.tensor(np.random.default_rng(0).normal(size=(40_000, 64)).astype(np.float32))
model = nn.MLP(64, [64, 4])
opt = optim.Adam(model.parameters(), lr=0.01)
for _ in range(3):
    h = nn.dropout(model(x), 0.5)
    loss = (h * h).mean()
    opt.zero_grad(); loss.backward(); opt.step()
from polygrad.runtime.pool import HOST_POOL
print(repr(float(loss.item())), HOST_POOL.enabled, HOST_POOL.hits > 0)
"""
    out = {}
    for flag in ("1", "0"):
        env = dict(os.environ, POLYGRAD_NUMPY_POOL=flag)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
        out[flag] = res.stdout.split()
    assert out["1"][0] == out["0"][0]                   # identical losses
    assert out["1"][1:] == ["True", "True"] and out["0"][1:] == ["False", "False"]


def test_idle_buffers_are_given_back_under_an_address_space_limit():
    # 4 idle 64 MiB buffers and 300 MiB of headroom: a 256 MiB array of another size only fits
    # once the pool gives its idle buffers back (an allocation failure does that, then retries)
    got = run_limited("""
from polygrad.runtime.pool import ArrayPool
pool = ArrayPool()
def fill():
    held = [pool.empty((8 << 20,), np.float64) for _ in range(4)]
    del held
    assert pool.idle_bytes() == 4 * (64 << 20)
    big = pool.empty((32 << 20,), np.float64)
    big.fill(1.0)
    assert pool.idle_bytes() == 0
case("retry", fill)
""", headroom=420 << 20)
    assert got["retry"]["type"] == "ok", got["retry"]


def test_idle_buffers_count_as_available_to_the_memory_budget(monkeypatch):
    from polygrad.runtime import memory
    from polygrad.runtime import pool as array_pool
    from polygrad.runtime.registry import registry

    numpy_backend = registry.get("numpy")
    n = HOST_POOL.min_bytes // 4
    a = numpy_backend.kernels[(pg.Op.ADD, "dense")](np.ones(n, np.float32), np.ones(n, np.float32))
    del a
    idle = HOST_POOL.idle_bytes()
    assert idle >= n * 4
    frozen = array_pool.available_memory_bytes()
    monkeypatch.setattr(array_pool, "available_memory_bytes", lambda: frozen)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: frozen)
    assert memory.available_bytes() == frozen + idle         # host checks (pg.zeros, pg.load, ...)
    assert memory.available_bytes("numpy") == frozen + idle  # the numpy backend reports no figure of its own


def test_the_memory_budget_is_capped_by_the_cgroup_limit(monkeypatch):
    # in a container psutil reports the host's memory; the budget must see the cgroup's memory.max
    from polygrad.runtime import memory
    from polygrad.runtime import pool as array_pool

    HOST_POOL.release()  # no idle buffers: the budget is the cgroup's figure alone
    host = array_pool.psutil.virtual_memory().available
    monkeypatch.setattr(array_pool, "_cgroup_memory", lambda root="": (600 << 20, 500 << 20))  # 100 MiB left
    assert memory.available_bytes() == 100 << 20 < host
    with pytest.raises(pg.errors.MemoryBudgetError, match="would need"):
        memory.check("test_op", 200 << 20)
    monkeypatch.setattr(array_pool, "_cgroup_memory", lambda root="": (None, None))  # no limit: psutil's figure
    assert abs(memory.available_bytes() - HOST_POOL.idle_bytes() - host) < 1 << 30


def test_a_large_allocation_under_memory_pressure_gives_idle_buffers_back_first(monkeypatch):
    from polygrad.runtime import pool as array_pool

    pool = ArrayPool(min_bytes=SMALL_MIN)
    held = [pool.empty((1024,), np.float64) for _ in range(3)]
    del held
    assert pool.idle_bytes() == 3 * 8192
    monkeypatch.setattr(array_pool.psutil, "virtual_memory", lambda: type("VM", (), {"available": 20000})())
    new = pool.empty((2048,), np.float64)  # 16 KiB of 20 KB available: the idle 24 KiB go back first
    assert pool.idle_bytes() == 0 and pool.pooled_bytes() == new.nbytes == 16384


def test_buffers_of_sizes_no_longer_used_are_given_back():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    for step in range(40):  # every step a new size, as with mini-batches of varying sizes
        a = pool.empty((1024 + 8 * step,), np.float64)
        b = pool.empty((1024 + 8 * step,), np.float64)
        del a, b
    assert pool.idle_buffers() <= 2 * (array_pool_evict() + 1)
    # a steady loop keeps its buffers: no misses, nothing aged
    steady = ArrayPool(min_bytes=SMALL_MIN)
    for _ in range(50):
        a = steady.empty((2048,), np.float64)
        b = steady.empty((4096,), np.float64)
        del a, b
    assert steady.misses == 2 and steady.hits == 98


def array_pool_evict() -> int:
    from polygrad.runtime.pool import EVICT_AFTER_MISSES
    return EVICT_AFTER_MISSES


def test_calibration_is_not_fooled_by_a_tracer_reading_frame_locals():
    # a debugger-like tracer active while polygrad is imported (and while it runs) must not make
    # a held buffer look idle
    code = """
import sys, numpy as np
def tracer(frame, event, arg):
    frame.f_locals
    return tracer
sys.settrace(tracer)
import polygrad as pg
from polygrad.runtime.pool import HOST_POOL
x = pg.tensor(np.ones(2_100_000, dtype=np.float32))
a = (x * 2.0).numpy()
b = (x * 5.0).numpy()
sys.settrace(None)
c = (x * 7.0).numpy()
print(bool(np.shares_memory(a, b) or np.shares_memory(a, c)), float(a[0]), float(b[0]))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    shared, a0, b0 = res.stdout.split()
    assert shared == "False" and float(a0) == 2.0 and float(b0) == 5.0


def test_an_allocation_made_while_the_pool_holds_its_lock_does_not_deadlock(monkeypatch):
    # a finalizer run by a garbage collection inside the pool (or a signal handler) may allocate
    # or give a buffer back: simulated deterministically from inside the pool's own allocation
    from polygrad.runtime import pool as array_pool

    pool = ArrayPool(min_bytes=SMALL_MIN)
    inner: list = []
    real_allocate = array_pool._allocate
    given_back = [pool.empty((512,), np.float64)]

    def allocate(nbytes):
        if not inner:
            inner.append(None)
            inner[0] = pool.empty((2048,), np.float64)  # re-enters, under the lock
            given_back.clear()                          # a buffer given back, under the lock
        return real_allocate(nbytes)

    monkeypatch.setattr(array_pool, "_allocate", allocate)
    outer: list = []
    worker = threading.Thread(target=lambda: outer.append(pool.empty((1024,), np.float64)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the pool deadlocked on a re-entrant allocation"
    assert outer and inner and not np.shares_memory(outer[0], inner[0])
    assert pool.idle_bytes() == 512 * 8  # the buffer given back under the lock is idle


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_holds_the_lock_can_allocate():
    import warnings

    pool = ArrayPool(min_bytes=SMALL_MIN)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: the lock it inherited is held by a thread that does not exist here
        try:
            pool.empty((4096,), np.float64)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    release.set()
    holder.join()
    wait_for_forked_child(pid, 30, "the forked child deadlocked on the pool's lock")


def test_a_reused_buffer_is_no_longer_marked_shared():
    from polygrad.runtime import sharing

    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((1024,), np.float64)
    sharing.mark_shared(a)            # e.g. handed out by t.numpy()
    assert sharing.is_shared(a)
    del a
    b = pool.empty((1024,), np.float64)
    assert pool.hits == 1 and not sharing.is_shared(b)


def test_a_buffer_returns_when_its_last_view_dies_and_not_before():
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((64, 64), np.float64)
    views = [a[1:], a.T, memoryview(a), np.from_dlpack(a)]
    del a
    assert pool.idle_bytes() == 0
    while views:
        assert pool.idle_bytes() == 0  # some view still reaches the memory
        views.pop()
    assert pool.idle_bytes() == 64 * 64 * 8 and pool.pooled_bytes() == 64 * 64 * 8


def test_a_torch_tensor_keeps_its_buffer_busy():
    torch = pytest.importorskip("torch", reason="torch not installed")
    pool = ArrayPool(min_bytes=SMALL_MIN)
    a = pool.empty((1024,), np.float32)
    a[...] = 3.0
    t = torch.from_numpy(a)
    del a
    b = pool.empty((1024,), np.float32)
    b[...] = -1.0
    assert pool.idle_bytes() == 0 and float(t.sum()) == 3.0 * 1024
    del t
    assert pool.idle_bytes() == 4096


def test_sizes_that_keep_changing_keep_the_peak_within_1_2x_of_no_pool():
    # issue 26's case, scaled down: 40 outputs of 120-240 units, a few alive at a time; the pool's
    # peak (in use + idle) stays within 1.2x of the peak in use (what a process without it holds)
    from polygrad.runtime import pool as array_pool

    pool = ArrayPool(min_bytes=SMALL_MIN)
    rng = np.random.default_rng(0)
    live: list = []
    peak_in_use = peak_total = 0
    unit = 1 << 10  # float64 elements
    for _ in range(40):
        live.append(pool.empty((int(rng.integers(120, 241)) * unit,), np.float64))
        in_use = sum(x.nbytes for x in live)
        peak_in_use = max(peak_in_use, in_use)
        peak_total = max(peak_total, pool.pooled_bytes())
        if len(live) > 3:
            live.pop(0)
    assert peak_total <= (1 + array_pool.CHURN_IDLE_FRACTION) * peak_in_use
    del live
    # after the loop the pool keeps no more than that bound, and only buffers of recent sizes
    assert pool.idle_bytes() <= (1 + array_pool.CHURN_IDLE_FRACTION) * peak_in_use
    assert pool.idle_buffers() <= array_pool.EVICT_AFTER_MISSES + 1


# a GCN training step's large allocations in order, recorded from the 1M-node GCN of
# ``python -m benchmarks scale`` (sizes in units of 31 MiB: its N x 64 float32 arrays are 8, its
# N x 8 ones 1, the relu mask's booleans 2): ("take", name, units) / ("drop", name); "carry"
# lives on into the next step
GCN_STEP = [("take", "xw", 8), ("take", "ax", 8), ("drop", "xw"), ("take", "h", 8), ("drop", "ax"),
            ("take", "relu", 8), ("take", "mask", 8), ("take", "dropped", 8), ("drop", "relu"),
            ("take", "hw", 1), ("take", "ahw", 1), ("drop", "hw"), ("take", "logits", 1), ("drop", "ahw"),
            ("drop", "carry"), ("take", "carry", 1), ("take", "d_dropped", 8), ("drop", "logits"),
            ("drop", "dropped"), ("take", "d_relu", 8), ("drop", "d_dropped"), ("drop", "mask"),
            ("take", "positive", 2), ("take", "d_h", 8), ("drop", "positive"), ("drop", "h"),
            ("drop", "d_relu"), ("take", "d_x", 8), ("drop", "d_h"), ("drop", "d_x")]


def test_a_training_step_stops_missing_after_its_first_steps():
    # a step's buffers (in use + idle) exceed what it has in use at most of its misses: a bound on
    # idle memory relative to the memory in use *at the miss* gave back buffers the same step took
    # again later (6 misses every step here; 5-6 fresh 30-244 MiB arrays every epoch at scale)
    from polygrad.runtime import pool as array_pool

    unit = 1 << 12
    pool = ArrayPool(min_bytes=unit)
    live = {"carry": pool.empty((unit,), np.uint8)}
    peak_in_use = peak_total = 0
    misses = []
    for _ in range(6):
        before = pool.misses
        for what, name, *units in GCN_STEP:
            if what == "take":
                live[name] = pool.empty((units[0] * unit,), np.uint8)
                peak_in_use = max(peak_in_use, sum(a.nbytes for a in live.values()))
                peak_total = max(peak_total, pool.pooled_bytes())
            else:
                del live[name]
        misses.append(pool.misses - before)
    assert misses[2:] == [0, 0, 0, 0], misses
    assert peak_total <= (1 + array_pool.CHURN_IDLE_FRACTION) * peak_in_use


def test_idle_memory_is_bounded_by_the_cgroup_limit(tmp_path, monkeypatch):
    from polygrad.runtime import pool as array_pool

    (tmp_path / "memory.max").write_text("1073741824\n")      # cgroup v2: 1 GiB
    (tmp_path / "memory.current").write_text("805306368\n")   # 768 MiB used
    assert array_pool.memory_limit_bytes(str(tmp_path)) <= 1 << 30
    assert array_pool.available_memory_bytes(str(tmp_path)) <= 256 << 20
    (tmp_path / "memory.max").write_text("max\n")              # no limit: the system's figures
    assert array_pool.memory_limit_bytes(str(tmp_path)) == array_pool.psutil.virtual_memory().total
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(1 << 29) + "\n")
    (v1 / "memory.usage_in_bytes").write_text(str(1 << 28) + "\n")
    assert array_pool.available_memory_bytes(str(tmp_path / "v1")) <= 1 << 28


def test_the_pool_does_not_poll_reference_counts():
    import inspect

    from polygrad.runtime import pool as array_pool

    assert "getrefcount" not in inspect.getsource(array_pool)
