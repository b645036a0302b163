"""Workers started by ``polygrad_dask.connect`` keep its settings (no statistical profiler, no
spilling, no pausing) when their nanny starts them again: a worker restarted after a kill used to
come back with dask's defaults (its nanny held a shallow copy of dask's config, whose nested
dicts the end of ``dask.config.set`` restored in place)."""
from __future__ import annotations

import pytest

pytest.importorskip("distributed")

import polygrad_dask  # noqa: E402


def _settings(dask_worker=None) -> tuple:
    import dask

    return ("profile" in dask_worker.periodic_callbacks,
            dask.config.get("distributed.worker.memory.spill"), dask.config.get("distributed.worker.memory.pause"),
            dask.config.get("distributed.worker.memory.target"))


def test_restarted_workers_keep_connects_settings():
    client = polygrad_dask.connect(workers=1, timeout=60)
    try:
        assert set(client.run(_settings).values()) == {(False, False, False, False)}
        client.restart()  # every nanny starts its worker again, long after connect's config block ended
        assert set(client.run(_settings).values()) == {(False, False, False, False)}
    finally:
        polygrad_dask.cluster.close(client)
