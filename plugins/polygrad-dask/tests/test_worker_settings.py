"""Workers started by ``polygrad_dask.connect`` keep its settings (no statistical profiler, no
spilling, no pausing, prompt control streams) when their nanny starts them again: a worker
restarted after a kill used to come back with dask's defaults (its nanny held a shallow copy of
dask's config, whose nested dicts the end of ``dask.config.set`` restored in place)."""
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
            dask.config.get("distributed.worker.memory.target"))


def _prompt(client) -> bool:
    """Whether every control stream of the cluster and the client batches over streams.INTERVAL_S."""
    got = streams.intervals(client)
    seen = [*got["scheduler_to_workers"].values(), *got["workers"].values(), got["client"]]
    return len(got["workers"]) > 0 and set(seen) == {streams.INTERVAL_S}


def test_restarted_workers_keep_connects_settings():
    client = polygrad_dask.connect(workers=1, timeout=60)
    try:
        assert set(client.run(_settings).values()) == {(False, False, False, False)}
        assert _prompt(client)
        client.restart()  # every nanny starts its worker again, long after connect's config block ended
        assert set(client.run(_settings).values()) == {(False, False, False, False)}
        assert _prompt(client)  # the new worker processes and the scheduler's new streams to them
    finally:
        polygrad_dask.cluster.close(client)


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
