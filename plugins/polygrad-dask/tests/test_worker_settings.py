"""Workers started by ``polygrad_dask.connect`` keep its settings (no statistical profiler, no
spilling, no pausing, prompt control streams, the heap settings of ``cluster.heap_environ``, the
event-loop check every ``cluster.TICK_INTERVAL``) when
their nanny starts them again: a worker restarted after a kill used to come back with dask's
defaults (its nanny held a shallow copy of dask's config, whose nested dicts the end of
``dask.config.set`` restored in place)."""
from __future__ import annotations

import pytest

pytest.importorskip("distributed")

import polygrad_dask  # noqa: E402
from polygrad_dask import streams  # noqa: E402

from polygrad.errors import ArgumentError  # noqa: E402


def _settings(dask_worker=None) -> tuple:
    import dask

    return ("profile" in dask_worker.periodic_callbacks,
            dask.config.get("distributed.worker.memory.spill"), dask.config.get("distributed.worker.memory.pause"),
            dask.config.get("distributed.worker.memory.target"), _tick_ms(dask_worker))


def _tick_ms(server) -> float:
    """How often ``server`` (a worker or the scheduler) checks its event loop, in ms."""
    return server.periodic_callbacks["tick"].callback_time


def _scheduler_tick_ms(dask_scheduler=None) -> float:
    return _tick_ms(dask_scheduler)


#: ``cluster.TICK_INTERVAL`` in ms, and what dask's default would give
TICK_MS, DASK_TICK_MS = 500.0, 20.0


def _prompt(client) -> bool:
    """Whether every control stream of the cluster and the client batches over streams.INTERVAL_S."""
    got = streams.intervals(client)
    seen = [*got["scheduler_to_workers"].values(), *got["workers"].values(), got["client"]]
    return len(got["workers"]) > 0 and set(seen) == {streams.INTERVAL_S}


def _heap() -> tuple:
    import os

    return (os.environ.get("MALLOC_MMAP_THRESHOLD_"), os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            os.environ.get("MALLOC_ARENA_MAX"))


HEAP_REUSED = (str(32 * 2**20), str(2**30), "2")


@pytest.fixture
def environment_kept():
    """This process's environment as it was: a restart copies dask's pre-spawn environment (the
    heap settings included) into the process running the nanny, here."""
    import os

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.usefixtures("environment_kept")
def test_restarted_workers_keep_connects_settings(monkeypatch):
    # as after another cluster's start in this process: dask's nanny left its trim threshold here
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    client = polygrad_dask.connect(workers=1, timeout=60)
    try:
        assert set(client.run(_settings).values()) == {(False, False, False, False, TICK_MS)}
        assert client.run_on_scheduler(_scheduler_tick_ms) == TICK_MS
        assert _prompt(client)
        assert set(client.run(_heap).values()) == {HEAP_REUSED}  # no explicit cap: the heap is reused
        client.restart()  # every nanny starts its worker again, long after connect's config block ended
        assert set(client.run(_settings).values()) == {(False, False, False, False, TICK_MS)}
        assert _prompt(client)  # the new worker processes and the scheduler's new streams to them
        assert set(client.run(_heap).values()) == {HEAP_REUSED}
    finally:
        polygrad_dask.cluster.close(client)


def test_heap_reuse_only_without_an_explicit_cap(monkeypatch):
    """An explicit memory_limit is checked against the worker's RSS, which must fall when arrays are
    freed: such workers keep dask's heap settings (its 64 KiB trim threshold), as does
    POLYGRAD_DASK_HEAP_REUSE=off; "auto", 0 and None reuse the heap."""
    from polygrad_dask import cluster

    for limit in ("auto", 0, None, "0"):
        assert cluster.heap_environ(limit) == cluster.HEAP_REUSE_ENVIRON
    for limit in ("400MiB", 2**30, 0.5):
        assert cluster.heap_environ(limit) == {}
    import os

    for limit, want in (("auto", HEAP_REUSED), ("2GiB", (None, "65536", None))):  # a capped one after a reusing one
        before = {k: os.environ.get(k) for k in cluster.HEAP_REUSE_ENVIRON}
        client = polygrad_dask.connect(workers=1, timeout=60, memory_limit=limit)
        try:
            assert set(client.run(_heap).values()) == {want}
            # dask's nanny copied its pre-spawn environment into this process; connect put it back
            assert {k: os.environ.get(k) for k in cluster.HEAP_REUSE_ENVIRON} == before
        finally:
            polygrad_dask.cluster.close(client)
    monkeypatch.setenv(cluster.HEAP_REUSE_ENV, "off")
    assert cluster.heap_environ("auto") == {}


def test_stream_interval_off_keeps_dasks_and_a_bad_value_is_refused(monkeypatch):
    """POLYGRAD_DASK_STREAM_INTERVAL_MS=off leaves dask's batching as it is (2-10 ms); a value that
    is not milliseconds in [0, 1000] is refused with the variable's name, before any cluster starts."""
    monkeypatch.setenv(streams.INTERVAL_ENV, "off")
    client = polygrad_dask.connect(workers=1, timeout=60)
    try:
        got = streams.intervals(client)
        assert streams.INTERVAL_S not in {*got["scheduler_to_workers"].values(), *got["workers"].values(),
                                          got["client"]}
    finally:
        polygrad_dask.cluster.close(client)
    for bad in ("fast", "-1", "5000", "nan"):
        monkeypatch.setenv(streams.INTERVAL_ENV, bad)
        with pytest.raises(ArgumentError, match=streams.INTERVAL_ENV):
            streams.interval_s()
    with pytest.raises(ArgumentError, match=streams.INTERVAL_ENV):
        polygrad_dask.connect(workers=1, timeout=60)  # refused before any worker starts
    monkeypatch.setenv(streams.INTERVAL_ENV, "2")
    assert streams.interval_s() == 0.002


def test_the_tick_interval_is_connects_own_and_dasks_default_stays_elsewhere():
    """The event-loop check every ``cluster.TICK_INTERVAL`` (not dask's 20 ms) holds for clusters
    polygrad starts -- worker processes and their scheduler (above), and the in-process cluster
    ``cluster.client()`` starts when there is no default Client -- and leaves dask's config as it
    was for everything else."""
    import dask
    from distributed import LocalCluster

    from polygrad_dask import cluster

    assert dask.utils.parse_timedelta(cluster.TICK_INTERVAL, default="ms") * 1000 == TICK_MS
    assert dask.config.get("distributed.admin.tick.interval") in ("20ms", "20 ms")
    own = cluster.in_process_cluster()
    try:
        assert _tick_ms(own.scheduler) == TICK_MS
        assert {_tick_ms(w) for w in own.workers.values()} == {TICK_MS}
    finally:
        own.close()
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as plain:
        assert _tick_ms(plain.scheduler) == DASK_TICK_MS   # connect's setting did not leak
        assert {_tick_ms(w) for w in plain.workers.values()} == {DASK_TICK_MS}
