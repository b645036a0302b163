"""Synthetic graphs (numpy only, vectorised, seeded with ``numpy.random.default_rng``).

:func:`stochastic_block_model`
    A small labelled graph with the same interface as the Planetoid datasets: the embedded
    default for the GCN demo and for tests, needing no download.  Classes are communities
    (dense inside, sparse between) and each node carries a noisy bag-of-words feature vector
    drawn from its class's topic, so a model that uses the edges (a GCN) beats one that sees
    only the features.
:func:`random_graph`
    A uniform random graph (Erdős–Rényi ``G(n, m)``: exactly ``m`` distinct edges, no self
    loops) as an ``edge_index``, for benchmarks up to millions of nodes and tens of millions
    of edges.

Both sample edges without any Python loop over node pairs: pairs are numbered, a set of
distinct pair numbers is drawn, and the numbers are decoded back to (row, col) arrays.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad.ir.errors import DataError

from .csr import CSRMatrix, unique_sorted
from .graph_dataset import GraphDataset
from .seeds import as_generator
from .edge_index import index_to_mask

__all__ = ["stochastic_block_model", "random_graph"]


# ----------------------------------------------------------------------------------------------
# pair-number sampling and decoding
# ----------------------------------------------------------------------------------------------


def _check_int(value: Any, name: str, lo: int, where: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DataError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise DataError(f"{where}: {name} must be >= {lo}, got {value}")
    return int(value)


def _check_prob(value: Any, name: str, where: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DataError(f"{where}: {name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not (0.0 <= v <= 1.0):
        raise DataError(f"{where}: {name} must lie in [0, 1], got {value}")
    return v


def _sample_distinct(rng: np.random.Generator, population: int, k: int) -> np.ndarray:
    """``k`` distinct integers drawn uniformly from ``[0, population)``, sorted (int64).

    Dense requests use ``Generator.choice(replace=False)``; sparse ones draw with replacement
    in vectorised rounds, deduplicate, and keep a uniformly random subset, which is again a
    uniform ``k``-subset (memory O(k), no O(population) array).
    """
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k > population:
        raise DataError(f"cannot draw {k} distinct values from {population}")
    if population <= 4 * k or population <= 1 << 20:
        return np.sort(rng.choice(population, size=k, replace=False).astype(np.int64))
    have = np.zeros(0, dtype=np.int64)
    need = k
    while True:
        # expected duplicates are few because k <= population / 4; oversample a little
        draw = rng.integers(0, population, size=int(need * 1.1) + 16, dtype=np.int64)
        have = unique_sorted(np.concatenate([have, draw]))
        if have.size >= k:
            break
        need = k - have.size
    if have.size > k:
        # drop a uniformly random subset of the surplus; what stays is still a uniform k-subset
        drop = rng.choice(have.size, size=have.size - k, replace=False)
        keep = np.ones(have.size, dtype=bool)
        keep[drop] = False
        have = have[keep]
    return have


def _decode_lower_triangle(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map ``code`` in ``[0, n(n-1)/2)`` to the pair ``(i, j)``, ``i > j``, in row-major order
    of the strict lower triangle: ``code = i (i - 1) / 2 + j``."""
    i = np.floor((1.0 + np.sqrt(1.0 + 8.0 * codes.astype(np.float64))) / 2.0).astype(np.int64)
    # repair float rounding (at most one step either way for codes < 2**52)
    i -= (i * (i - 1) // 2 > codes)
    i += ((i + 1) * i // 2 <= codes)
    j = codes - i * (i - 1) // 2
    return i, j


# ----------------------------------------------------------------------------------------------
# random graph
# ----------------------------------------------------------------------------------------------


def random_graph(num_nodes: int, num_edges: int, seed: Any = 0, directed: bool = False) -> np.ndarray:
    """A uniform random simple graph with exactly ``num_edges`` ``edge_index`` columns.

    Parameters
    ----------
    num_nodes:
        Number of nodes ``n`` (>= 1).
    num_edges:
        Number of columns ``E`` of the result.  For ``directed=False`` every undirected edge
        is stored in both directions, so ``E`` must be even and the graph has ``E / 2``
        undirected edges (the convention of PyG's Cora, whose 10,556 edges are 5,278 pairs).
    seed:
        ``None``, a non-negative int or a ``numpy.random.Generator``.
    directed:
        Draw ``E`` distinct ordered pairs instead of ``E / 2`` unordered ones.

    Returns
    -------
    numpy.ndarray
        int64 ``[2, E]``, sorted by (source, target); no duplicate columns, no self loops.
        Uniform over all such graphs (``G(n, m)``).  1,000,000 nodes and 10,000,000 edges take
        a few seconds and a few hundred MB.
    """
    where = "random_graph"
    n = _check_int(num_nodes, "num_nodes", 1, where)
    m = _check_int(num_edges, "num_edges", 0, where)
    if not isinstance(directed, (bool, np.bool_)):
        raise DataError(f"{where}: directed must be a bool, got {type(directed).__name__}")
    rng = as_generator(seed, f"{where}: seed")
    if directed:
        population = n * (n - 1)
        if m > population:
            raise DataError(f"{where}: {m} directed edges do not fit in {n} nodes "
                            f"(at most n(n-1) = {population} without self loops)")
        codes = _sample_distinct(rng, population, m)
        src = codes // max(n - 1, 1)
        dst = codes % max(n - 1, 1)
        dst += dst >= src  # skip the diagonal
        # codes are sorted and the encoding is monotone in (src, dst): already sorted
        return np.stack([src, dst])
    if m % 2:
        raise DataError(f"{where}: an undirected graph stores each edge in both directions, so "
                        f"num_edges must be even, got {m} (use directed=True for odd counts)")
    population = n * (n - 1) // 2
    if m // 2 > population:
        raise DataError(f"{where}: {m // 2} undirected edges do not fit in {n} nodes "
                        f"(at most n(n-1)/2 = {population})")
    codes = _sample_distinct(rng, population, m // 2)
    i, j = _decode_lower_triangle(codes)
    del codes
    key = np.concatenate([i * n + j, j * n + i])  # both directions; all distinct (i > j)
    del i, j
    key.sort()
    out = np.empty((2, key.shape[0]), dtype=np.int64)
    np.floor_divide(key, n, out=out[0])
    np.remainder(key, n, out=out[1])
    return out


# ----------------------------------------------------------------------------------------------
# stochastic block model
# ----------------------------------------------------------------------------------------------


def _split_counts(num_nodes: int, num_train: int, num_val: int | None,
                  num_test: int | None, where: str) -> tuple[int, int]:
    rest = num_nodes - num_train
    if num_val is None and num_test is None:
        if rest >= _NUM_VAL + _NUM_TEST:
            return _NUM_VAL, _NUM_TEST  # the Planetoid sizes
        num_val = rest // 3  # scaled down: one third val, the rest test
        return num_val, rest - num_val
    if num_val is None:
        assert num_test is not None  # both None returned above
        num_val = min(_NUM_VAL, max(rest - num_test, 0))
    if num_test is None:
        num_test = min(_NUM_TEST, max(rest - num_val, 0))
    num_val = _check_int(num_val, "num_val", 0, where)
    num_test = _check_int(num_test, "num_test", 0, where)
    if num_val + num_test > rest:
        raise DataError(f"{where}: {num_train} train + {num_val} val + {num_test} test nodes "
                        f"exceed num_nodes={num_nodes}")
    return num_val, num_test


_NUM_VAL = 500
_NUM_TEST = 1000


def stochastic_block_model(num_nodes: int = 600, num_classes: int = 4, p_in: float = 0.05,
                           p_out: float = 0.005, num_features: int = 64,
                           feature_signal: float = 0.08, seed: Any = 0, *,
                           words_per_node: float = 5.0, num_train_per_class: int = 20,
                           num_val: int | None = None,
                           num_test: int | None = None) -> GraphDataset:
    """A planted-partition graph with bag-of-words features, in the Planetoid format.

    Nodes are split as evenly as possible into ``num_classes`` communities (labels assigned
    to node ids in random order).  Each pair of distinct nodes is linked independently with
    probability ``p_in`` (same class) or ``p_out`` (different classes); per block the edge
    count is drawn from the binomial distribution and the edges are then placed uniformly.

    Features imitate Cora's binary bag of words: the ``num_features`` words are dealt into
    ``num_classes`` topics (``num_features // num_classes`` words each, leftovers belong to no
    topic).  Each node writes ``1 + Poisson(words_per_node - 1)`` words; each word comes from
    the node's class topic with probability ``feature_signal`` and uniformly from the whole
    vocabulary otherwise; ``x[i, w] = 1`` if node ``i`` wrote word ``w``.

    With the defaults (600 nodes, 4 classes, expected degree ~9.7, ~77% of edges inside a
    class, ~5 words per node, signal 0.08; split 80/173/347) a 2-layer GCN (16 hidden units,
    dropout 0.5, Adam lr 0.01, weight decay 5e-4, 200 steps, row-normalised features) reached
    about 85-90% test accuracy over dataset seeds 0-4 (mean 88%) in a numpy reference, while a logistic
    regression on the features alone stayed near chance (~27% for 4 classes): the graph
    structure is what makes the task solvable.  Raise ``feature_signal`` (0.25 gives ~40% from
    features alone, ~96% GCN) for an easier task.

    Parameters
    ----------
    num_nodes:
        Number of nodes.
    num_classes:
        Number of classes/communities (>= 2).
    p_in, p_out:
        Edge probabilities inside a class and between classes, in ``[0, 1]``.
    num_features:
        Vocabulary size (>= ``num_classes``, so every topic has a word).
    feature_signal:
        Probability in ``[0, 1]`` that a word is drawn from the node's class topic
        (0: features carry no label information; 1: only topic words).
    seed:
        ``None``, a non-negative int or a ``numpy.random.Generator``.  Same seed, same dataset.
    words_per_node:
        Mean number of words a node writes (>= 1); duplicates collapse, as in a binary
        bag of words.
    num_train_per_class:
        Training nodes per class (the Planetoid split uses 20).
    num_val, num_test:
        Validation / test sizes.  Default: 500 and 1000 (Planetoid) when the graph is large
        enough, otherwise the non-training nodes split one third validation, two thirds test.

    Returns
    -------
    GraphDataset
        ``name="sbm"``, ``x`` a float32 :class:`CSRMatrix` of 0/1 entries, ``y`` int64,
        ``edge_index`` int64 ``[2, E]`` undirected (both directions stored), sorted, without
        duplicates or self loops; disjoint ``train_mask``/``val_mask``/``test_mask``.
    """
    where = "stochastic_block_model"
    n = _check_int(num_nodes, "num_nodes", 2, where)
    C = _check_int(num_classes, "num_classes", 2, where)
    F = _check_int(num_features, "num_features", 1, where)
    if F < C:
        raise DataError(f"{where}: num_features={F} must be >= num_classes={C} (one topic word "
                        f"per class at least)")
    p_in = _check_prob(p_in, "p_in", where)
    p_out = _check_prob(p_out, "p_out", where)
    signal = _check_prob(feature_signal, "feature_signal", where)
    if isinstance(words_per_node, (bool, np.bool_)) or not isinstance(
            words_per_node, (int, float, np.integer, np.floating)) or not (
            math.isfinite(float(words_per_node)) and words_per_node >= 1):
        raise DataError(f"{where}: words_per_node must be a finite number >= 1, got {words_per_node!r}")
    k_train = _check_int(num_train_per_class, "num_train_per_class", 0, where)
    base, extra = divmod(n, C)
    if base <= k_train:
        raise DataError(f"{where}: {n} nodes in {C} classes leave {base} per class, not more than "
                        f"num_train_per_class={k_train}")
    n_val, n_test = _split_counts(n, k_train * C, num_val, num_test, where)
    rng = as_generator(seed, f"{where}: seed")

    # labels: balanced class sizes, shuffled over node ids
    sizes = np.full(C, base, dtype=np.int64)
    sizes[:extra] += 1
    y = rng.permutation(np.repeat(np.arange(C, dtype=np.int64), sizes))
    members = [np.flatnonzero(y == c) for c in range(C)]

    # edges, block by block
    rows, cols = [], []
    for a in range(C):
        na = members[a].shape[0]
        pairs = na * (na - 1) // 2
        k = int(rng.binomial(pairs, p_in)) if pairs else 0
        i, j = _decode_lower_triangle(_sample_distinct(rng, pairs, k))
        rows.append(members[a][i])
        cols.append(members[a][j])
        for b in range(a + 1, C):
            nb = members[b].shape[0]
            pairs = na * nb
            k = int(rng.binomial(pairs, p_out)) if pairs else 0
            codes = _sample_distinct(rng, pairs, k)
            rows.append(members[a][codes // nb])
            cols.append(members[b][codes % nb])
    r = np.concatenate(rows)
    c = np.concatenate(cols)
    key = unique_sorted(np.concatenate([r * n + c, c * n + r]))
    edge_index = np.stack([key // n, key % n])

    # features: noisy bag of words
    words = rng.permutation(F)
    per_topic = F // C
    topics = words[: per_topic * C].reshape(C, per_topic)
    lengths = 1 + rng.poisson(float(words_per_node) - 1.0, size=n)
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    total = owner.shape[0]
    from_topic = rng.random(total) < signal
    topic_word = topics[y[owner], rng.integers(0, per_topic, size=total)]
    any_word = rng.integers(0, F, size=total)
    word = np.where(from_topic, topic_word, any_word).astype(np.int64)
    x = CSRMatrix.from_coo(owner, word, np.ones(total, dtype=np.float32), (n, F))
    x = CSRMatrix(x.indptr, x.indices, np.ones(x.nnz, dtype=np.float32), x.shape)  # binary

    # split: k_train per class, then val and test from the shuffled remainder
    train_idx = np.concatenate([rng.permutation(m)[:k_train] for m in members])
    rest = np.setdiff1d(np.arange(n), train_idx)
    rest = rng.permutation(rest)
    val_idx = rest[:n_val]
    test_idx = rest[n_val:n_val + n_test]
    return GraphDataset(name="sbm", x=x, y=y, edge_index=edge_index,
                        train_mask=index_to_mask(train_idx, n),
                        val_mask=index_to_mask(val_idx, n),
                        test_mask=index_to_mask(test_idx, n),
                        num_classes=C)
