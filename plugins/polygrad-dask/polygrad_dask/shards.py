"""Edge shards: a graph stored as one file per row block, read by the workers themselves.

Layout of a shard directory (written by :func:`write_edge_shards`)::

    DIR/meta.json        {"format": "polygrad-edge-shards", "version": 1, "num_nodes": N,
                          "num_edges": E, "bounds": [0, b1, ..., N], "values": false[,
                          "order": "rcm"]}
    DIR/part-00000.npz   rows (int64), cols (int64)[, values]: the edges whose row (edge_index[0])
    DIR/part-00001.npz   lies in [bounds[i], bounds[i+1]), in any order
    ...
    DIR/order.npy        (with "order") the old id of each node id the shards use

Entry ``A[rows[e], cols[e]]`` (PyG's ``edge_index[0]``, ``edge_index[1]``; repeated edges are
summed, as ``pg.from_edge_index`` does).  ``bounds`` are the row blocks of
``polygrad_dask.chunks.bounds(N)`` for the partition count the shards were written with; load
them with the backend set to that count.  The directory must be readable by every worker at the
same path (a shared or copied file system).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

import polygrad as pg
from polygrad.runtime import memory
from polygrad.errors import DataError, MemoryBudgetError
from polygrad.sparse import SparseTensor
from polygrad.tensor import sddmm

from . import chunks, cluster, locality, memcap, partition
from .partition import DistributedPattern, RowBlock, build_block, finish

FORMAT = "polygrad-edge-shards"


def write_edge_shards(edge_index: Any, num_nodes: int, path: "str | os.PathLike", partitions: int | None = None,
                      values: Any = None, *, order: Any = None) -> Path:
    """Write ``edge_index`` (int ``[2, E]``) as row-block shards under ``path``; returns the path.

    ``order``: renumber the nodes first so fewer edges cross row blocks -- ``"rcm"`` or
    ``"degree"`` (``polygrad_dask.locality_order``), or an explicit permutation (the old id of each
    new id).  The shards then use the new ids; :func:`node_order` reads the permutation back, so
    features and labels are loaded as ``x[node_order(path)]`` and row ``k`` of a result is node
    ``node_order(path)[k]``.  ``None`` or ``"contiguous"``: ids as given."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 0:
        raise DataError(f"write_edge_shards: num_nodes must be an integer >= 0, got {num_nodes!r}")
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise DataError(f"write_edge_shards: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise DataError(f"write_edge_shards: edge_index refers to nodes outside [0, {num_nodes})")
    vals = None if values is None else np.asarray(values)
    if vals is not None and vals.shape != (ei.shape[1],):
        raise DataError(f"write_edge_shards: values must have one entry per edge ({ei.shape[1]}), got {vals.shape}")
    method, perm = _ordering(ei, int(num_nodes), order)
    if perm is not None:
        ei = locality.relabel(ei, perm)
    saved = chunks.partitions
    try:
        chunks.set_partitions(partitions or saved)
        bounds = chunks.bounds(int(num_nodes))
    finally:
        chunks.set_partitions(saved)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    block = np.searchsorted(np.asarray(bounds[1:-1], dtype=np.int64), ei[0], side="right")
    order = np.argsort(block, kind="stable")
    starts = np.searchsorted(block[order], np.arange(len(bounds)))
    for i in range(len(bounds) - 1):
        sel = order[starts[i]:starts[i + 1]]
        arrays = {"rows": ei[0, sel].astype(np.int64), "cols": ei[1, sel].astype(np.int64)}
        if vals is not None:
            arrays["values"] = vals[sel]
        np.savez(out / f"part-{i:05d}.npz", **arrays)
    meta = {"format": FORMAT, "version": 1, "num_nodes": int(num_nodes), "num_edges": int(ei.shape[1]),
            "bounds": [int(b) for b in bounds], "values": vals is not None}
    (out / "order.npy").unlink(missing_ok=True)
    if perm is not None:
        np.save(out / "order.npy", perm)
        meta["order"] = method
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def _ordering(ei: np.ndarray, n: int, order: Any) -> tuple[str, np.ndarray | None]:
    """(name, permutation or None) of ``write_edge_shards``' ``order`` argument."""
    if order is None or (isinstance(order, str) and order == "contiguous"):
        return "contiguous", None
    if isinstance(order, str):
        if order not in locality.METHODS:
            raise DataError(f"write_edge_shards: order must be one of {locality.METHODS}, a permutation or None, "
                            f"got {order!r}")
        return order, locality.locality_order(ei, n, order)
    perm = np.asarray(order)
    if perm.shape != (n,) or (perm.size and perm.dtype.kind not in "iu") or not _is_permutation(perm):
        raise DataError(f"write_edge_shards: order must be a permutation of the {n} node ids, got "
                        f"{perm.dtype} {perm.shape}")
    return "custom", perm.astype(np.int64)


def _is_permutation(perm: np.ndarray) -> bool:
    seen = np.zeros(perm.shape[0], dtype=bool)
    if perm.size and (perm.min() < 0 or perm.max() >= perm.shape[0]):
        return False
    seen[perm] = True
    return bool(seen.all())


def node_order(path: "str | os.PathLike") -> np.ndarray | None:
    """The old id of each node id of the shards under ``path`` (written with an ``order``), or
    None when they use the ids they were given.  A missing or damaged ``order.npy`` is a
    DataError."""
    meta = read_meta(path)
    if "order" not in meta:
        return None
    where = Path(path) / "order.npy"
    try:
        perm = np.load(where, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - missing, truncated, not an array: all unreadable
        raise DataError(f"load_edge_shards: {where} is unreadable ({type(exc).__name__}: {exc}); meta.json says "
                        f"the shards were renumbered by {meta['order']!r}") from exc
    n = int(meta["num_nodes"])
    if perm.shape != (n,) or (perm.size and perm.dtype.kind not in "iu") or not _is_permutation(perm):
        raise DataError(f"load_edge_shards: {where} is not a permutation of the {n} node ids "
                        f"({perm.dtype} {perm.shape})")
    return perm.astype(np.int64, copy=False)


def read_meta(path: "str | os.PathLike") -> dict:
    """``path``/meta.json, checked: the format, an integer ``num_nodes`` whose row blocks fit in
    memory, and ``bounds`` of integers from 0 to ``num_nodes``.  Anything else is a DataError."""
    where = Path(path) / "meta.json"
    try:
        meta = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"load_edge_shards: {path} is not an edge-shard directory ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"load_edge_shards: {where} is not in the {FORMAT!r} format")
    n: Any = meta.get("num_nodes")
    bounds: Any = meta.get("bounds")
    if not _is_int(n) or n < 0:
        raise DataError(f"load_edge_shards: {where} has num_nodes={n!r}; it must be an integer >= 0")
    if (not isinstance(bounds, list) or len(bounds) < 2 or not all(_is_int(b) for b in bounds)
            or bounds[0] != 0 or bounds[-1] != n or any(a > b for a, b in zip(bounds, bounds[1:]))):
        raise DataError(f"load_edge_shards: {where} has bounds={str(bounds):.200}; they must be integers "
                        f"rising from 0 to num_nodes={n}")
    # each worker holds its block's row pointers (and, with self loops, a flag per row): refuse a
    # num_nodes no worker could hold (a corrupt or hostile meta.json) before any task starts
    rows = max(b - a for a, b in zip(bounds, bounds[1:]))
    try:
        memory.check("load_edge_shards", 9 * (rows + 1), what=f"the row pointers of a {rows}-row block")
    except MemoryBudgetError as exc:
        raise DataError(f"load_edge_shards: {where} declares num_nodes={n}: {exc}") from exc
    return meta


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_arrays(path: str, i: int, n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shard ``i``'s rows, cols and values, checked (on a worker): a missing, truncated or
    malformed file, or ids that are not integers in ``[0, n)``, is a DataError naming the file."""
    name = os.path.join(path, f"part-{i:05d}.npz")
    try:
        with np.load(name, allow_pickle=False) as f:
            missing = {"rows", "cols"} - set(f.files)
            if missing:
                raise DataError(f"edge shard {name} lacks the arrays {sorted(missing)}")
            rows, cols = f["rows"], f["cols"]
            vals = f["values"] if "values" in f.files else None
    except DataError:
        raise
    except FileNotFoundError as exc:
        raise DataError(f"edge shard {name} is missing (meta.json lists its row block)") from exc
    except Exception as exc:  # noqa: BLE001 - BadZipFile, EOFError, zlib.error, ValueError: all unreadable
        raise DataError(f"edge shard {name} is unreadable or truncated ({type(exc).__name__}: {exc})") from exc
    for label, ids in (("rows", rows), ("cols", cols)):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise DataError(f"edge shard {name}: {label} must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if rows.shape != cols.shape or (vals is not None and vals.shape != rows.shape):
        raise DataError(f"edge shard {name}: rows {rows.shape}, cols {cols.shape} and values "
                        f"{None if vals is None else vals.shape} must have one entry per edge")
    if cols.size and (cols.min() < 0 or cols.max() >= n):
        raise DataError(f"edge shard {name} has column ids outside [0, {n}) (min {cols.min()}, max {cols.max()}): "
                        "they would land in other rows")
    if vals is None:
        return rows, cols, np.ones(rows.shape[0], dtype=dtype)
    try:
        values = vals.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise DataError(f"edge shard {name}: values of dtype {vals.dtype} cannot be read as {dtype}") from exc
    return rows, cols, values


def _read_block(path: str, i: int, lo: int, hi: int, col_bounds: tuple, self_loops: bool,
                dtype: Any, whole_fraction: float | None = None) -> tuple[RowBlock, np.ndarray]:
    """On a worker: shard ``i`` as a canonical RowBlock (duplicates summed) and its values.

    Ids are narrowed to int32 when the graph allows and the CSR is built by scipy's COO -> CSR
    conversion (a counting sort), so the transient memory is a few arrays of 4 bytes per edge,
    not the int64 keys and argsort of a general sort."""
    rows, cols, vals = _read_arrays(path, i, int(col_bounds[-1]), dtype)
    if rows.size and (rows.min() < lo or rows.max() >= hi):
        raise DataError(f"edge shard {i} of {path} has rows outside its block [{lo}, {hi})")
    n, width = hi - lo, max(int(col_bounds[-1]), 1)
    index = np.int32 if max(width, n, rows.shape[0] + n) < 2**31 - 1 else np.int64
    local = (rows - lo).astype(index)
    del rows
    cols = cols.astype(index)
    if self_loops:  # add the missing (r, r) entries with weight 1 (what gcn_norm does)
        has = np.zeros(n, dtype=bool)
        has[local[cols == local + lo]] = True
        missing = np.nonzero(~has)[0].astype(index)
        local = np.concatenate([local, missing])
        cols = np.concatenate([cols, missing + index(lo)])
        vals = np.concatenate([vals, np.ones(missing.shape[0], dtype=dtype)])
    memcap.check(f"edge shard {i} ({local.shape[0]} edges, rows [{lo}, {hi}))",
                 local.shape[0] * (2 * np.dtype(index).itemsize + np.dtype(dtype).itemsize))
    csr = sp.csr_matrix((vals, (local, cols)), shape=(n, width))   # duplicates summed, sorted
    del local, cols, vals
    csr.sum_duplicates()
    block = build_block(csr.indptr, csr.indices, col_bounds, i, i, whole_fraction)
    return block, csr.data


def _first(pair: tuple) -> Any:
    return pair[0]


def _second(pair: tuple) -> Any:
    return pair[1]


def _nnz(pair: tuple) -> int:
    return pair[0].nnz


def load_edge_shards(path: "str | os.PathLike", *, add_self_loops: bool = False, dtype: Any = None) -> SparseTensor:
    """The ``N x N`` sparse adjacency stored under ``path``, on the ``dask`` backend.

    Each worker reads its shards; the client gets only the shard count and nonzeros per block
    (``DistributedPattern``).  ``add_self_loops`` adds the missing diagonal entries (weight 1)."""
    meta = read_meta(path)
    n = int(meta["num_nodes"])
    bounds = tuple(int(b) for b in meta["bounds"])
    if bounds != tuple(chunks.bounds(n)):
        raise DataError(f"load_edge_shards: {path} has {len(bounds) - 1} row blocks but the dask backend "
                        f"uses {chunks.partitions}: set pg.get_backend('dask').partitions = {len(bounds) - 1} "
                        "or rewrite the shards")
    dt = np.dtype(dtype) if dtype is not None else np.dtype(pg.default_float)
    client = cluster.client()
    where = os.fspath(Path(path).resolve())
    # the client's whole-halo threshold (a worker process would read its own module's default)
    pairs = [client.submit(_read_block, where, i, a, b, bounds, add_self_loops, dt, partition.WHOLE_HALO_FRACTION,
                           pure=False,
                           **cluster.placed(client, i))
             for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    blocks = tuple(client.submit(_first, p, **cluster.placed(client, i)) for i, p in enumerate(pairs))
    values = [client.submit(_second, p, **cluster.placed(client, i)) for i, p in enumerate(pairs)]
    nnz = tuple(int(k) for k in client.gather([client.submit(_nnz, p) for p in pairs]))
    part = finish(client, (n, n), bounds, bounds, nnz, blocks)
    arrays = [da.from_delayed(v, (k,), dtype=dt) for v, k in zip(values, nnz)]
    data = arrays[0] if len(arrays) == 1 else da.concatenate(arrays)
    return SparseTensor.from_pattern(DistributedPattern(part), pg.Tensor.from_backend(data, "dask"))


def gcn_adjacency(path: "str | os.PathLike", dtype: Any = None) -> SparseTensor:
    """GCN's ``D^-1/2 (A + I) D^-1/2`` from edge shards, computed on the workers (as
    ``pg.gcn_norm`` does in one process: missing self loops added, degree-0 rows stay 0)."""
    a = load_edge_shards(path, add_self_loops=True, dtype=dtype)
    n = a.shape[0]
    with pg.no_grad():
        deg = a.sum(axis=1)
        positive = deg > 0
        dinv = pg.where(positive, pg.where(positive, deg, 1.0) ** -0.5, 0.0).reshape(n, 1)
        values = a.values * sddmm(dinv, dinv, a.pattern)   # d_i * d_j at each nonzero (i, j)
    out = SparseTensor.from_pattern(a.pattern, values)
    pg.materialize(out)
    return out
