"""Starting or joining the cluster the ``dask`` backend runs on.

``connect(scheduler=ADDRESS)`` joins a running ``dask scheduler``; ``connect(workers=N)`` starts a
``distributed.LocalCluster`` of N worker *processes* on this machine.  Either way the Client
becomes dask's default client, which the backend's kernels and ``materialize`` then use.

An address that cannot be reached, is not an address, or where something other than a dask
scheduler listens (an HTTP server, the dashboard's port 8787) raises
:class:`polygrad.errors.BackendUnavailableError` naming it within ``timeout`` seconds: before
dask's Client sees a ``tcp://`` address, :func:`probe_scheduler` checks that the peer greets
with dask's handshake (dask would otherwise wait forever for an HTTP server, or read its reply's
first 8 bytes as a frame length and ask for exabytes).

Everything this module starts listens on the loopback interface only (scheduler, workers and
their HTTP endpoints on 127.0.0.1, no dashboard), unless the caller passes another ``host`` or a
``dashboard_address``.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import socket
import struct
import time
from typing import Any

from polygrad.errors import BackendUnavailableError

#: seconds to wait for a scheduler before giving up (POLYGRAD_DASK_TIMEOUT overrides)
DEFAULT_TIMEOUT = float(os.environ.get("POLYGRAD_DASK_TIMEOUT", "10"))

#: ``off`` keeps glibc's and dask's heap settings on the workers polygrad starts (:func:`heap_environ`)
HEAP_REUSE_ENV = "POLYGRAD_DASK_HEAP_REUSE"
#: the workers' glibc heap: arrays up to 32 MiB (a 500k x 16 float32 block) come from the heap, up
#: to 1 GiB freed at its top stays there for the next step's arrays, and at most 2 arenas hold it
#: (glibc's default is 8 per core; likely cause, not traced: an array a communication thread
#: received goes back to that thread's arena when a task frees it, unused by the task thread)
HEAP_REUSE_ENVIRON = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30),
                      "MALLOC_ARENA_MAX": "2"}


def heap_environ(memory_limit: Any) -> dict:
    """Environment for the worker processes polygrad starts: :data:`HEAP_REUSE_ENVIRON` unless
    ``memory_limit`` is an explicit cap or ``POLYGRAD_DASK_HEAP_REUSE=off``.

    Why: a training step allocates the same large arrays every epoch (block products, gradients,
    arrays received from the other worker).  With dask's ``MALLOC_TRIM_THRESHOLD_=65536`` and
    glibc's own mmap threshold each one is fresh memory from the kernel, page-faulted and zeroed on
    first touch, where the numpy backend reuses pooled buffers.  Measured at 1M nodes / 2 workers,
    interleaved against dask's settings: the workers' task CPU per epoch 2.42-2.48 s against
    2.49-2.90 s, faster epochs in 5 of 6 pairs, worker peak 501 against 456 MB.  Two arenas, not
    glibc's default of 8 per core, measured at 1M nodes in 4 interleaved pairs (round 12): worker
    peaks 464 and 483 MB against 481 and 502 in every pair, task CPU per epoch 1.01-1.12 s against
    1.13-1.16, the epoch shorter in 3 of 4, the same parameter bytes.  Workers with an
    explicit ``memory_limit`` keep dask's settings: their cap is checked against the process's RSS
    (``memcap``, dask's nanny), which must then fall when arrays are freed."""
    if os.environ.get(HEAP_REUSE_ENV, "").strip().lower() == "off":
        return {}
    if memory_limit not in ("auto", None, 0, "0"):
        return {}
    return dict(HEAP_REUSE_ENVIRON)


@contextlib.contextmanager
def _spawn_environment(heap: dict):
    """While worker processes start: dask's pre-spawn environment plus ``heap``, and this process's
    environment as it was afterwards.  dask's nanny copies its pre-spawn environment into the
    process that runs it (here), and a variable already in this environment beats dask's config:
    so ``heap`` is put here too while the workers start (an earlier cluster left dask's 64 KiB trim
    threshold here), and while a cluster without ``heap`` starts, values equal to
    :data:`HEAP_REUSE_ENVIRON`'s are taken out (a restart of a heap-reusing cluster copies them here
    again: dask's nanny does so on each start)."""
    import dask

    saved = {k: os.environ.get(k) for k in HEAP_REUSE_ENVIRON}
    if heap:
        os.environ.update(heap)
    else:
        for k, v in HEAP_REUSE_ENVIRON.items():
            if os.environ.get(k) == v:
                del os.environ[k]
    spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **heap}
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: how often the scheduler and the workers of clusters started here wake their event loop to
#: check that it is responsive (dask's ``distributed.admin.tick.interval``; dask's default is
#: 20 ms, its own test suite runs at 500 ms).  The check only feeds a log line after
#: ``distributed.admin.tick.limit`` (3 s) without a tick, and a metric; each wake-up costs CPU
#: that training needs.  Measured on this project's 2-core machine, an idle 2-worker cluster used
#: 51 ms of CPU per second in the client's process (scheduler) and 25-28 in each worker at 20 ms,
#: against 14 and 4-5 at 1 s; at 1M nodes, in 3 interleaved pairs, the epoch took 0.67-0.93 of
#: the time at 20 ms and the client's CPU per epoch 0.15-0.21 s against 0.24-0.31.
TICK_INTERVAL = "500ms"
#: dask's config setting it
_TICK = {"distributed.admin.tick.interval": TICK_INTERVAL}

#: where clusters started here listen (scheduler, workers, HTTP endpoints): this machine only
LOOPBACK = "127.0.0.1"
#: largest first message accepted from a scheduler during the probe: dask's handshake is a few
#: hundred bytes; an HTTP reply read as a length gives ~3e18
MAX_HANDSHAKE_BYTES = 1 << 20


def _unavailable(scheduler: Any, timeout: float, why: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"backend 'dask': cannot join the dask scheduler at {scheduler!r} within {timeout:g} s: {why}; "
        "start one with `dask scheduler` and check the address (the scheduler's port, 8786 by "
        "default, not the dashboard's 8787) and firewall")


def _host_port(scheduler: Any, timeout: float) -> tuple[str, str, int]:
    """(protocol, host, port) of ``scheduler``, or a BackendUnavailableError saying why not."""
    from distributed.comm.addressing import parse_address, parse_host_port

    if not isinstance(scheduler, str) or not scheduler.strip():
        raise _unavailable(scheduler, timeout, f"the address must be a string such as "
                           f"'tcp://127.0.0.1:8786', got {type(scheduler).__name__}")
    try:
        protocol, location = parse_address(scheduler.strip())
        if protocol != "tcp":
            return protocol, location, 0
        host, port = parse_host_port(location)
        port = int(port)
    except (ValueError, TypeError) as exc:
        raise _unavailable(scheduler, timeout, f"not an address ({exc})") from exc
    if not 0 < port < 65536:
        raise _unavailable(scheduler, timeout, f"port {port} is outside 1..65535")
    return protocol, host, port


def probe_scheduler(scheduler: str, timeout: float) -> None:
    """Check, within ``timeout`` seconds, that a dask scheduler listens at the ``tcp://`` address
    ``scheduler``: a dask server writes its handshake (an 8-byte little-endian length, then that
    many bytes) as soon as it accepts a connection.  Silence, a closed connection or an
    implausible length is a :class:`BackendUnavailableError` naming what answered instead.
    Other protocols (tls://, inproc://) are left to dask."""
    protocol, host, port = _host_port(scheduler, timeout)
    if protocol != "tcp":
        return
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out")
        return remaining

    try:
        with socket.create_connection((host, port), timeout=left()) as sock:
            head = b""
            while len(head) < 8:
                sock.settimeout(left())
                chunk = sock.recv(8 - len(head))
                if not chunk:
                    raise _unavailable(scheduler, timeout, "the peer closed the connection without dask's "
                                       "handshake: something other than a dask scheduler listens there")
                head += chunk
    except BackendUnavailableError:
        raise
    except socket.timeout as exc:
        raise _unavailable(scheduler, timeout, "no dask handshake arrived (nothing answered, or something "
                           "other than a dask scheduler listens there, such as an HTTP server or the "
                           "dashboard)") from exc
    except OSError as exc:
        raise _unavailable(scheduler, timeout, f"{type(exc).__name__}: {exc}") from exc
    (length,) = struct.unpack("<Q", head)
    if not 0 < length <= MAX_HANDSHAKE_BYTES:
        raise _unavailable(scheduler, timeout, f"the peer does not speak dask's protocol (it sent {head!r}, "
                           "e.g. an HTTP server such as the dashboard)")


def connect(scheduler: str | None = None, workers: int | None = None, threads_per_worker: int = 1,
            timeout: float | None = None, memory_limit: Any = "auto", host: str = LOOPBACK,
            dashboard_address: str | None = None) -> Any:
    """A ``distributed.Client`` on ``scheduler`` or on a new LocalCluster of ``workers`` processes.

    A new cluster listens on ``host`` (loopback by default) and has no dashboard unless
    ``dashboard_address`` is given (e.g. ``"127.0.0.1:8787"``); its workers run dask's statistical
    profiler only then (the profile the dashboard shows).  Its control messages are not held back
    for dask's 2-10 ms batching (:mod:`polygrad_dask.streams`; ``POLYGRAD_DASK_STREAM_INTERVAL_MS``),
    and its scheduler and workers check their event loops every :data:`TICK_INTERVAL`, not 20 ms.
    Its workers reuse their heap's memory for the next step's arrays unless ``memory_limit`` is
    an explicit cap (:func:`heap_environ`; ``POLYGRAD_DASK_HEAP_REUSE=off``).  A scheduler joined by
    address keeps all of its own settings."""
    # distributed is imported on use: loading polygrad's plugins must stay fast for everyone
    from distributed import Client, LocalCluster

    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if scheduler is not None:
        start = time.monotonic()
        probe_scheduler(scheduler, timeout)
        remaining = max(timeout - (time.monotonic() - start), 0.5)
        try:
            return Client(scheduler.strip(), timeout=remaining, set_as_default=True)
        except (OSError, TimeoutError, ValueError, TypeError, MemoryError) as exc:
            raise _unavailable(scheduler, timeout, f"{type(exc).__name__}: {exc}") from exc
    import dask

    from .memcap import NO_SPILL_NO_PAUSE
    from .streams import interval_s

    prompt = interval_s()  # a bad POLYGRAD_DASK_STREAM_INTERVAL_MS is refused before anything starts

    # a worker near its memory_limit fails its step (memcap) instead of spilling the working set
    # to disk or pausing (a hang); row blocks stay on their workers (``placed`` asks for them
    # loosely, and work stealing would move loosely placed tasks to an idle worker); without a
    # dashboard, the workers' statistical profiler is off: it samples every thread's stack 100 times
    # a second (for the dashboard's profile page and ``Client.profile``), which cost ~15% of the
    # workers' CPU per GCN epoch at 100k nodes on 2 shared cores (0.71-0.95 s against 0.85-1.08 s)
    # The workers' settings also go to each nanny as its own config (dotted keys, applied last in the
    # worker process): a nanny keeps a *shallow* copy of dask's config, whose nested dicts the end of
    # ``dask.config.set`` restores in place, so a worker the nanny (re)starts later -- after a kill,
    # or late on a loaded machine -- would otherwise profile, spill and pause with dask's defaults.
    worker_config = {**NO_SPILL_NO_PAUSE, "distributed.worker.profile.enabled": dashboard_address is not None,
                     **_TICK}
    # the heap settings go to each worker process as it starts (its nanny reads them once: restarts too)
    with _spawn_environment(heap_environ(memory_limit)), \
            dask.config.set({**worker_config, "distributed.scheduler.work-stealing": False}):
        cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=threads_per_worker, processes=True,
                               host=host, dashboard_address=dashboard_address,
                               scheduler_kwargs=_http_on(host, dashboard_address), memory_limit=memory_limit,
                               config=worker_config)
    return _started(Client(cluster, set_as_default=True), prompt)


def _started(client: Any, seconds: float | None) -> Any:
    """``client`` on a cluster polygrad started, with its control messages sent promptly
    (:mod:`polygrad_dask.streams`); a cluster joined by address keeps its own settings."""
    from .streams import make_prompt

    make_prompt(client, seconds)
    return client


def _http_on(host: str, dashboard_address: str | None) -> dict:
    """Scheduler options: without a dashboard, dask still serves /health and /metrics over HTTP,
    on ``host`` (it would pick all interfaces where the scheduler's own address has no host)."""
    return {} if dashboard_address is not None else {"dashboard_address": f"{host}:0"}


_own: Any = None


def client() -> Any:
    """dask's default Client; without one, an in-process cluster (threads, no dashboard, HTTP
    endpoints on loopback, event loops checked every :data:`TICK_INTERVAL`) started once, on
    first use, and kept."""
    global _own
    from distributed import Client, default_client

    try:
        return default_client()
    except ValueError:
        pass
    if _own is None or _own.status != "running":
        from .streams import interval_s

        prompt = interval_s()
        _own = _started(Client(in_process_cluster(), set_as_default=True), prompt)
        atexit.register(close, _own)  # a quiet shutdown instead of "lost computed tasks" warnings
    return _own


def in_process_cluster() -> Any:
    """The cluster :func:`client` starts when there is no default Client: one worker of 2
    threads in this process, no dashboard, HTTP endpoints on loopback, its event loops checked
    every :data:`TICK_INTERVAL`."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(_TICK):
        return LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                            scheduler_kwargs=_http_on(LOOPBACK, None), worker_dashboard_address=f"{LOOPBACK}:0")


def running() -> bool:
    """Whether a Client exists already (dask's default, or the one :func:`client` started)."""
    from distributed import default_client

    try:
        default_client()
    except ValueError:
        return _own is not None and _own.status == "running"
    return True


def close(client: Any) -> None:
    """Close ``client`` and, when it started it, its LocalCluster."""
    cluster = getattr(client, "cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


#: seconds a worker list read from the scheduler is reused when placing tasks (placement is a
#: preference, so a list a moment old is harmless; a round trip per kernel call is not)
HOMES_TTL_S = 2.0
_homes: list = []
_homes_at = -HOMES_TTL_S


#: addresses that name this machine: workers listening there share its memory
_THIS_MACHINE = {LOOPBACK, "localhost", "::1"}


def memory_headroom(client: Any) -> int | None:
    """Bytes the cluster's workers can still take for new arrays (which they hold in row blocks):
    over the workers, each one's ``memory_limit`` less its process's memory, from the scheduler's
    latest figures; where every worker runs on this machine (the clusters ``connect`` starts), at
    most what this machine has available (their limits may add up to more).  None where no worker
    runs or one has no memory limit: polygrad then checks against this process's memory."""
    import psutil
    from distributed.comm import get_address_host, parse_address

    workers = client.scheduler_info().get("workers", {})
    if not workers:
        return None
    total, here = 0, True
    for address, worker in workers.items():
        limit = worker.get("memory_limit") or 0
        if not limit:
            return None
        used = (worker.get("metrics") or {}).get("memory") or 0
        total += max(0, int(limit) - int(used))
        # an in-process worker ("inproc://", the cluster client() starts) lives in this process
        here = here and (parse_address(address)[0] == "inproc" or get_address_host(address) in _THIS_MACHINE)
    return min(total, int(psutil.virtual_memory().available)) if here else total


def homes(client: Any) -> list:
    """Worker address per row-block slot, stable: a worker keeps its slot while it lives; a slot
    whose worker left goes to a worker that has none (a restarted one), so the surviving
    workers' blocks stay where they are."""
    global _homes, _homes_at
    now = time.monotonic()
    if now - _homes_at < HOMES_TTL_S and _homes:
        return _homes
    alive = sorted(client.scheduler_info().get("workers", {}))
    kept = [a if a in alive else None for a in _homes]
    spare = [a for a in alive if a not in kept]
    out = []
    for a in kept:
        if a is None and spare:
            a = spare.pop(0)
        if a is not None:
            out.append(a)
    _homes, _homes_at = out + spare, now
    return _homes


def placed(client: Any, block: int) -> dict:
    """``submit`` options asking for row block ``block``'s worker, loosely (a lost worker's tasks
    run elsewhere rather than wait for it)."""
    where = homes(client)
    if not where:
        return {}
    return {"workers": [where[block % len(where)]], "allow_other_workers": True}


#: dask priority of a task whose result another worker waits for (a halo gather, a transposed
#: product's partial): a worker with it and local work ready at once runs it first, so the
#: transfer overlaps the local work instead of following it
TRAVELS_FIRST = 1


def pinned(block: int, travels: bool = False) -> Any:
    """``dask.annotate`` context for graph tasks of row block ``block`` (see :func:`placed`);
    ``travels``: their results go to another worker, which waits for them (:data:`TRAVELS_FIRST`).

    A worker runs one task at a time, in priority order, then graph order.  Without the priority,
    a worker would run its own SpMM tile (100+ ms at 1M nodes) before the 10 ms gather of the halo
    rows the other worker needs, and that worker would sit idle for the difference."""
    import dask

    options = placed(client(), block)
    if travels:
        options["priority"] = TRAVELS_FIRST
    return dask.annotate(**options)


def row_placement(collections: list, blocks: int, client_: Any) -> Any:
    """``dask.annotate`` context pinning every task of the graph of ``collections`` whose key
    names row block ``i`` of a row-blocked array -- a key ``(name, i, ...)`` of a layer whose
    first indices are exactly ``0 .. blocks-1`` -- to row block ``i``'s worker, loosely.

    Without it, the scheduler sends a task to whichever worker would start it first, so on a busy
    machine a step's activation block lands beside the wrong graph rows and every later op of that
    block drags it back; pinned, only halos travel.  Other tasks (weights, reductions' last
    levels, arrays split along other axes) may run on any worker."""
    import dask

    where = homes(client_)
    if blocks < 2 or len(where) < 2:
        return dask.annotate()
    firsts: dict = {}
    for c in collections:
        for key in c.__dask_graph__().keys():
            if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[1], int):
                firsts.setdefault(key[0], set()).add(key[1])
    row_blocked = {name for name, seen in firsts.items() if seen == set(range(blocks))}
    table = {}
    for c in collections:
        for key in c.__dask_graph__().keys():
            if isinstance(key, tuple) and key[0] in row_blocked:
                table[key] = [where[key[1] % len(where)]]
    everyone = list(where)
    return dask.annotate(workers=lambda key: table.get(key, everyone), allow_other_workers=True)
