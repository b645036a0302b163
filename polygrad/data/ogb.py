"""OGB node-property-prediction folders (``ogbn-arxiv``, ``ogbn-products``, ...) read from local
files, as ``ogb.nodeproppred.PygNodePropPredDataset`` does -- without the ogb package.

The layout (OGB's own, what its zip archives unpack to)::

    <root>/<ogbn_arxiv or arxiv>/raw/edge.csv.gz          "src,dst" per edge, 0-based
                                 raw/num-node-list.csv.gz  the number of nodes
                                 raw/node-feat.csv.gz      one float row per node (optional)
                                 raw/node-label.csv.gz     one class per node (optional)
                                 split/<scheme>/{train,valid,test}.csv.gz   node ids

``add_inverse_edge`` (OGB's per-dataset setting: False for arxiv and papers100M, True for
products and proteins; ``None`` picks it by name, else False) appends every edge reversed, as
OGB's reader does.  Labels: ``y`` int64 ``[N]`` (unlabelled nodes, NaN in the file, become -1).
Every malformed, truncated or inconsistent file is a :class:`~polygrad.errors.DataError`.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..ir.errors import DataError
from ._files import download_zip, read_table
from .data import Data
from .edge_index import index_to_mask

__all__ = ["load_ogb_node", "download_ogb_node", "OGB_NODE_URL"]

OGB_NODE_URL = "http://snap.stanford.edu/ogb/data/nodeproppred"
_INVERSE_EDGES = {"ogbn-arxiv": False, "ogbn-products": True, "ogbn-proteins": True, "ogbn-papers100M": False}


def _short(name: str) -> str:
    return name[len("ogbn-"):] if name.startswith("ogbn-") else name


def find_ogb_node_dir(root: "str | os.PathLike[str]", name: str) -> Path:
    """The dataset folder (holding ``raw/``) under ``root``: ``root`` itself, ``root/ogbn_<short>``
    (what OGB's loader renames it to) or ``root/<short>`` (what the zip unpacks to)."""
    base = Path(root)
    short = _short(name)
    for folder in (base, base / f"ogbn_{short}", base / short, base / name):
        if (folder / "raw" / "edge.csv.gz").is_file() or (folder / "raw" / "edge.csv").is_file():
            return folder
    raise DataError(f"no OGB node dataset {name} (raw/edge.csv.gz, raw/num-node-list.csv.gz, ...) under {base}")


def _table(folder: Path, stem: str, dtype: type, columns: int | None = None, allow_nan: bool = False) -> np.ndarray:
    for candidate in (folder / f"{stem}.csv.gz", folder / f"{stem}.csv"):
        if candidate.is_file():
            return read_table(candidate, dtype, columns, allow_nan=allow_nan)
    raise DataError(f"{folder}: {stem}.csv.gz not found")


def _has(folder: Path, stem: str) -> bool:
    return (folder / f"{stem}.csv.gz").is_file() or (folder / f"{stem}.csv").is_file()


def load_ogb_node(root: "str | os.PathLike[str]", name: str = "ogbn-arxiv", *, split: str | None = None,
                  add_inverse_edge: bool | None = None, download: bool = False) -> Data:
    """An OGB node-property dataset as a :class:`Data`: ``x`` (float32, when ``node-feat`` is
    there), ``edge_index``, ``y``, and ``train_mask`` / ``val_mask`` / ``test_mask`` (plus
    ``split_idx`` = ``{"train", "valid", "test"}`` ids, as ``get_idx_split()``) from
    ``split/<split>`` (the only scheme there when ``split`` is None).

    ``download=True`` fetches OGB's zip into ``root`` first when the folder is missing.
    """
    if download:
        try:
            find_ogb_node_dir(root, name)
        except DataError:
            download_ogb_node(name, root)
    folder = find_ogb_node_dir(root, name)
    raw = folder / "raw"
    counts = _table(raw, "num-node-list", np.int64, 1)
    if counts.shape[0] != 1:
        raise DataError(f"{raw}: num-node-list holds {counts.shape[0]} graphs; a node dataset has one")
    n = int(counts[0, 0])
    if n < 0:
        raise DataError(f"{raw}: negative number of nodes ({n})")
    ei = _table(raw, "edge", np.int64, 2).T
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise DataError(f"{raw}/edge.csv.gz: node ids must lie in [0, {n}), got [{int(ei.min())}, {int(ei.max())}]")
    if _has(raw, "num-edge-list"):
        m = _table(raw, "num-edge-list", np.int64, 1)
        if m.shape != (1, 1) or int(m[0, 0]) != ei.shape[1]:
            raise DataError(f"{raw}: num-edge-list says {m.ravel().tolist()} edges, edge.csv.gz holds {ei.shape[1]}")
    inverse = _INVERSE_EDGES.get(name, False) if add_inverse_edge is None else bool(add_inverse_edge)
    if inverse:
        ei = np.concatenate([ei, ei[::-1]], axis=1)
    data = Data(edge_index=ei, num_nodes=n)
    if _has(raw, "node-feat"):
        x = _table(raw, "node-feat", np.float32)
        if x.shape[0] != n:
            raise DataError(f"{raw}/node-feat.csv.gz: {x.shape[0]} rows for {n} nodes")
        data.x = x
    if _has(raw, "node-label"):
        labels = _table(raw, "node-label", np.float64, allow_nan=True)
        if labels.shape[0] != n:
            raise DataError(f"{raw}/node-label.csv.gz: {labels.shape[0]} rows for {n} nodes")
        known = ~np.isnan(labels)
        if (labels[known] != np.round(labels[known])).any() or (labels[known] < 0).any():
            raise DataError(f"{raw}/node-label.csv.gz: labels must be non-negative integers (or NaN for unlabelled)")
        y = np.where(known, labels, -1).astype(np.int64)
        data.y = y[:, 0] if y.shape[1] == 1 else y
    splits = folder / "split"
    if splits.is_dir():
        schemes = sorted(p.name for p in splits.iterdir() if p.is_dir())
        if split is None and len(schemes) > 1:
            raise DataError(f"{splits}: several split schemes ({', '.join(schemes)}); pass split=")
        scheme = split if split is not None else (schemes[0] if schemes else None)
        if scheme is not None:
            if scheme not in schemes:
                raise DataError(f"{splits}: no split scheme {scheme!r} (found {', '.join(schemes) or 'none'})")
            idx = {}
            for part, mask in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
                ids = _table(splits / scheme, part, np.int64, 1)[:, 0]
                if ids.size and (ids.min() < 0 or ids.max() >= n):
                    raise DataError(f"{splits / scheme}/{part}.csv.gz: node ids outside [0, {n})")
                idx[part] = ids
                data[mask] = index_to_mask(ids, n)
            data.split_idx = idx
    elif split is not None:
        raise DataError(f"{folder}: no split/ folder (asked for split {split!r})")
    return data


def download_ogb_node(name: str, root: "str | os.PathLike[str]", *, base_url: str = OGB_NODE_URL,
                      timeout: float = 600.0) -> Path:
    """Fetch OGB's ``<short>.zip`` (e.g. ``arxiv.zip``) and unpack it into ``root/<short>``."""
    short = _short(name)
    if not short or "/" in short or "\\" in short or short.startswith("."):
        raise DataError(f"download_ogb_node: {name!r} is not a dataset name")
    return download_zip(f"{base_url.rstrip('/')}/{short}.zip", Path(root), short, timeout=timeout)
