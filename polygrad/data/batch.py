"""Many small graphs as one: :class:`Graph`, :class:`Batch` / :func:`collate`, and a generated
graph-classification dataset (:func:`random_graph_families`).

A batch is the block-diagonal union of its graphs (PyG's ``Batch.from_data_list``): node features
stacked, each graph's ``edge_index`` shifted by the number of nodes before it, and a ``batch``
vector naming the graph of every node, which the global pools (``nn.global_mean_pool`` ...)
reduce by.  Plain numpy arrays, like the rest of :mod:`polygrad.data`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..ir.errors import DataError
from .data import Data
from .seeds import as_generator

__all__ = ["Graph", "Batch", "DataLoader", "collate", "iterate_batches", "random_graph_families"]


@dataclass
class Graph:
    """One graph: node features ``x`` ``[n, F]``, ``edge_index`` int64 ``[2, E]`` and an optional label ``y``."""

    x: np.ndarray
    edge_index: np.ndarray
    y: Any = None

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x)
        if self.x.ndim != 2:
            raise DataError(f"Graph: x must be [num_nodes, num_features], got shape {self.x.shape}")
        ei = np.asarray(self.edge_index)
        if ei.size == 0:
            ei = ei.reshape(2, 0).astype(np.int64)
        if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
            raise DataError(f"Graph: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
        if ei.size and (ei.min() < 0 or ei.max() >= self.x.shape[0]):
            raise DataError(f"Graph: edge_index refers to nodes outside [0, {self.x.shape[0]})")
        self.edge_index = ei.astype(np.int64, copy=False)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Batch:
    """Graphs merged into one block-diagonal graph.

    ``x`` ``[sum n, F]``, ``edge_index`` ``[2, sum E]`` (offset per graph), ``batch`` ``[sum n]``
    (graph id of each node), ``ptr`` ``[num_graphs + 1]`` (node offsets), ``y`` (stacked labels,
    or None when the graphs carry none).
    """

    x: np.ndarray
    edge_index: np.ndarray
    batch: np.ndarray
    ptr: np.ndarray
    y: Any = None

    @property
    def num_graphs(self) -> int:
        return int(self.ptr.shape[0] - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @classmethod
    def from_graphs(cls, graphs: Sequence[Graph]) -> "Batch":
        """Merge ``graphs`` (PyG's ``Batch.from_data_list``)."""
        graphs = list(graphs)
        if not graphs:
            raise DataError("Batch.from_graphs: needs at least one graph")
        graphs = [_as_graph(g, k) for k, g in enumerate(graphs)]
        width = graphs[0].x.shape[1]
        for k, g in enumerate(graphs):
            if g.x.shape[1] != width:
                raise DataError(f"Batch.from_graphs: graph {k} has {g.x.shape[1]} features, graph 0 has {width}")
        sizes = np.array([g.num_nodes for g in graphs], dtype=np.int64)
        ptr = np.zeros(len(graphs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=ptr[1:])
        edges = np.concatenate([g.edge_index + ptr[k] for k, g in enumerate(graphs)], axis=1)
        y = _collate_labels([g.y for g in graphs])
        return cls(x=np.concatenate([g.x for g in graphs], axis=0), edge_index=edges,
                   batch=np.repeat(np.arange(len(graphs), dtype=np.int64), sizes), ptr=ptr, y=y)


def _as_graph(g: Any, k: int) -> Graph:
    if isinstance(g, Graph):
        return g
    if isinstance(g, Data):
        if g.x is None or g.edge_index is None:
            raise DataError(f"Batch.from_graphs: Data item {k} needs x and edge_index")
        return Graph(x=g.x, edge_index=g.edge_index, y=g.y)
    raise DataError(f"Batch.from_graphs: item {k} is a {type(g).__name__}, not a Graph or Data")


def _collate_labels(labels: list[Any]) -> Any:
    """Graph labels stacked (one scalar per graph), or per-node / per-graph arrays concatenated
    along their first axis, as PyG's ``Batch`` does for ``y``; a mix is refused by name."""
    missing = [k for k, v in enumerate(labels) if v is None]
    if len(missing) == len(labels):
        return None
    if missing:
        raise DataError(f"Batch.from_graphs: graph {missing[0]} has no y while graph "
                        f"{next(k for k, v in enumerate(labels) if v is not None)} has one")
    arrays = [np.asarray(v) for v in labels]
    ndims = {a.ndim for a in arrays}
    if ndims == {0}:
        return np.stack(arrays)
    if 0 in ndims:
        k0 = next(k for k, a in enumerate(arrays) if a.ndim == 0)
        k1 = next(k for k, a in enumerate(arrays) if a.ndim > 0)
        raise DataError(f"Batch.from_graphs: graph {k0} has a scalar y but graph {k1} a y of shape "
                        f"{arrays[k1].shape}: use one kind of label for every graph")
    tail = arrays[0].shape[1:]
    for k, a in enumerate(arrays):
        if a.shape[1:] != tail:
            raise DataError(f"Batch.from_graphs: y of graph {k} has shape {a.shape}, graph 0's {arrays[0].shape}: "
                            f"only the first axis may differ")
    return np.concatenate(arrays, axis=0)


def collate(graphs: Sequence[Graph]) -> Batch:
    """``Batch.from_graphs(graphs)``: the collate function of a graph data loader."""
    return Batch.from_graphs(graphs)


def iterate_batches(graphs: Sequence[Graph], batch_size: int, shuffle: bool = False,
                    seed: Any = None) -> Iterator[Batch]:
    """One pass of batches of ``batch_size`` graphs (the last may be smaller), shuffled reproducibly
    by ``seed``.  An int seed gives the same order on every call; for a new order every epoch
    (PyG's loader with a seeded generator) pass one ``numpy.random.Generator`` made once
    (``rng = np.random.default_rng(0)``, then ``seed=rng`` each epoch: it advances), or use
    :class:`DataLoader`, which does that itself."""
    if batch_size < 1:
        raise DataError(f"iterate_batches: batch_size must be >= 1, got {batch_size}")
    order = np.arange(len(graphs))
    if shuffle:
        order = as_generator(seed, "iterate_batches: seed").permutation(order)
    for start in range(0, len(order), batch_size):
        yield collate([graphs[i] for i in order[start:start + batch_size]])


class DataLoader:
    """Batches of graphs, reshuffled on every pass (PyG's ``torch_geometric.loader.DataLoader``).

    ``shuffle=True`` draws a new order for each ``for batch in loader`` from one generator seeded
    by ``seed``: different every epoch, the same sequence of orders for the same seed (PyG with a
    seeded ``generator``).  :func:`iterate_batches` is one pass with a fixed order.
    """

    def __init__(self, graphs: Sequence[Any], batch_size: int = 1, shuffle: bool = False, seed: Any = None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise DataError(f"DataLoader: batch_size must be a positive integer, got {batch_size!r}")
        self.graphs = list(graphs)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.rng = as_generator(seed, "DataLoader: seed")

    def __len__(self) -> int:
        return -(-len(self.graphs) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        order = self.rng.permutation(len(self.graphs)) if self.shuffle else np.arange(len(self.graphs))
        for start in range(0, len(order), self.batch_size):
            yield collate([self.graphs[i] for i in order[start:start + self.batch_size]])


def _undirected(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    keep = src != dst
    a, b = np.minimum(src[keep], dst[keep]), np.maximum(src[keep], dst[keep])
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    return np.concatenate([pairs.T, pairs[:, ::-1].T], axis=1).astype(np.int64)


def _erdos_renyi(rng: np.random.Generator, n: int, degree: float) -> np.ndarray:
    iu, ju = np.triu_indices(n, 1)
    keep = rng.random(iu.shape[0]) < degree / (n - 1)
    return _undirected(iu[keep], ju[keep])


def _small_world(rng: np.random.Generator, n: int, degree: float, rewire: float) -> np.ndarray:
    """Watts-Strogatz: a ring where each node links its ``degree/2`` nearest neighbours per side,
    each edge rewired to a random target with probability ``rewire``."""
    half = max(1, int(round(degree / 2)))
    src = np.repeat(np.arange(n), half)
    dst = (src + np.tile(np.arange(1, half + 1), n)) % n
    moved = rng.random(src.shape[0]) < rewire
    dst = np.where(moved, rng.integers(0, n, size=src.shape[0]), dst)
    return _undirected(src, dst)


def random_graph_families(num_graphs: int = 400, min_nodes: int = 12, max_nodes: int = 30,
                          degree: float = 4.0, rewire: float = 0.1, seed: Any = 0) -> list[Graph]:
    """A balanced two-class graph-classification dataset: Erdős–Rényi graphs (label 0) against
    Watts–Strogatz small worlds (label 1) with the same mean degree.

    Node features are constant (``x = 1``, one column), so only structure tells the classes
    apart: the degree spread (Poisson against nearly regular) and the local clustering -- what a
    GIN with sum aggregation can see and a mean-only model cannot.  Chance is 50%.
    """
    rng = as_generator(seed, "random_graph_families: seed")
    graphs = []
    for k in range(int(num_graphs)):
        n = int(rng.integers(min_nodes, max_nodes + 1))
        label = k % 2
        ei = _erdos_renyi(rng, n, degree) if label == 0 else _small_world(rng, n, degree, rewire)
        graphs.append(Graph(x=np.ones((n, 1), dtype=np.float32), edge_index=ei, y=label))
    order = rng.permutation(len(graphs))
    return [graphs[i] for i in order]
