"""Prompt control messages on the clusters polygrad starts.

distributed sends the small control messages of each long-lived connection through a
``BatchedSend``: a message written less than its *interval* after the previous send waits for the
interval to end, so that bursts go out as one write.  The intervals are fixed in distributed's code
(not in dask's config): scheduler -> worker 5 ms, worker -> scheduler 2 ms, client -> scheduler
10 ms, scheduler -> client 2 ms.

A training step is a chain of dependent tasks -- an SpMM's block product, the bias add, the relu,
the loss's reductions, where one worker waits for the other's partial -- and each hop is a
"task finished" up to the scheduler and a "compute task" down to a worker.  Inside a chain of short
tasks the previous message on the same stream is usually less than an interval old, so each hop
waits for up to 2 + 5 ms of batching; a 1M-node GCN epoch makes some 40 such hops one after the
other (dask task-stream timelines).  Clusters started by :func:`polygrad_dask.connect` or on first
use (:func:`polygrad_dask.cluster.client`) batch over :data:`INTERVAL_S` instead: messages still
coalesce while a write is in flight, but none waits for a timer.  A cluster joined by address keeps
its own settings: it may serve other clients.

``POLYGRAD_DASK_STREAM_INTERVAL_MS`` sets the interval in milliseconds (``off`` keeps dask's).
The setting reaches the scheduler's stream to every worker (and to each worker that joins later,
say after a restart), every worker's stream to the scheduler (a worker plugin: restarted workers
too), and the streams between the scheduler and the clients connected when it is made (the
client that started the cluster).  A client that connects later, or reconnects, keeps dask's
2-10 ms (the scheduler makes a client's stream after its plugins hear of the client).  The first
interval set on a cluster stays (the plugins are idempotent).  It only changes when messages
leave, never what they say.
"""
from __future__ import annotations

import os
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from polygrad.errors import ArgumentError

#: environment variable: the batching interval in milliseconds, or ``off`` for dask's own
INTERVAL_ENV = "POLYGRAD_DASK_STREAM_INTERVAL_MS"
#: seconds a control stream batches messages for (dask's: 2-10 ms)
INTERVAL_S = 0.0005


def interval_s() -> float | None:
    """The interval to use (seconds), from :data:`INTERVAL_ENV`; None for dask's own."""
    raw = os.environ.get(INTERVAL_ENV, "").strip().lower()
    if not raw:
        return INTERVAL_S
    if raw == "off":
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise ArgumentError(f"{INTERVAL_ENV}={raw!r}: expected milliseconds (e.g. 0.5) or 'off'") from None
    if not 0.0 <= ms <= 1000.0:
        raise ArgumentError(f"{INTERVAL_ENV}={raw!r}: expected milliseconds in [0, 1000] or 'off'")
    return ms / 1000.0


def _set(stream: Any, seconds: float) -> None:
    """``stream.interval = seconds`` for a ``BatchedSend`` (anything else, or a distributed whose
    streams changed shape, is left alone: the setting is a speed-up, never needed)."""
    if stream is not None and isinstance(getattr(stream, "interval", None), (int, float)):
        stream.interval = seconds


class PromptScheduler(SchedulerPlugin):
    """The scheduler's streams to its workers, now and as they join, and to the clients it has now."""

    name = "polygrad-prompt-streams"
    idempotent = True

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def start(self, scheduler: Any) -> None:
        for stream in [*getattr(scheduler, "stream_comms", {}).values(),
                       *getattr(scheduler, "client_comms", {}).values()]:
            _set(stream, self.seconds)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        # the scheduler makes a worker's stream just before it calls the plugins' add_worker
        _set(getattr(scheduler, "stream_comms", {}).get(worker), self.seconds)


class PromptWorker(WorkerPlugin):
    """A worker's stream to the scheduler (every worker, restarted ones included)."""

    name = "polygrad-prompt-streams"
    idempotent = True

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def setup(self, worker: Any) -> None:
        _set(getattr(worker, "batched_stream", None), self.seconds)


def make_prompt(client: Any, seconds: float | None) -> None:
    """Give the cluster behind ``client`` (one polygrad started) and the client itself the
    interval ``seconds`` (:func:`interval_s`, read before the cluster starts; None: dask's own)."""
    if seconds is None:
        return
    client.register_plugin(PromptScheduler(seconds))
    client.register_plugin(PromptWorker(seconds))
    _set(getattr(client, "scheduler_comm", None), seconds)


def intervals(client: Any) -> dict:
    """The batching intervals in use (seconds): ``scheduler_to_workers`` and ``workers`` by
    address, and ``client`` (for tests and diagnostics)."""
    def on_scheduler(dask_scheduler: Any = None) -> dict:
        return {w: getattr(s, "interval", None) for w, s in dask_scheduler.stream_comms.items()}

    def on_worker(dask_worker: Any = None) -> float | None:
        return getattr(getattr(dask_worker, "batched_stream", None), "interval", None)

    return {"scheduler_to_workers": client.run_on_scheduler(on_scheduler), "workers": client.run(on_worker),
            "client": getattr(getattr(client, "scheduler_comm", None), "interval", None)}
