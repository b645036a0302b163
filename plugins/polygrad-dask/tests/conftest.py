"""Fixtures: the plugin registered (installed or from the checkout) and a LocalCluster of two
worker processes shared by the module's tests.  Every test skips cleanly without dask."""
from __future__ import annotations

import os
import sys

import pytest

try:
    import dask.array  # noqa: F401
    import distributed  # noqa: F401
except ImportError:  # the tests skip themselves (pytest.importorskip at their top)
    distributed = None

if distributed is not None:
    try:
        import polygrad_dask  # noqa: F401
    except ImportError:  # running from the source tree, not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import polygrad_dask  # noqa: F401

#: seconds any single cluster operation in these tests may take before it is a failure
TIMEOUT = 120


def _installed() -> bool:
    """Whether polygrad loaded polygrad-dask through its entry point."""
    from polygrad.registry import registry
    registry.load()
    entry = registry.entries.get("dask")
    return entry is not None and entry.origin == "polygrad-dask" and entry.backend is not None


@pytest.fixture(scope="session")
def dask_plugin():
    """The plugin module, registered (through its entry point, or for the session only)."""
    if _installed():
        yield polygrad_dask
        return
    from polygrad.testing.temporary import temporary_plugin
    with temporary_plugin(polygrad_dask, "dask"):
        yield polygrad_dask


@pytest.fixture(scope="session")
def cluster_client(dask_plugin):
    """A LocalCluster of 2 worker processes (the default client while it lives), 2 row blocks."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster, set_as_default=True, timeout=TIMEOUT)
    saved = dask_plugin.chunks.partitions, dask_plugin.chunks.min_block_rows
    dask_plugin.chunks.set_partitions(2)
    dask_plugin.chunks.min_block_rows = 1  # small test graphs still get two row blocks
    try:
        yield client
    finally:
        dask_plugin.chunks.set_partitions(saved[0])
        dask_plugin.chunks.min_block_rows = saved[1]
        client.close()
        cluster.close()
