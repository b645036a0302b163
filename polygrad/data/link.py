"""Link prediction data: :func:`negative_sampling` (PyG's ``torch_geometric.utils.negative_sampling``)
and :class:`LinkNeighborLoader` (PyG's loader of sampled sub-graphs around seed edges).

Negative sampling draws node pairs that are not edges: never an edge of ``edge_index``, never a
self loop (unless bipartite), no pair twice.  PyG draws with Python's global ``random`` and gives
up after three rounds (returning fewer samples than asked on dense graphs); polygrad draws from a
seeded numpy generator (``seed=``: the same seed gives the same negatives) and returns exactly
``min(num_neg_samples, number of non-edges)`` samples, switching to enumerating the non-edges
when rejection would be slow.  Which pairs come out differs from PyG's (different generator);
the distribution (uniform over non-edges, without repetition) is the same.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from ..ir.errors import DataError
from .data import Data
from .edge_index import _check_edge_index
from .seeds import as_generator
from .sampler import NeighborSampler

__all__ = ["negative_sampling", "LinkNeighborLoader"]


def _edge_codes(ei: np.ndarray, size: tuple[int, int], bipartite: bool,
                force_undirected: bool) -> tuple[np.ndarray, int]:
    """Each edge as one integer in ``[0, population)`` (PyG's ``edge_index_to_vector``)."""
    row, col = ei[0], ei[1]
    if bipartite:
        return row * size[1] + col, size[0] * size[1]
    n = size[0]
    if force_undirected:  # strict upper triangle; an edge given in one direction excludes its pair
        keep = row != col     # (PyG keeps only row < col, so it may return the reverse of a one-way edge)
        row, col = np.minimum(row[keep], col[keep]), np.maximum(row[keep], col[keep])
        return row * n + col - (row + 1) * (row + 2) // 2, n * (n - 1) // 2
    keep = row != col  # no self loops: n - 1 slots per row
    row, col = row[keep], col[keep]
    return row * (n - 1) + col - (col > row), n * n - n


def _edges_of_codes(codes: np.ndarray, size: tuple[int, int], bipartite: bool,
                    force_undirected: bool) -> np.ndarray:
    if bipartite:
        return np.stack([codes // size[1], codes % size[1]])
    n = size[0]
    if force_undirected:
        # row r starts at code r*n - r(r+1)/2 (its slots are columns r+1 .. n-1)
        starts = np.arange(n, dtype=np.int64) * n - np.arange(n, dtype=np.int64) * np.arange(1, n + 1) // 2
        row = np.searchsorted(starts, codes, side="right") - 1
        col = codes - starts[row] + row + 1
        return np.stack([np.concatenate([row, col]), np.concatenate([col, row])])
    row = codes // (n - 1)
    col = codes % (n - 1)
    col = col + (col >= row)
    return np.stack([row, col])


def negative_sampling(edge_index: Any, num_nodes: "int | tuple[int, int] | None" = None,
                      num_neg_samples: "int | float | None" = None, method: str = "sparse",
                      force_undirected: bool = False, *, seed: Any = None) -> np.ndarray:
    """Node pairs that are not edges of ``edge_index``, as ``[2, num_neg_samples]``.

    ``num_nodes``: an int, or ``(num_src, num_dst)`` for a bipartite graph (then self loops are
    allowed and ``force_undirected`` is ignored, as PyG).  ``num_neg_samples``: a count, a float
    ratio of ``E``, or None for ``E``.  ``force_undirected``: ``num_neg_samples // 2`` pairs, each
    returned in both directions.  ``method`` ("sparse" / "dense") is accepted for PyG's signature;
    both give the same samples.  ``seed``: None, an int or a numpy Generator.
    """
    if method not in ("sparse", "dense"):
        raise DataError(f"negative_sampling: method must be 'sparse' or 'dense', got {method!r}")
    bipartite = isinstance(num_nodes, (tuple, list))
    if isinstance(num_nodes, (tuple, list)):
        size = (int(num_nodes[0]), int(num_nodes[1]))
        ei, _ = _check_edge_index(edge_index, None, "negative_sampling")
        if ei.size and (ei[0].max() >= size[0] or ei[1].max() >= size[1]):
            raise DataError(f"negative_sampling: edge_index does not fit a bipartite graph of size {size}")
        force_undirected = False
    else:
        ei, n = _check_edge_index(edge_index, num_nodes, "negative_sampling")
        size = (n, n)
    rng = as_generator(seed, "negative_sampling: seed")
    if num_neg_samples is None:
        wanted = ei.shape[1]
    elif isinstance(num_neg_samples, float):
        wanted = int(num_neg_samples * ei.shape[1])
    else:
        wanted = int(num_neg_samples)
    if wanted < 0:
        raise DataError(f"negative_sampling: num_neg_samples must be >= 0, got {num_neg_samples!r}")
    if force_undirected:
        wanted //= 2
    codes, population = _edge_codes(ei, size, bipartite, force_undirected)
    taken = np.unique(codes)
    wanted = min(wanted, population - taken.shape[0])
    if wanted <= 0:
        return np.empty((2, 0), dtype=np.int64)
    chosen = _draw(rng, population, taken, wanted)
    return _edges_of_codes(chosen, size, bipartite, force_undirected).astype(np.int64)


def _draw(rng: np.random.Generator, population: int, taken: np.ndarray, wanted: int) -> np.ndarray:
    """``wanted`` distinct codes in ``[0, population)`` outside sorted ``taken``, uniformly."""
    free = population - taken.shape[0]
    if free <= 4 * wanted or population <= 1 << 16:  # dense enough: enumerate the free codes
        pool = np.setdiff1d(np.arange(population, dtype=np.int64), taken, assume_unique=True)
        return rng.choice(pool, size=wanted, replace=False)
    chosen = np.empty(0, dtype=np.int64)
    while chosen.shape[0] < wanted:  # rejection: each round keeps >= 3/4 of its draws on average
        draw = rng.integers(0, population, size=int(1.3 * (wanted - chosen.shape[0])) + 8)
        pos = np.searchsorted(taken, draw)
        hit = (pos < taken.shape[0]) & (taken[np.minimum(pos, taken.shape[0] - 1)] == draw)
        draw = draw[~hit]
        both = np.concatenate([chosen, draw])
        _, first = np.unique(both, return_index=True)  # keep the first copy, in drawing order
        chosen = both[np.sort(first)]
    return chosen[:wanted]


class LinkNeighborLoader:
    """Mini-batches of seed edges with their sampled neighbourhoods (PyG's ``LinkNeighborLoader``).

    Each batch is a :class:`Data` holding the sub-graph sampled around the endpoints of
    ``batch_size`` seed edges (``fanouts`` per hop, as :class:`NeighborSampler`): ``n_id``
    (global ids), ``edge_index`` (local), ``x`` / ``y`` rows when ``data`` has them,
    ``edge_label_index`` (the seed edges in local ids) and ``edge_label``.  With
    ``neg_sampling_ratio > 0`` each batch adds that many negatives per positive (true non-edges
    of ``data.edge_index``, from :func:`negative_sampling`) labelled 0, as PyG's binary negative
    sampling; then ``edge_label`` must be absent or all 1.
    """

    def __init__(self, data: Data, num_neighbors: Sequence[int], edge_label_index: Any = None,
                 edge_label: Any = None, batch_size: int = 1, shuffle: bool = False,
                 neg_sampling_ratio: float = 0.0, seed: Any = 0) -> None:
        if not isinstance(data, Data) or data.edge_index is None:
            raise DataError("LinkNeighborLoader: data must be a polygrad.data.Data with an edge_index")
        self.data = data
        n = data.num_nodes or 0
        label_index = data.edge_index if edge_label_index is None else edge_label_index
        self.edge_label_index, _ = _check_edge_index(label_index, n, "LinkNeighborLoader: edge_label_index")
        num = self.edge_label_index.shape[1]
        label = np.ones(num, dtype=np.float32) if edge_label is None else np.asarray(edge_label)
        if label.shape[:1] != (num,):
            raise DataError(f"LinkNeighborLoader: edge_label of shape {label.shape} needs one entry per "
                            f"seed edge ({num})")
        if neg_sampling_ratio < 0:
            raise DataError(f"LinkNeighborLoader: neg_sampling_ratio must be >= 0, got {neg_sampling_ratio}")
        if neg_sampling_ratio > 0 and edge_label is not None and not np.all(label == 1):
            raise DataError("LinkNeighborLoader: with negative sampling the positive labels must be 1 "
                            "(negatives are labelled 0)")
        self.edge_label = label
        self.neg_sampling_ratio = float(neg_sampling_ratio)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise DataError(f"LinkNeighborLoader: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.rng = as_generator(seed, "LinkNeighborLoader: seed")
        self.sampler = NeighborSampler(data.edge_index, n, num_neighbors, batch_size=1, shuffle=False,
                                       x=data.x, y=data.y, seed=self.rng)

    def __len__(self) -> int:
        return -(-self.edge_label_index.shape[1] // self.batch_size)

    def __iter__(self) -> Iterator[Data]:
        num = self.edge_label_index.shape[1]
        order = self.rng.permutation(num) if self.shuffle else np.arange(num)
        for start in range(0, num, self.batch_size):
            yield self._batch(order[start:start + self.batch_size])

    def _batch(self, which: np.ndarray) -> Data:
        pairs = self.edge_label_index[:, which]
        label = self.edge_label[which]
        if self.neg_sampling_ratio > 0:
            neg = negative_sampling(self.data.edge_index, self.data.num_nodes,
                                    int(round(self.neg_sampling_ratio * which.shape[0])), seed=self.rng)
            pairs = np.concatenate([pairs, neg], axis=1)
            label = np.concatenate([label, np.zeros(neg.shape[1], dtype=label.dtype)])
        seeds = np.unique(pairs)
        sub = self.sampler.sample(seeds)
        out = sub.to_data()
        out.edge_label_index = np.searchsorted(seeds, pairs)  # seeds are the first local ids, in order
        out.edge_label = label
        out.input_id = which
        return out
