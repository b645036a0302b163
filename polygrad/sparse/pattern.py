"""The sparsity pattern of a sparse matrix: canonical CSR index arrays, shared and immutable.

A sparse tensor is a :class:`Pattern` plus a dense 1-D tensor of values (one per nonzero).  Keeping
the pattern outside the autodiff graph is what lets every sparse op be written as dense ops on the
values plus a few pattern-aware primitives (SpMM, SDDMM, segment reductions), and what makes a
gradient w.r.t. a sparse tensor a sparse tensor with the same pattern.

Canonical form (sorted row-major, no duplicates) is established once, by :meth:`Pattern.from_coo`
(unordered input, duplicates) or :meth:`Pattern.from_sorted` (canonical input); a Pattern trusts
it and never re-sorts.  The transpose (CSC order) is computed on first use and cached, as are the
index arrays converted for each backend.

Every index pass here is a counting sort in scipy's compiled ``sparsetools`` (the routines behind
``coo_matrix.tocsr`` and ``csr_matrix.tocsc``) or a linear numpy pass: no comparison sort of nnz
keys, no hash table, no Python loop per entry, and at most two temporary nnz-length index arrays
alive at once.
"""
from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
from scipy.sparse import _sparsetools

from ..runtime import memory
from ..runtime.threads import block_positions, even_blocks, get_num_threads, row_blocks, run_blocks


#: row subsets (Pattern.take_rows) kept per pattern
TAKE_ROWS_CACHED = 4
#: entries below which sorting each row's columns stays in one thread (2**18 sort in ~10 ms)
SORT_PARALLEL_MIN = 1 << 18


def sort_row_indices(n: int, indptr: np.ndarray, cols: np.ndarray, payload: np.ndarray) -> None:
    """Sort each row's columns in place, carrying ``payload`` along: scipy's compiled
    ``csr_sort_indices`` (it releases the GIL) over row blocks balanced by entries, on polygrad's
    threads (``pg.set_num_threads``).  Each row is sorted whole by the same routine, so the result
    is the same at any thread count."""
    threads = 1 if cols.shape[0] < SORT_PARALLEL_MIN else get_num_threads()

    def block(r0: int, r1: int) -> None:
        _sparsetools.csr_sort_indices(r1 - r0, indptr[r0:r1 + 1], cols, payload)

    run_blocks(block, row_blocks(indptr, n, 4 * threads if threads > 1 else 1), threads)


def sort_by_row(n: int, m: int, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, cols, perm) of int64 COO entries in a stable counting sort by row: scipy's compiled
    ``coo_tocsr`` with each entry's input position as payload, so ``perm[k]`` is the input entry
    at position k and each row's entries keep their input order.

    On several threads (``pg.set_num_threads``), in blocks of rows balanced by entries: each block
    picks its entries out of the input, in input order, and sorts them into its own contiguous
    part of the output.  A stable sort has one answer, so the arrays are the serial ones at any
    thread count."""
    nnz = rows.shape[0]
    threads = 1 if nnz < SORT_PARALLEL_MIN else get_num_threads()
    indptr = np.empty(n + 1, dtype=np.int64)
    sorted_cols = np.empty(nnz, dtype=np.int64)
    perm = np.empty(nnz, dtype=np.int64)
    if threads == 1:
        _sparsetools.coo_tocsr(n, m, nnz, rows, cols, np.arange(nnz, dtype=np.int64), indptr, sorted_cols, perm)
        return indptr, sorted_cols, perm
    indptr[0] = 0
    np.cumsum(row_counts(rows, n, threads), out=indptr[1:])

    def block(r0: int, r1: int) -> None:
        lo, hi = int(indptr[r0]), int(indptr[r1])
        picked = block_positions(rows, r0, r1)  # input positions, ascending: the payload
        local_rows = rows[picked]
        local_rows -= r0
        local_indptr = np.empty(r1 - r0 + 1, dtype=np.int64)
        _sparsetools.coo_tocsr(r1 - r0, m, hi - lo, local_rows, cols[picked], picked, local_indptr,
                               sorted_cols[lo:hi], perm[lo:hi])

    # four blocks per thread: each block reads the whole input once to pick its entries, and the
    # blocks in flight hold their entries' rows, columns and positions (24 bytes each): about 6
    # bytes per entry in all, less than the serial sort's payload (8)
    run_blocks(block, row_blocks(indptr, n, 4 * threads), threads)
    return indptr, sorted_cols, perm


def scatter_permuted(out: np.ndarray, perm: np.ndarray, values: np.ndarray) -> None:
    """``out[perm] = values`` for a permutation ``perm``, in blocks of ``perm`` on polygrad's
    threads: no two blocks write one entry, so the result is the serial one."""
    threads = 1 if perm.shape[0] < SORT_PARALLEL_MIN else get_num_threads()

    def block(lo: int, hi: int) -> None:
        out[perm[lo:hi]] = values[lo:hi]

    run_blocks(block, even_blocks(perm.shape[0], 4 * threads if threads > 1 else 1), threads)


def row_counts(rows: np.ndarray, n: int, threads: int) -> np.ndarray:
    """Entries per row (int64 ``[n]``) of row indices in any order: ``bincount`` over chunks of
    the input on ``threads`` threads, the chunks' counts added (integers: exact)."""
    chunks = even_blocks(rows.shape[0], threads)
    counts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(chunks)

    def block(i: int, lo: int, hi: int) -> None:
        counts[i] = np.bincount(rows[lo:hi], minlength=n)

    run_blocks(block, [(i, lo, hi) for i, (lo, hi) in enumerate(chunks)], threads)
    total = counts[0]
    for part in counts[1:]:
        total += part
    return total


def indptr_from_rows(rows: np.ndarray, nrows: int) -> np.ndarray:
    """CSR row pointers (int64 ``[nrows + 1]``) of row indices sorted ascending."""
    indptr = np.zeros(nrows + 1, dtype=np.int64)
    if rows.size:
        np.cumsum(np.bincount(rows, minlength=nrows), out=indptr[1:])
    return indptr


def rows_of(indptr: np.ndarray) -> np.ndarray:
    """The row of each entry (int64 ``[nnz]``) of CSR row pointers: the COO row array."""
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))


def _int64(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _is_canonical(rows: np.ndarray, cols: np.ndarray) -> bool:
    """Whether (rows, cols) are already row-major sorted and duplicate-free (one linear pass)."""
    if rows.shape[0] < 2:
        return True
    head = 1024  # unordered input is usually caught in its first entries: skip the full pass then
    if rows.shape[0] > 2 * head and not _is_canonical(rows[:head], cols[:head]):
        return False
    dr = np.diff(rows)
    return bool(((dr > 0) | ((dr == 0) & (np.diff(cols) > 0))).all())


class Pattern:
    """Row-major canonical pattern of an ``nrows x ncols`` sparse matrix.

    Attributes (numpy arrays, host memory; never mutated):
      indptr  int64[nrows+1]  CSR row pointers
      rows    int64[nnz]      row of each nonzero (COO view of the same order)
      cols    int64[nnz]      column of each nonzero, sorted within each row
    ``layout`` is the user-facing label ("csr" or "coo"): both share this canonical storage.
    """

    __slots__ = ("shape", "indptr", "_rows", "cols", "layout", "_transpose", "_device", "__weakref__")

    @classmethod
    def from_sorted(cls, shape: tuple[int, int], rows: Any, cols: Any, layout: str = "csr") -> "Pattern":
        """The pattern of row-major sorted, duplicate-free ``rows``/``cols`` (the caller vouches)."""
        rows, cols = _int64(rows), _int64(cols)
        return cls(shape, indptr_from_rows(rows, int(shape[0])), cols, layout, rows=rows)

    @classmethod
    def from_coo(cls, shape: tuple[int, int], rows: Any, cols: Any,
                 layout: str = "csr") -> tuple["Pattern", np.ndarray | None, np.ndarray | None]:
        """The canonical pattern of COO entries in any order, possibly repeated.

        Returns ``(pattern, perm, slot)``: without duplicates ``values[perm]`` are the values in
        canonical order (``perm`` is None when the input was canonical already); with duplicates
        ``perm`` is None and ``slot[k]`` is the canonical position input entry ``k`` is summed
        into (``bincount(slot, values)``: deterministic, in input order).  Indices must already be
        in range (the sparse constructors check that, with errors that name the op).
        """
        n, m = int(shape[0]), int(shape[1])
        rows, cols = _int64(rows), _int64(cols)
        nnz = rows.shape[0]
        if _is_canonical(rows, cols):
            return cls(shape, indptr_from_rows(rows, n), cols, layout, rows=rows), None, None
        # a stable counting sort by row (compiled), then each row's columns sorted in place; the
        # payload is each entry's input position
        indptr, sorted_cols, perm = sort_by_row(n, m, rows, cols)
        sort_row_indices(n, indptr, sorted_cols, perm)
        first = np.empty(nnz, dtype=bool)
        first[0] = True
        np.not_equal(sorted_cols[1:], sorted_cols[:-1], out=first[1:])
        starts = indptr[1:-1]
        first[starts[starts < nnz]] = True  # a row's first entry is never a repeat of the last row's
        if first.all():
            return cls(shape, indptr, sorted_cols, layout), perm, None
        # duplicates: position = number of distinct entries before it in canonical order
        distinct = np.zeros(nnz + 1, dtype=np.int64)
        np.cumsum(first, out=distinct[1:])
        new_indptr = distinct[indptr]
        distinct = distinct[1:]
        distinct -= 1
        slot = np.empty(nnz, dtype=np.int64)
        scatter_permuted(slot, perm, distinct)  # slot[perm] = distinct
        del perm, distinct
        return cls(shape, new_indptr, sorted_cols[first], layout), None, slot

    def __init__(self, shape: tuple[int, int], indptr: np.ndarray, cols: np.ndarray,
                 layout: str = "csr", rows: np.ndarray | None = None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.indptr = indptr
        self.cols = cols
        self._rows = rows
        for arr in (indptr, cols, rows):  # never mutated: enforced, so device caches stay valid
            if isinstance(arr, np.ndarray):
                arr.flags.writeable = False
        self.layout = layout
        # (the transpose, its permutation); the permutation is None on a transpose's way back
        self._transpose: tuple[Pattern, np.ndarray | None] | None = None
        self._device: dict[Any, Any] = {}

    @property
    def rows(self) -> np.ndarray:
        """Row of each nonzero (the COO view), expanded from ``indptr`` on first use: the kernels
        that walk rows (SpMM, segment sums) never need it, so a transpose does not pay for it."""
        if self._rows is None:
            rows = self.row_ids()
            rows.flags.writeable = False  # ours: read-only lets backends cache device copies
            self._rows = rows
        return self._rows

    def row_ids(self) -> np.ndarray:
        """The rows of :attr:`rows` without caching them (the cached array when there is one): for
        a one-off use on a large pattern that should not keep nnz more int64 entries alive."""
        if self._rows is not None:
            return self._rows
        return rows_of(self.indptr)

    @property
    def nnz(self) -> int:
        return int(self.cols.shape[0])

    @property
    def density(self) -> float:
        size = self.shape[0] * self.shape[1]
        return self.nnz / size if size else 0.0

    def with_layout(self, layout: str) -> "Pattern":
        """The same pattern under another label, sharing arrays and caches."""
        if layout == self.layout:
            return self
        twin = Pattern(self.shape, self.indptr, self.cols, layout, self._rows)
        twin._transpose, twin._device = self._transpose, self._device
        return twin

    def _by_content(self, name: str, arrays: tuple[np.ndarray, ...], build: Callable[[], tuple]) -> tuple:
        """``build()``, remembered under ``name`` for the last few contents of ``arrays`` (a captured
        step asks for the same rows on every capture; one that asks for new rows each call must not
        grow the cache)."""
        key = tuple((a.shape[0], hash(a.tobytes())) for a in arrays)
        recent = self._device.setdefault(name, {})
        cached = recent.get(key)
        if cached is not None and all(np.array_equal(seen, a) for seen, a in zip(cached[0], arrays)):
            return cached[1]
        result = build()
        if cached is None:
            if len(recent) >= TAKE_ROWS_CACHED:
                del recent[next(iter(recent))]  # the oldest
            frozen = tuple(a.copy() for a in arrays)
            for a in frozen:
                a.flags.writeable = False
            recent[key] = (frozen, result)
        return result

    def take_rows(self, rows: np.ndarray) -> tuple["Pattern", np.ndarray]:
        """(pattern of the rows ``rows`` of this matrix, in that order; the positions of their
        nonzeros here), so ``values[positions]`` are the submatrix's values.  Cached per content of
        ``rows`` (a captured step asks for the same rows on every capture)."""
        rows = np.asarray(rows, dtype=np.int64)

        def build() -> tuple["Pattern", np.ndarray]:
            starts = self.indptr[rows]
            lengths = self.indptr[rows + 1] - starts
            indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            positions = np.arange(int(indptr[-1]), dtype=np.int64) + np.repeat(starts - indptr[:-1], lengths)
            positions.flags.writeable = False
            return Pattern((rows.shape[0], self.shape[1]), indptr, self.cols[positions], self.layout), positions

        return cast(tuple, self._by_content("take_rows", (rows,), build))

    def restrict(self, rows: np.ndarray, cols: np.ndarray) -> tuple["Pattern", np.ndarray]:
        """(the ``nrows x len(cols)`` pattern that keeps the rows ``rows`` of this matrix and empties
        the others, its columns renumbered to their index in ``cols``; the positions of the kept
        nonzeros here).  ``rows`` and ``cols`` are sorted and distinct, and ``cols`` holds every
        column of the kept rows (the caller vouches).  Each kept row keeps its nonzeros' order, so
        a product over it sums each row as over this matrix.  Cached per content of both, as
        :meth:`take_rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)

        def build() -> tuple["Pattern", np.ndarray]:
            sub, positions = self.take_rows(rows)
            lengths = np.zeros(self.shape[0], dtype=np.int64)
            lengths[rows] = np.diff(sub.indptr)
            indptr = np.zeros(self.shape[0] + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            renumbered = np.searchsorted(cols, sub.cols)
            return Pattern((self.shape[0], cols.shape[0]), indptr, renumbered, self.layout), positions

        return cast(tuple, self._by_content("restrict", (rows, cols), build))

    def max_row_nnz(self) -> int:
        """The most nonzeros of any row (0 for no rows), computed once and cached."""
        return int(self.derived("max_row_nnz", lambda p: int(np.diff(p.indptr).max(initial=0))))

    def transpose(self) -> tuple["Pattern", np.ndarray]:
        """(pattern of Aᵀ, perm) with ``values_T = values[perm]``; computed once, then cached."""
        if self._transpose is None:
            # budgeted before allocating: the column pointers follow the column count, which a
            # hostile shape can make far larger than nnz (int64 indptr, perm, cols, a payload)
            memory.check("transpose", 8 * (self.shape[1] + 1) + 24 * self.nnz,
                         what=f"the transpose of a sparse {self.shape} pattern with {self.nnz} entries")
            # scipy's compiled CSR -> CSC: a counting sort by column that keeps rows ascending
            # within each column, i.e. canonical for Aᵀ; the payload gives the permutation
            n, m = self.shape
            t_indptr = np.empty(m + 1, dtype=np.int64)
            t_cols = np.empty(self.nnz, dtype=np.int64)
            perm = np.empty(self.nnz, dtype=np.int64)
            _sparsetools.csr_tocsc(n, m, self.indptr, self.cols, np.arange(self.nnz, dtype=np.int64),
                                   t_indptr, t_cols, perm)
            perm.flags.writeable = False  # ours: read-only lets backends cache device copies
            t = Pattern((m, n), t_indptr, t_cols, self.layout)
            t._transpose = (self, None)  # the way back: its permutation is inverted when asked
            self._transpose = (t, perm)
        elif self._transpose[1] is None:
            # the forward transpose set this way back and keeps its own permutation: never None
            back = self._transpose[0]
            forward = cast("tuple[Pattern, np.ndarray]", back._transpose)[1]
            inv = np.empty_like(forward)
            inv[forward] = np.arange(forward.shape[0])
            inv.flags.writeable = False
            self._transpose = (back, inv)
        return cast("tuple[Pattern, np.ndarray]", self._transpose)  # both branches filled the permutation

    def union_diagonal(self) -> tuple["Pattern", np.ndarray, np.ndarray, np.ndarray]:
        """The pattern with every diagonal entry added (square only), by one linear insertion pass.

        Returns ``(union, pos, diag_pos, had_diag)``: entry k of this pattern sits at ``pos[k]`` of
        the union, the diagonal entry (i, i) at ``diag_pos[i]``; ``had_diag[i]`` says whether it
        was stored here already.
        """
        n = self.shape[0]
        rows, cols = self.rows, self.cols
        had_diag = np.zeros(n, dtype=bool)
        on_diag = rows == cols
        had_diag[rows[on_diag]] = True
        del on_diag
        missing = ~had_diag
        below = cols < rows  # entries before the diagonal within their row (columns are sorted)
        before_diag = np.bincount(rows[below], minlength=n)
        del below
        inserted_before = np.zeros(n + 1, dtype=np.int64)  # missing diagonals inserted in earlier rows
        np.cumsum(missing, out=inserted_before[1:])
        indptr = self.indptr + inserted_before
        diag_pos = indptr[:-1] + before_diag
        pos = inserted_before[rows]
        pos += np.arange(self.nnz, dtype=np.int64)
        pos += missing[rows] & (cols > rows)  # after a diagonal inserted in the same row
        union_cols = np.empty(int(indptr[-1]), dtype=np.int64)
        union_cols[pos] = cols
        union_cols[diag_pos] = np.arange(n, dtype=np.int64)
        return Pattern(self.shape, indptr, union_cols, self.layout), pos, diag_pos, had_diag

    def derived(self, key: Any, make: Callable[["Pattern"], Any]) -> Any:
        """``make(self)``, computed once per ``key`` and cached on the pattern (which never changes):
        for a backend's own form of the indices, e.g. int32 copies for a compiled kernel."""
        value = self._device.get(key)
        if value is None:
            value = self._device[key] = make(self)
        return value

    def on(self, key: Any, convert: Callable[[np.ndarray], Any]) -> tuple[Any, Any, Any]:
        """(indptr, rows, cols) converted once per backend (``key``) and cached: no copy per call."""
        arrays = self._device.get(key)
        if arrays is None:
            arrays = (convert(self.indptr), convert(self.rows), convert(self.cols))
            self._device[key] = arrays
        return arrays

    def same_as(self, other: "Pattern") -> bool:
        return self is other or (self.shape == other.shape and self.nnz == other.nnz
                                 and np.array_equal(self.indptr, other.indptr)
                                 and np.array_equal(self.cols, other.cols))

    def __repr__(self) -> str:
        return f"Pattern(shape={self.shape}, nnz={self.nnz}, layout={self.layout!r})"
