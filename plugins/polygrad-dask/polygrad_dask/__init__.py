"""polygrad-dask: a polygrad backend that runs on a Dask cluster.

Installing this package (``pip install ./plugins/polygrad-dask``) registers, through the entry
point ``dask`` in the group ``polygrad``, a **backend named "dask"**: dense tensors are
``dask.array`` arrays chunked by rows (nodes), sparse patterns are partitioned into matching row
blocks on the workers, and SpMM, its transpose, SDDMM and the segment reductions run block by
block there.  Use it with a ``distributed.Client``::

    from distributed import Client
    client = Client("tcp://scheduler:8786")     # or Client(LocalCluster(...)), or nothing: in-process
    with pg.use_backend("dask"):
        ...                                     # the same model code

Graphs that never fit on the client are read by the workers from edge shards
(:func:`write_edge_shards`, :func:`load_edge_shards`); each row block stays on one worker and a
product moves only its halo (the remote rows it touches).  :func:`locality_order` and
:func:`relabel` renumber a graph so fewer edges cross blocks (:func:`halo_stats` measures it).
:class:`DaskNeighborSampler` draws ``NeighborSampler``'s mini-batches on the workers holding the rows.
"""
from __future__ import annotations

import polygrad as pg

from . import chunks, cluster, locality, memcap
from .backend import DaskBackend
from .cluster import connect
from .locality import halo_stats, locality_order, relabel
from .partition import DistributedPattern, Partition
from .sampling import DaskNeighborSampler
from .shards import gcn_adjacency, load_edge_shards, node_order, write_edge_shards

__version__ = "0.1.0"


@pg.hookimpl
def polygrad_backends() -> list:
    return [DaskBackend()]


__all__ = ["DaskBackend", "DaskNeighborSampler", "DistributedPattern", "Partition", "chunks", "cluster", "connect",
           "gcn_adjacency", "halo_stats", "load_edge_shards", "locality", "locality_order", "memcap",
           "node_order", "polygrad_backends", "relabel", "write_edge_shards"]
