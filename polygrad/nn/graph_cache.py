"""The graph structure a layer derives from its ``graph`` argument, cached by the graph's *content*.

Every graph layer (``MessagePassing`` and all layers on it, ``GCNConv``) turns its ``graph``
argument into index arrays once and reuses them while the same graph comes back, which is
what makes an epoch cheap.  The cache is keyed by what the graph *contains*, never by which
object it is, and checked on every call, so editing the same array in place
(``ei[0, :10] = 9``) or passing another graph rebuilds, instead of silently reusing the stale
structure.  The key holds, per array (an ``edge_index``, a sparse adjacency's values):

* below :data:`DIGEST_FROM_BYTES`, a read-only copy, compared with ``np.array_equal`` -- 7-12 us
  on Cora's 10,556 edges, against 0.7 ms and more for the cheapest layer's forward and backward
  there (GINConv, F=64; measured on a loaded 2-core machine);
* from that size on, an :class:`~polygrad.runtime.digest.ArrayDigest` (SHA-256 of the content,
  32 bytes) instead of the copy: a 10M-edge ``edge_index``'s copy was 153 MiB of a GCN's 2.4 GB
  peak; the digest is recomputed on every call, in parallel, at ~1 GB/s per thread.

The layers of one forward pass share what they build: a layer that misses its own cache looks
in the memo of the outermost module call (:func:`polygrad.nn.module.forward_memo`), with the
same content check, before building -- a batched GIN builds each batch's structure once, not
once per layer (~90 us each for 32 small graphs).

An ``edge_index`` is a multigraph, as in PyG: a repeated edge is a second edge (it sends a
second message, counts twice in a mean, and its weight adds to the first).  :class:`EdgeGraph`
therefore keeps both views:

* the edges themselves, in the order they were given (``src`` / ``dst``): per-edge data
  (``edge_weight``, ``edge_attr``, a user's ``norm``) is in this order, and the general message
  path gathers, computes and scatters in it, exactly as PyG does;
* the de-duplicated, destination-major :class:`~polygrad.sparse.pattern.Pattern` with each edge's
  ``slot`` in it, for the SpMM fast path: the weight of an entry is the sum over its copies.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.engine.dispatch import note_host_read
from polygrad.ir.errors import ShapeError
from polygrad.runtime.digest import ArrayDigest
from polygrad.sparse.pattern import Pattern, indptr_from_rows
from polygrad.sparse import is_sparse
from polygrad.sparse.graph import edge_index_array
from polygrad.sparse.pair_order import lexsort_pairs
from polygrad.tensor import Tensor

from .module import forward_memo

__all__ = ["EdgeGraph", "GraphCache", "fingerprint", "content_key", "owned", "same_fingerprint",
           "self_loop_edge_index", "FLOWS", "DIGEST_FROM_BYTES"]

FLOWS = ("source_to_target", "target_to_source")

#: structures one forward pass shares between its layers (the most recent; a forward over more
#: distinct graphs, a heterogeneous model's edge types, rebuilds the oldest when it meets it again)
SHARED_PER_FORWARD = 8
#: arrays of at least this many bytes are kept in a key as a digest, smaller ones as a copy: at
#: 16 MiB a copy is noise in the memory of a model on that graph, and a digest costs ~2x the
#: comparison of a copy (SHA-256 ~1 GB/s per thread vs ~2 GB/s, measured here)
DIGEST_FROM_BYTES = 1 << 24


# -- content keys -----------------------------------------------------------------------------------

def fingerprint(graph: Any) -> tuple:
    """What structure is derived from, as host views (no copy; :func:`owned` copies when caching).

    A Pattern is immutable (its arrays are read-only), so it is its own key.
    """
    if isinstance(graph, Pattern):
        return ("pattern", graph)
    if is_sparse(graph):
        p = graph.pattern
        values = graph.values
        note_host_read(values)  # a compiled step guards what its cached structure came from
        return ("sparse", tuple(graph.shape), p, np.asarray(values._be.to_numpy(values._data)))
    if isinstance(graph, Tensor):
        note_host_read(graph)
        return ("edge_index", np.asarray(graph._be.to_numpy(graph._data)))
    return ("edge_index", np.asarray(graph))


def content_key(key: tuple) -> tuple:
    """``key`` with every array of :data:`DIGEST_FROM_BYTES` or more replaced by its
    :class:`ArrayDigest` (computed once here, so that comparing the result with several stored
    keys hashes nothing again); smaller arrays stay as they are (views)."""
    def probe(x: Any) -> Any:
        if isinstance(x, np.ndarray) and x.nbytes >= DIGEST_FROM_BYTES and not x.dtype.hasobject:
            return ArrayDigest.of(x)
        return x
    return tuple(probe(x) for x in key)


def owned(key: tuple) -> tuple:
    """A key the user's later in-place edits cannot reach: small arrays as read-only copies,
    large ones as digests of their content (:func:`content_key`)."""
    def keep(x: Any) -> Any:
        if not isinstance(x, np.ndarray):
            return x
        x = np.array(x)
        x.flags.writeable = False
        return x
    return tuple(keep(x) for x in content_key(key))


def same_fingerprint(a: tuple, b: tuple) -> bool:
    """Equal content: arrays compared elementwise, dtype included (an array against a digest by
    digesting it); digests by value; patterns by identity."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, ArrayDigest) and isinstance(y, np.ndarray):
            y = ArrayDigest.of(y) if y.nbytes >= DIGEST_FROM_BYTES else None
        elif isinstance(y, ArrayDigest) and isinstance(x, np.ndarray):
            x = ArrayDigest.of(x) if x.nbytes >= DIGEST_FROM_BYTES else None
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            nan_ok = x.dtype.kind == "f" and y.dtype.kind == "f"
            if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=nan_ok):
                return False
        elif isinstance(x, Pattern) or isinstance(y, Pattern):
            if x is not y:
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray) or x != y:
            return False
    return True


# -- the structure ----------------------------------------------------------------------------------

def _readonly(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


def _may_alias_caller(ei: np.ndarray, graph: Any) -> bool:
    """Whether ``ei`` (``edge_index_array(graph)``) may be memory the caller can still write: their
    array, or a dense tensor's storage.  A tensor's storage is compared directly, never through
    ``Tensor.__array__``, which would mark it shared and note a host read inside a capture; a
    storage that is not a numpy array is assumed to alias (a copy, never a stale graph)."""
    if isinstance(graph, Pattern) or is_sparse(graph):
        return False
    if isinstance(graph, Tensor):
        held = graph._data
        return not isinstance(held, np.ndarray) or np.may_share_memory(ei, held)
    return bool(np.may_share_memory(ei, graph))


class EdgeGraph:
    """One graph as the layers use it (host arrays, read-only, never mutated).

    ``dst`` / ``src`` [E]: each edge's destination (the ``_i`` side, whose rows receive) and
    source (the ``_j`` side), in edge order -- the given order, or, when the layer adds self
    loops, the kept non-loop edges (``kept``, positions in the given edges) followed by one loop
    per node (of the first ``min(num_dst, num_src)``).  ``pattern``: the de-duplicated
    ``num_dst x num_src`` destination-major pattern; ``slot[e]`` is edge ``e``'s entry in it;
    ``duplicates`` says whether any entry has several.
    """

    def __init__(self, dst: np.ndarray, src: np.ndarray, num_dst: int, num_src: int,
                 given_edges: int, kept: np.ndarray | None = None):
        self.num_dst, self.num_src = int(num_dst), int(num_src)
        self.given_edges = int(given_edges)
        self.kept = kept
        self.dst, self.src = np.ascontiguousarray(dst, dtype=np.int64), np.ascontiguousarray(src, dtype=np.int64)
        e = self.dst.shape[0]
        self.num_edges = e
        # a stable sort by (destination, source): copies of one edge end up adjacent, in edge order
        order = lexsort_pairs(self.src, self.dst) if e else np.zeros(0, dtype=np.int64)
        rows, cols = self.dst[order], self.src[order]
        first = np.ones(e, dtype=bool)
        if e > 1:
            first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        slot = np.empty(e, dtype=np.int64)
        slot[order] = np.cumsum(first) - 1
        urows, ucols = rows[first], cols[first]
        self.order = order                 # edge positions sorted by (dst, src)
        self.slot = slot
        self.duplicates = not bool(first.all())
        self.pattern = Pattern((self.num_dst, self.num_src), indptr_from_rows(urows, self.num_dst),
                               np.ascontiguousarray(ucols), "csr", rows=np.ascontiguousarray(urows))
        #: the first edge of each pattern entry (its only one without duplicates)
        self.entry_edge = order[first]
        #: per entry, how many edges it stands for (float: a weight)
        self.multiplicity = np.bincount(slot, minlength=self.pattern.nnz).astype(np.float64)
        #: per destination, its incoming edges counted with multiplicity (PyG's mean divides by it)
        self.in_degree = np.bincount(self.dst, minlength=self.num_dst).astype(np.float64)
        _readonly(self.dst, self.src, order, slot, self.entry_edge, self.multiplicity, self.in_degree)
        self._derived: dict[Any, Any] = {}

    @classmethod
    def of_pattern(cls, pattern: Pattern) -> "EdgeGraph":
        """The edges of an adjacency pattern (rows = destinations), in the pattern's order."""
        return cls(pattern.rows, pattern.cols, pattern.shape[0], pattern.shape[1], pattern.nnz)

    def derived(self, key: Any, make: Any) -> Any:
        """``make(self)`` once per ``key`` (index arrays a layer derives from the structure)."""
        value = self._derived.get(key)
        if value is None:
            value = self._derived[key] = make(self)
        return value

    def copies_pattern(self) -> Pattern:
        """``num_dst x E``: row i holds i's incoming edges (in :attr:`order`), one column each --
        the segments a per-edge softmax or reduction runs over, copies included."""
        def make(g: "EdgeGraph") -> Pattern:
            cols = np.arange(g.num_edges, dtype=np.int64)
            return Pattern((g.num_dst, g.num_edges), indptr_from_rows(g.dst[g.order], g.num_dst), cols,
                           "csr", rows=np.ascontiguousarray(g.dst[g.order]))
        return self.derived("copies", make)

    def edge_index(self) -> np.ndarray:
        """``[2, E]`` (row 0 sources, row 1 destinations) of the edges in edge order."""
        return self.derived("edge_index", lambda g: np.stack([g.src, g.dst]))


def self_loop_edge_index(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """``edge_index`` without its self loops, plus one self loop per node (PyG's
    ``remove_self_loops`` then ``add_self_loops``, what ``GATConv`` does)."""
    keep = edge_index[0] != edge_index[1]
    loops = np.arange(num_nodes, dtype=np.int64)
    return np.concatenate([edge_index[:, keep], np.stack([loops, loops])], axis=1)


# -- the cache --------------------------------------------------------------------------------------

class GraphCache:
    """The :class:`EdgeGraph` of the last graph a layer saw, reused while its content is equal."""

    def __init__(self, self_loops: bool = False) -> None:
        self.self_loops = bool(self_loops)  # the default of get(..., self_loops=)
        self._key: Any = None
        self._value: EdgeGraph | None = None

    def clear(self) -> None:
        self._key, self._value = None, None

    def get(self, graph: Any, sizes: "int | tuple[int | None, int | None]", *, flow: str = "source_to_target",
            self_loops: bool | None = None, op: str = "message passing") -> EdgeGraph:
        """The structure of ``graph`` (an ``edge_index``, a sparse adjacency whose rows are
        destinations, or a Pattern) for ``sizes`` = node counts of (``edge_index`` row 0, row 1)
        (an int N: (N, N))."""
        if isinstance(sizes, (int, np.integer)):
            sizes = (int(sizes), int(sizes))
        if self_loops is None:
            self_loops = self.self_loops
        if flow not in FLOWS:
            raise ValueError(f"{op}: flow must be one of {FLOWS}, got {flow!r}")
        views = fingerprint(graph)
        key = content_key(views)  # large arrays digested once, for every comparison below
        params = (sizes, flow, bool(self_loops))
        if self._value is not None and self._key[1] == params and same_fingerprint(self._key[0], key):
            return self._value
        # the other layers of this forward pass may have built it already (GIN's three convs
        # over one batch): the same content check, against what they built
        shared = forward_memo()
        built: list | None = None
        if shared is not None:
            built = shared.setdefault(GraphCache, [])
            for (their_key, their_params), value in built:
                if their_params == params and same_fingerprint(their_key, key):
                    self._key, self._value = (their_key, their_params), value
                    return value
        # built from the host array the key was taken from (an EdgeGraph copies what it keeps
        # of it: index arrays saved for a backward pass must not change when the caller edits
        # the array between forward and backward)
        value = self._build(op, views[1] if views[0] == "edge_index" else graph, sizes, flow, self_loops)
        self._key, self._value = (owned(key), params), value
        if built is not None:
            if len(built) >= SHARED_PER_FORWARD:
                del built[0]
            built.append((self._key, value))
        return value

    @staticmethod
    def _build(op: str, graph: Any, sizes: tuple[int | None, int | None], flow: str,
               self_loops: bool) -> EdgeGraph:
        n0, n1 = sizes
        i, j = (1, 0) if flow == "source_to_target" else (0, 1)
        if isinstance(graph, Pattern) or is_sparse(graph):
            pattern = graph if isinstance(graph, Pattern) else graph.pattern
            n_dst, n_src = (n1, n0) if i == 1 else (n0, n1)
            want = (pattern.shape[0] if n_dst is None else n_dst, pattern.shape[1] if n_src is None else n_src)
            if pattern.shape != want:
                raise ShapeError(f"{op}: adjacency of shape {pattern.shape} (rows = destinations) does not "
                                 f"fit {want[0]} destination and {want[1]} source nodes")
            if not self_loops:
                return EdgeGraph.of_pattern(pattern)
            dst, src, n_given = pattern.rows, pattern.cols, pattern.nnz
            num_dst, num_src = want
        else:
            ei = edge_index_array(op, graph, n0, n1)
            n_given = ei.shape[1]
            # an unknown side is sized as PyG's maybe_num_nodes does: the largest index + 1
            full = [n if n is not None else (int(ei[k].max()) + 1 if n_given else 0)
                    for k, n in enumerate(sizes)]
            dst, src = ei[i], ei[j]
            num_dst, num_src = full[i], full[j]
        if not self_loops:
            if _may_alias_caller(ei, graph):
                dst, src = dst.copy(), src.copy()  # views of the caller's array: the graph keeps its own
            return EdgeGraph(dst, src, num_dst, num_src, n_given)
        # a bipartite graph gets loops on the nodes both sides have (PyG's GATConv: min(N, M))
        looped = self_loop_edge_index(np.stack([dst, src]), min(num_dst, num_src))
        return EdgeGraph(looped[0], looped[1], num_dst, num_src, n_given, kept=np.flatnonzero(dst != src))
