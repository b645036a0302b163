"""TUDataset graph-classification folders (MUTAG, PROTEINS, ...) read as PyG's ``TUDataset`` does.

The raw format (https://chrsmrrs.github.io/datasets/docs/format/), one ``NAME_*.txt`` per table:
``NAME_A.txt`` (``row, col`` per edge, 1-based node ids over the whole dataset),
``NAME_graph_indicator.txt`` (the 1-based graph of each node), ``NAME_graph_labels.txt`` (one
class per graph; or ``NAME_graph_attributes.txt`` for regression) and, optionally,
``NAME_node_labels.txt``, ``NAME_node_attributes.txt``, ``NAME_edge_labels.txt``,
``NAME_edge_attributes.txt``.

As PyG: node features are the one-hot node labels (with ``use_node_attr=True`` the node
attributes first), self loops are dropped and edges coalesced, graph labels are renumbered
``0..C-1`` in sorted order, and edge features are the one-hot edge labels (with
``use_edge_attr=True`` the edge attributes first).  A graph with neither node labels nor
attributes gets ``x = 1`` (one column) where PyG leaves ``x`` None: polygrad's layers need a
feature matrix.  Each graph is a :class:`~polygrad.data.Data`; they batch with
:class:`~polygrad.data.DataLoader` / :func:`~polygrad.data.collate`.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..ir.errors import DataError
from ._files import download_zip, read_table
from .data import Data
from .utils import coalesce, remove_self_loops

__all__ = ["load_tudataset", "find_tudataset_dir", "download_tudataset", "TU_URL"]

TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets"


def find_tudataset_dir(root: "str | os.PathLike[str]", name: str | None = None) -> tuple[Path, str]:
    """(folder holding ``NAME_A.txt``, NAME) under ``root``: ``root`` itself, ``root/NAME``,
    ``root/NAME/raw`` or ``root/raw``; ``name`` may be omitted when exactly one ``*_A.txt`` is there."""
    base = Path(root)
    places = [base, base / "raw"] + ([base / name, base / name / "raw"] if name else [])
    for folder in places:
        if not folder.is_dir():
            continue
        found = sorted(p.name[:-len("_A.txt")] for p in folder.glob("*_A.txt"))
        if name is not None and name in found:
            return folder, name
        if name is None and len(found) == 1:
            return folder, found[0]
        if name is None and len(found) > 1:
            raise DataError(f"{folder}: several TUDatasets ({', '.join(found)}); pass name=")
    raise DataError(f"no TUDataset {name or ''} (NAME_A.txt, NAME_graph_indicator.txt, ...) in {base}"
                    + (f" or {base / name}" if name else ""))


def _one_hot_columns(labels: np.ndarray) -> np.ndarray:
    """PyG's ``one_hot`` per column after subtracting the column minimum, columns concatenated."""
    labels = labels - labels.min(axis=0)
    blocks = []
    for col in labels.T:
        block = np.zeros((col.shape[0], int(col.max()) + 1), dtype=np.float32)
        block[np.arange(col.shape[0]), col] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def load_tudataset(root: "str | os.PathLike[str]", name: str | None = None, *, use_node_attr: bool = False,
                   use_edge_attr: bool = False, download: bool = False) -> list[Data]:
    """The graphs of a TUDataset folder, each a :class:`Data` (``x``, ``edge_index``, ``y`` of
    shape ``[1]``, ``edge_attr`` when there are edge labels/attributes), in file order.

    ``download=True`` fetches ``NAME.zip`` from the TU collection into ``root`` first when the
    files are not there.  Missing, truncated or malformed files raise :class:`DataError`.
    """
    if download:
        try:
            find_tudataset_dir(root, name)
        except DataError:
            if name is None:
                raise DataError("load_tudataset: download=True needs name=") from None
            download_tudataset(name, root)
    folder, name = find_tudataset_dir(root, name)

    def path(part: str) -> Path:
        return folder / f"{name}_{part}.txt"

    def optional(part: str) -> bool:
        return path(part).is_file()

    edges = read_table(path("A"), np.int64, 2)
    indicator = read_table(path("graph_indicator"), np.int64, 1)[:, 0]
    n = indicator.shape[0]
    if n == 0:
        raise DataError(f"{path('graph_indicator')}: no nodes")
    if edges.size and (edges.min() < 1 or edges.max() > n):
        raise DataError(f"{path('A')}: node ids must lie in [1, {n}] (the lines of the graph indicator), "
                        f"got [{int(edges.min())}, {int(edges.max())}]")
    batch = indicator - 1
    if batch.min() < 0 or (np.diff(batch) < 0).any():
        raise DataError(f"{path('graph_indicator')}: graph ids must start at 1 and never decrease (nodes are "
                        "listed graph by graph)")
    num_graphs = int(batch[-1]) + 1
    if np.unique(batch).shape[0] != num_graphs:
        raise DataError(f"{path('graph_indicator')}: graph ids skip a number (a graph without nodes)")
    ei = edges.T - 1
    if ei.size and (batch[ei[0]] != batch[ei[1]]).any():
        k = int(np.flatnonzero(batch[ei[0]] != batch[ei[1]])[0])
        raise DataError(f"{path('A')}, line {k + 1}: an edge between graphs {int(batch[ei[0, k]]) + 1} and "
                        f"{int(batch[ei[1, k]]) + 1}")

    x_parts = []
    if use_node_attr and optional("node_attributes"):
        x_parts.append(_rows(read_table(path("node_attributes"), np.float32), n, path("node_attributes")))
    if optional("node_labels"):
        x_parts.append(_one_hot_columns(_rows(read_table(path("node_labels"), np.int64), n, path("node_labels"))))
    x = np.concatenate(x_parts, axis=1) if x_parts else np.ones((n, 1), dtype=np.float32)

    e_parts = []
    num_e = ei.shape[1]
    if use_edge_attr and optional("edge_attributes"):
        e_parts.append(_rows(read_table(path("edge_attributes"), np.float32), num_e, path("edge_attributes")))
    if optional("edge_labels"):
        e_parts.append(_one_hot_columns(_rows(read_table(path("edge_labels"), np.int64), num_e, path("edge_labels"))))
    edge_attr = np.concatenate(e_parts, axis=1) if e_parts else None

    if optional("graph_attributes"):
        y = read_table(path("graph_attributes"), np.float32)
        y = y[:, 0] if y.shape[1] == 1 else y
    elif optional("graph_labels"):
        raw = read_table(path("graph_labels"), np.int64, 1)[:, 0]
        y = np.unique(raw, return_inverse=True)[1].reshape(-1)
    else:
        raise DataError(f"{folder}: neither {name}_graph_labels.txt nor {name}_graph_attributes.txt")
    if y.shape[0] != num_graphs:
        raise DataError(f"{folder}: {y.shape[0]} graph labels for {num_graphs} graphs")

    ei, edge_attr = remove_self_loops(ei, edge_attr)
    if edge_attr is None:
        ei = coalesce(ei, num_nodes=n)
    else:
        ei, edge_attr = coalesce(ei, edge_attr, n)
    return _split(x, ei, edge_attr, y, batch, num_graphs)


def _rows(table: np.ndarray, n: int, where: Path) -> np.ndarray:
    if table.shape[0] != n:
        raise DataError(f"{where}: {table.shape[0]} rows, expected {n}")
    return table


def _split(x: np.ndarray, ei: np.ndarray, edge_attr: np.ndarray | None, y: np.ndarray, batch: np.ndarray,
           num_graphs: int) -> list[Data]:
    node_ptr = np.zeros(num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(batch, minlength=num_graphs), out=node_ptr[1:])
    graph_of_edge = batch[ei[0]]
    edge_ptr = np.zeros(num_graphs + 1, dtype=np.int64)  # coalesced edges are sorted by source: by graph
    np.cumsum(np.bincount(graph_of_edge, minlength=num_graphs), out=edge_ptr[1:])
    graphs = []
    for g in range(num_graphs):
        lo, hi = node_ptr[g], node_ptr[g + 1]
        e_lo, e_hi = edge_ptr[g], edge_ptr[g + 1]
        d = Data(x=x[lo:hi], edge_index=ei[:, e_lo:e_hi] - lo, y=y[g:g + 1], num_nodes=int(hi - lo))
        if edge_attr is not None:
            d.edge_attr = edge_attr[e_lo:e_hi]
        graphs.append(d)
    return graphs


def download_tudataset(name: str, root: "str | os.PathLike[str]", *, base_url: str = TU_URL,
                       timeout: float = 60.0) -> Path:
    """Fetch ``NAME.zip`` of the TU collection and unpack it into ``root/NAME``."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise DataError(f"download_tudataset: {name!r} is not a dataset name")
    return download_zip(f"{base_url.rstrip('/')}/{name}.zip", Path(root), name, timeout=timeout)
