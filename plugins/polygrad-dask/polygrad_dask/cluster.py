"""Starting or joining the cluster the ``dask`` backend runs on.

``connect(scheduler=ADDRESS)`` joins a running ``dask scheduler``; ``connect(workers=N)`` starts a
``distributed.LocalCluster`` of N worker *processes* on this machine.  Either way the Client
becomes dask's default client, which the backend's kernels and ``materialize`` then use.  An
address that cannot be reached raises :class:`polygrad.errors.BackendUnavailableError` naming it
after ``timeout`` seconds, instead of dask's own retry loop.
"""
from __future__ import annotations

import atexit
import os
from typing import Any

from polygrad.errors import BackendUnavailableError

#: seconds to wait for a scheduler before giving up (POLYGRAD_DASK_TIMEOUT overrides)
DEFAULT_TIMEOUT = float(os.environ.get("POLYGRAD_DASK_TIMEOUT", "10"))


def connect(scheduler: str | None = None, workers: int | None = None, threads_per_worker: int = 1,
            timeout: float | None = None, memory_limit: Any = "auto") -> Any:
    """A ``distributed.Client`` on ``scheduler`` or on a new LocalCluster of ``workers`` processes."""
    # distributed is imported on use: loading polygrad's plugins must stay fast for everyone
    from distributed import Client, LocalCluster

    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if scheduler is not None:
        try:
            return Client(scheduler, timeout=timeout, set_as_default=True)
        except (OSError, TimeoutError) as exc:
            raise BackendUnavailableError(
                f"backend 'dask': cannot reach the dask scheduler at {scheduler} within {timeout:g} s "
                f"({type(exc).__name__}: {exc}); start one with `dask scheduler` and check the address "
                "and firewall") from exc
    cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=threads_per_worker, processes=True,
                           dashboard_address=None, memory_limit=memory_limit)
    return Client(cluster, set_as_default=True)


_own: Any = None


def client() -> Any:
    """dask's default Client; without one, an in-process cluster (threads) started once and kept."""
    global _own
    from distributed import Client, LocalCluster, default_client

    try:
        return default_client()
    except ValueError:
        pass
    if _own is None or _own.status != "running":
        _own = Client(LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                   dashboard_address=None), set_as_default=True)
        atexit.register(close, _own)  # a quiet shutdown instead of "lost computed tasks" warnings
    return _own


def close(client: Any) -> None:
    """Close ``client`` and, when it started it, its LocalCluster."""
    cluster = getattr(client, "cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()
