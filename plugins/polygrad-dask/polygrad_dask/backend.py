"""The ``dask`` backend: dask arrays chunked by rows, run on a ``distributed`` cluster.

Dense tensors are ``dask.array`` arrays whose first axis (nodes) is split into
:func:`polygrad_dask.chunks.row_chunks` -- a function of the length only, so every ``N x F`` array of one
graph has the same row blocks and elementwise ops never re-chunk.  Kernels build task graphs;
values are computed when read (``to_numpy``: ``.numpy()``, ``.item()``, printing) or by
:meth:`DaskBackend.materialize`, which optimizers and ``fit`` call once per step so graphs stay
bounded.  Sparse ops run block by block on the workers (``sparse_kernels``).
"""
from __future__ import annotations

import operator
import time
import uuid
import warnings
from typing import Any

import dask
import dask.array as da
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph
import numpy as np

import polygrad as pg
from polygrad.errors import BackendError
from polygrad.ir.ops import Op

from . import chunks, cluster, dense_kernels, loss_kernels, sparse_kernels

#: bytes up to which a materialised array of one row block is replicated on two workers, so that losing one
#: worker loses no parameter or optimizer state (they are small; graph data is recomputed)
REPLICATE_MAX_BYTES = 64 << 20
#: arrays up to this size handed to ``from_numpy`` stay embedded in the graphs that use them
#: (scalars, weights: no round trip to the cluster); larger ones are sent to the workers once
EMBED_MAX_BYTES = 1 << 20
#: seconds a cluster memory figure is reused: one step's memory checks (a dozen) ask the scheduler
#: once, and its figures lag the workers' heartbeats anyway
MEMORY_FIGURE_TTL_S = 1.0


def _quiet(fn):
    """Run ``fn`` without dask's "large object in the graph" warning: arrays handed to
    ``from_numpy`` are embedded on purpose (their task is their lineage: a lost worker's chunk
    is rebuilt from it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ll]arge object.*")
        warnings.filterwarnings("ignore", message=".*[Ss]ending large graph.*")
        return fn()


class DaskBackend(pg.Backend):
    name = "dask"
    description = "dask arrays chunked by rows on a distributed cluster (polygrad-dask)"
    install_hint = "pip install ./plugins/polygrad-dask"
    lazy = True
    # pg.compile replays kernels eagerly and reads their results between steps; a lazy backend
    # already builds each step as one task graph, so replay would save nothing and its guards
    # were never checked against dask's graph building: run steps eagerly.
    supports_replay = False

    def __init__(self, partitions: int | None = None) -> None:
        super().__init__()
        # arrays submit() persisted that no materialize has waited for yet, by name, with their
        # chunks' keys: fit reads them through materialize, which then reports their failure and
        # replicates them.  A submission fit discards (a rolled-back epoch) is never materialized:
        # its entry goes at the next submit once the client holds none of its futures
        self._unconfirmed: dict[str, list] = {}
        self._memory_figure: tuple[float, int | None] | None = None  # (when, memory_available())
        self.kernels = {(op, "dense"): fn for op, fn in dense_kernels.KERNELS.items()}
        for layout in ("csr", "coo"):  # both layouts share polygrad's canonical CSR storage
            self.kernels.update({(op, layout): fn for op, fn in sparse_kernels.KERNELS.items()})
            self.vjp_kernels[(Op.SPMM, layout)] = sparse_kernels.spmm_vjp
            self.vjp_kernels[(Op.SDDMM, layout)] = sparse_kernels.sddmm_vjp
        # the loss's per-row work as one task per row block (the composite's bits, loss_kernels)
        self.kernels[(Op.CROSS_ENTROPY, "dense")] = loss_kernels.cross_entropy_kernel
        self.vjp_kernels[(Op.CROSS_ENTROPY, "dense")] = loss_kernels.cross_entropy_vjp
        self.kernels[(Op.SOFT_CROSS_ENTROPY, "dense")] = loss_kernels.soft_cross_entropy_kernel
        self.vjp_kernels[(Op.SOFT_CROSS_ENTROPY, "dense")] = loss_kernels.soft_cross_entropy_vjp
        if partitions is not None:
            chunks.set_partitions(partitions)

    # -- the cluster ---------------------------------------------------------------------------
    def client(self) -> Any:
        return cluster.client()

    def connect(self, *, scheduler: str | None = None, workers: int | None = None) -> Any:
        client = cluster.connect(scheduler=scheduler, workers=workers)
        n = len(client.scheduler_info().get("workers", {}))
        chunks.set_partitions(max(chunks.partitions, n, 1))
        return _Closing(client)

    def memory_available(self, device: int = 0) -> int | None:
        """Bytes the cluster's workers can still take (:func:`polygrad_dask.cluster.memory_headroom`),
        for polygrad's memory checks: a dask array lives on the workers, so this process's memory
        (the default) would refuse a graph larger than the client though the cluster holds it --
        and ask psutil a dozen times per step.  The figure is reused for :data:`MEMORY_FIGURE_TTL_S`.
        None (this process's memory) while no cluster runs: a check must not start one."""
        if not cluster.running():
            return None
        now = time.monotonic()
        if self._memory_figure is None or now - self._memory_figure[0] > MEMORY_FIGURE_TTL_S:
            self._memory_figure = (now, cluster.memory_headroom(self.client()))
        return self._memory_figure[1]

    # -- availability ---------------------------------------------------------------------------
    def is_available(self) -> bool:
        try:
            import distributed  # noqa: F401
        except ImportError:
            return False
        return True

    def unavailable_reason(self) -> str:
        return "the 'distributed' package is not installed (pip install distributed)"

    # -- arrays -----------------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """Row blocks per array and pattern (``polygrad_dask.chunks``)."""
        return chunks.partitions

    @partitions.setter
    def partitions(self, n: int) -> None:
        chunks.set_partitions(n)

    def from_numpy(self, array: np.ndarray) -> Any:
        # a copy: the graph must not see later in-place edits of the caller's array
        host = np.array(array, copy=True)
        # a fresh name, not a hash of the content: two equal arrays (two all-ones value vectors)
        # would share keys, and releasing one would cancel the other's futures
        x = da.from_array(host, chunks=chunks.chunks_for(host.shape), asarray=False, name=False)
        if host.nbytes <= EMBED_MAX_BYTES:
            return x
        return _quiet(lambda: _persist(self.client(), [x])[0])

    def to_numpy(self, array: Any) -> np.ndarray:
        if isinstance(array, da.Array):
            if not cluster.running() and not _futures_of(array):
                # nothing of it lives on a cluster and none runs: compute it here rather than start
                # one (pg.list_backends() probes to_numpy: listing backends must start nothing)
                return np.asarray(_quiet(lambda: array.compute(scheduler="sync")))
            if array.npartitions == 1 and _persisted(array):
                # one computed chunk (fit's loss after its step's materialisation): fetch it, with
                # no graph to build and submit -- as a copy: an in-process cluster's gather hands
                # out the worker's own array, which snapshots share (dask arrays are immutable values)
                return np.array(self.client().gather(_futures_of(array)[0]), copy=True).reshape(array.shape)
            return np.asarray(_quiet(lambda: self.client().compute(array).result()))
        return np.asarray(array)

    def owns(self, array: Any) -> bool:
        return isinstance(array, da.Array)

    def apply_update(self, fn: Any, arrays: tuple, numbers: tuple, attrs: dict) -> tuple | None:
        """An optimizer's elementwise rule as ONE task per block (numpy's ops on the block's
        parameter, gradient and state), instead of a dask task per op: Adam's dozen ops per
        parameter were a dozen scheduler round trips, one after another, every step.  The same
        ufuncs on the same blocks: the same bits.  Arrays of different chunks, or results of
        another shape, take the op-by-op path (None)."""
        lead = arrays[0] if arrays else None
        if not (isinstance(lead, da.Array) and all(isinstance(a, da.Array) and a.shape == lead.shape
                                                   and a.chunks == lead.chunks for a in arrays)):
            return None
        # the results' number and dtypes, from the rule on empty blocks (a 0-d "empty" block is one
        # zero: the probe's own arithmetic, say 0/0, must not warn or raise where numpy's step does not)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = fn(*(np.zeros((0,) * a.ndim, dtype=a.dtype) for a in arrays), *numbers, **attrs)
        if not isinstance(probe, tuple) or any(not isinstance(p, (np.ndarray, np.generic)) or np.ndim(p) != lead.ndim
                                               for p in probe):
            return None
        blocks = [a.to_delayed(optimize_graph=False) for a in arrays]
        # result k of every block's rule is picked out by a task keyed as chunk ``(names[k], *index)``
        # of the k-th result array itself: no ``from_delayed`` alias per block and result, no
        # ``block``/``concatenate`` alias per chunk (round trips to the scheduler that compute nothing)
        names = [f"optimizer-result-{uuid.uuid4().hex}" for _ in probe]
        picks: list = [[] for _ in probe]
        for index in np.ndindex(*blocks[0].shape):
            results = dask.delayed(_rule_block, pure=False)(
                fn, numbers, attrs, *(b[index] for b in blocks), dask_key_name=f"optimizer-rule-{uuid.uuid4().hex}")
            for k in range(len(probe)):
                picks[k].append(dask.delayed(operator.getitem)(results, k, dask_key_name=(names[k], *index)))
        return tuple(da.Array(HighLevelGraph.from_collections(name, {}, dependencies=done), name, lead.chunks,
                              dtype=p.dtype) for name, done, p in zip(names, picks, probe))

    def submit(self, arrays: list) -> list:
        """Persist ``arrays`` on the workers in one graph and return at once (``fit`` builds the next
        epoch's step meanwhile).  Their names are kept until :meth:`materialize` waits for them:
        it reports their failure and replicates the small ones, as for arrays it persists itself."""
        lazy = _to_persist(arrays)
        if not lazy:
            return list(arrays)
        client = self.client()
        try:
            done = _quiet(lambda: _persist(client, [arrays[i] for i in lazy]))
        except Exception as exc:  # noqa: BLE001 - no cluster, a graph the scheduler refuses
            raise BackendError(f"backend 'dask': submitting {len(lazy)} arrays failed with "
                               f"{type(exc).__name__}: {exc}") from exc
        # the Client's table of keys some Future in this process still holds (a distributed without
        # it keeps every entry, as before)
        held = getattr(client, "futures", None)
        if held is not None:
            self._unconfirmed = {name: keys for name, keys in self._unconfirmed.items()
                                 if any(k in held for k in keys)}
        self._unconfirmed.update((a.name, [f.key for f in _futures_of(a)]) for a in done)
        return _replaced(arrays, lazy, done)

    def materialize(self, arrays: list) -> list:
        """Persist ``arrays`` on the workers in one graph (shared work computed once), wait for
        them, and replicate the small ones on a second worker (parameters and optimizer state
        survive a worker's loss).  Arrays :meth:`submit` persisted are waited for and replicated
        the same way.  A failure is a :class:`BackendError` naming what was lost."""
        from distributed import wait

        lazy = _to_persist(arrays)
        submitted = [a for a in arrays if isinstance(a, da.Array) and a.name in self._unconfirmed]
        if not lazy and not submitted:
            return list(arrays)
        client = self.client()
        try:
            done = _quiet(lambda: _persist(client, [arrays[i] for i in lazy])) if lazy else []
            waited = done + submitted
            futures = [f for a in waited for f in _futures_of(a)]
            wait(futures)
            failed = [f for f in futures if f.status == "error"]
            if failed:
                failed[0].result()  # raises the task's own error
            # parameters and optimizer state (one row block): a copy on a second worker; row-blocked
            # arrays stay on their blocks' workers only (lineage rebuilds a lost block)
            small = [f for a in waited if a.nbytes <= REPLICATE_MAX_BYTES and (a.ndim == 0 or len(a.chunks[0]) < 2)
                     for f in _futures_of(a)]
            if small and len(client.scheduler_info().get("workers", {})) > 1:
                client.replicate(small, n=2)
        except Exception as exc:  # noqa: BLE001 - worker loss, cancelled futures, task errors
            raise BackendError(f"backend 'dask': materialising {len(lazy) + len(submitted)} arrays failed with "
                               f"{type(exc).__name__}: {exc}; the last completed step's parameters "
                               "are intact: train again to resume") from exc
        finally:
            for a in submitted:
                self._unconfirmed.pop(a.name, None)
        return _replaced(arrays, lazy, done)


def _rule_block(fn: Any, numbers: tuple, attrs: dict, *blocks: np.ndarray) -> tuple:
    """An optimizer rule on one block of its arrays (see ``DaskBackend.apply_update``)."""
    return tuple(fn(*blocks, *numbers, **attrs))


def _to_persist(arrays: list) -> list[int]:
    """Positions of the dask arrays in ``arrays`` that still have work to do."""
    return [i for i, a in enumerate(arrays) if isinstance(a, da.Array) and not _persisted(a)]


def _replaced(arrays: list, positions: list[int], done: list) -> list:
    """``arrays`` with the persisted ``done`` at ``positions``."""
    out = list(arrays)
    for i, a in zip(positions, done):
        out[i] = a
    return out


def _persisted(x: da.Array) -> bool:
    """Whether every chunk of ``x`` is a future already (persisting it again would resubmit the
    same keys while the old futures are being released).  A persisted array's graph is one layer
    (its futures): an array of more layers is work still to do, known without walking its graph
    for futures (a step's dozen results each have the whole step's graph)."""
    if len(x.__dask_graph__().layers) > 1:
        return False
    held = {f.key for f in _futures_of(x)}
    return bool(held) and all(k in held for k in flatten(x.__dask_keys__()))


def _persist(client: Any, arrays: list) -> list:
    """``client.persist(arrays)`` with row block ``i`` of every row-blocked array in their graph
    computed on row block ``i``'s worker, where the pattern's block ``i`` lives
    (``cluster.row_placement``): features and activations stay beside the graph rows they meet,
    and no step moves them.  dask's own optimisation is off, since its low-level fusion renames
    tasks and drops their placement.  ``fifo_timeout=0``: each graph is a generation of its own, so
    the scheduler runs an earlier graph's tasks before a later one's (fit submits the next step
    while this one runs; within dask's default 60 s the two would share a generation, and the next
    step's first tasks would outrank this step's last ones by their order within each graph)."""
    with cluster.row_placement(arrays, chunks.partitions, client):
        return client.persist(arrays, optimize_graph=False, fifo_timeout=0)


def _futures_of(array: Any) -> list:
    from distributed import futures_of

    return futures_of(array)


class _Closing:
    """What ``DaskBackend.connect`` returns: the Client, closed (with its LocalCluster) by ``close()``."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def close(self) -> None:
        cluster.close(self.client)

    def __enter__(self) -> Any:
        return self.client

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["DaskBackend", "REPLICATE_MAX_BYTES", "EMBED_MAX_BYTES"]
