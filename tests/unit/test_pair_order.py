"""lexsort_pairs (one stable argsort of a combined key) against np.lexsort, which it replaces: the
same permutation for any integer pairs -- duplicates, negative values, every integer dtype, ranges
too wide for the combined key -- and EdgeGraph's structure is what it was with np.lexsort."""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.nn.graph_cache import EdgeGraph
from polygrad.sparse import pair_order
from polygrad.sparse.pair_order import lexsort_pairs

DTYPES = [np.int64, np.int32, np.int8, np.uint8, np.uint32, np.uint64]


@st.composite
def _pairs(draw: Any) -> tuple:
    n = draw(st.integers(0, 60))
    dtype_minor, dtype_major = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))

    def values(dtype: Any) -> np.ndarray:
        info = np.iinfo(dtype)
        small = st.integers(max(info.min, -5), min(info.max, 5))
        wide = st.integers(int(info.min), int(info.max))
        return np.asarray(draw(st.lists(st.one_of(small, wide) if draw(st.booleans()) else small,
                                        min_size=n, max_size=n)), dtype=dtype)
    return values(dtype_minor), values(dtype_major)


@settings(max_examples=300, deadline=None)
@given(pairs=_pairs())
def test_lexsort_pairs_is_np_lexsort(pairs: tuple) -> None:
    minor, major = pairs
    got, want = lexsort_pairs(minor, major), np.lexsort((minor, major))
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_the_combined_key_path_is_taken_for_node_indices(monkeypatch: Any) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("np.lexsort called")

    monkeypatch.setattr(pair_order.np, "lexsort", refuse)
    dst, src = np.array([2, 0, 2, 1, 0, 2]), np.array([1, 1, 0, 1, 1, 0])
    assert lexsort_pairs(src, dst).tolist() == [1, 4, 3, 2, 5, 0]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 8), edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=40))
def test_edge_graph_structure_matches_the_lexsort_order(n: int, edges: list) -> None:
    ei = np.array([[s % n for s, _ in edges], [d % n for _, d in edges]], dtype=np.int64).reshape(2, -1)
    g = EdgeGraph(ei[1], ei[0], n, n, ei.shape[1])
    order = np.lexsort((ei[0], ei[1]))
    assert g.order.tolist() == order.tolist()
    pairs = sorted(set(zip(ei[1].tolist(), ei[0].tolist())))
    assert list(zip(g.pattern.rows.tolist(), g.pattern.cols.tolist())) == pairs
