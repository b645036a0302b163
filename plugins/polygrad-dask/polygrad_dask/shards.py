"""Edge shards: a graph stored as one file per row block, read by the workers themselves.

Layout of a shard directory (written by :func:`write_edge_shards`)::

    DIR/meta.json        {"format": "polygrad-edge-shards", "version": 1, "num_nodes": N,
                          "num_edges": E, "bounds": [0, b1, ..., N], "values": false}
    DIR/part-00000.npz   rows (int64), cols (int64)[, values]: the edges whose row (edge_index[0])
    DIR/part-00001.npz   lies in [bounds[i], bounds[i+1]), in any order
    ...

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

import polygrad as pg
from polygrad.errors import DataError
from polygrad.sparse import SparseTensor
from polygrad.tensor import sddmm

from . import chunks, cluster
from .partition import DistributedPattern, Partition, RowBlock, build_block

FORMAT = "polygrad-edge-shards"


def write_edge_shards(edge_index: Any, num_nodes: int, path: "str | os.PathLike", partitions: int | None = None,
                      values: Any = None) -> Path:
    """Write ``edge_index`` (int ``[2, E]``) as row-block shards under ``path``; returns the path."""
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise DataError(f"write_edge_shards: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= num_nodes):
        raise DataError(f"write_edge_shards: edge_index refers to nodes outside [0, {num_nodes})")
    vals = None if values is None else np.asarray(values)
    if vals is not None and vals.shape != (ei.shape[1],):
        raise DataError(f"write_edge_shards: values must have one entry per edge ({ei.shape[1]}), got {vals.shape}")
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
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def read_meta(path: "str | os.PathLike") -> dict:
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"load_edge_shards: {path} is not an edge-shard directory ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise DataError(f"load_edge_shards: {path}/meta.json is not in the {FORMAT!r} format")
    return meta


def _read_block(path: str, i: int, lo: int, hi: int, col_bounds: tuple, self_loops: bool,
                dtype: Any) -> tuple[RowBlock, np.ndarray]:
    """On a worker: shard ``i`` as a canonical RowBlock (duplicates summed) and its values."""
    with np.load(os.path.join(path, f"part-{i:05d}.npz")) as f:
        rows, cols = f["rows"], f["cols"]
        vals = f["values"].astype(dtype) if "values" in f.files else np.ones(rows.shape[0], dtype=dtype)
    if rows.size and (rows.min() < lo or rows.max() >= hi):
        raise DataError(f"edge shard {i} of {path} has rows outside its block [{lo}, {hi})")
    n = hi - lo
    local = rows - lo
    if self_loops:  # add the missing (r, r) entries with weight 1 (what gcn_norm does)
        has = np.zeros(n, dtype=bool)
        has[local[cols == rows]] = True
        missing = np.nonzero(~has)[0]
        local = np.concatenate([local, missing])
        cols = np.concatenate([cols, missing + lo])
        vals = np.concatenate([vals, np.ones(missing.shape[0], dtype=dtype)])
    key = local * max(int(col_bounds[-1]), 1) + cols
    order = np.argsort(key, kind="stable")
    key, vals = key[order], vals[order]
    first = np.ones(key.shape[0], dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.nonzero(first)[0]
    summed = np.add.reduceat(vals, starts) if starts.size else vals[:0]
    key = key[starts]
    width = max(int(col_bounds[-1]), 1)
    local_rows, ucols = key // width, key % width
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(local_rows, minlength=n), out=indptr[1:])
    return build_block(indptr, ucols, col_bounds), summed


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
    pairs = [client.submit(_read_block, where, i, a, b, bounds, add_self_loops, dt, pure=False)
             for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    blocks = tuple(client.submit(_first, p) for p in pairs)
    values = [client.submit(_second, p) for p in pairs]
    nnz = tuple(int(k) for k in client.gather([client.submit(_nnz, p) for p in pairs]))
    part = Partition((n, n), bounds, bounds, nnz, blocks)
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
