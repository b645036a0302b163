"""TUDataset and OGB node-property readers on small files the tests write in each format; hostile
files (missing, truncated, malformed, inconsistent) give a DataError naming the file."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from polygrad.data import collate, load_ogb_node, load_tudataset
from polygrad.data._files import read_table
from polygrad.data.utils import coalesce
from polygrad.errors import DataError

try:
    import torch
    from torch_geometric.datasets import TUDataset as PygTU
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

# two graphs: a triangle (nodes 1-3, with a self loop and a repeated edge) and a path (nodes 4-5)
TOY = {
    "A": "1, 2\n2, 1\n2, 3\n3, 2\n1, 3\n3, 1\n1, 1\n1, 2\n4, 5\n5, 4\n",
    "graph_indicator": "1\n1\n1\n2\n2\n",
    "graph_labels": "-1\n1\n",
    "node_labels": "0\n2\n1\n0\n0\n",
    "node_attributes": "0.5, 1.0\n1.5, 2.0\n2.5, 3.0\n3.5, 4.0\n4.5, 5.0\n",
    "edge_labels": "1\n1\n0\n0\n1\n1\n0\n1\n0\n0\n",
}


def write_tu(folder: Path, name: str = "TOY", parts: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for part, text in (parts or TOY).items():
        (folder / f"{name}_{part}.txt").write_text(text)
    return folder


def test_tudataset_reads_like_pyg_by_hand(tmp_path):
    graphs = load_tudataset(write_tu(tmp_path / "TOY" / "raw"), "TOY")
    assert len(graphs) == 2
    g0, g1 = graphs
    np.testing.assert_array_equal(g0.edge_index, [[0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]])  # loop gone, coalesced
    np.testing.assert_array_equal(g1.edge_index, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(g0.x, [[1, 0, 0], [0, 0, 1], [0, 1, 0]])  # one-hot node labels
    assert g0.y.tolist() == [0] and g1.y.tolist() == [1]                    # -1, 1 renumbered 0, 1
    assert g0.edge_attr.shape == (6, 2)                                     # one-hot edge labels
    with_attr = load_tudataset(tmp_path, "TOY", use_node_attr=True)
    np.testing.assert_array_equal(with_attr[1].x[:, :2], [[3.5, 4.0], [4.5, 5.0]])
    b = collate(graphs)  # the graphs batch
    assert b.num_graphs == 2 and b.y.tolist() == [0, 1]


def test_tudataset_without_node_labels_gets_constant_features(tmp_path):
    parts = {k: v for k, v in TOY.items() if k not in ("node_labels", "node_attributes", "edge_labels")}
    graphs = load_tudataset(write_tu(tmp_path), None)  # name found from the only *_A.txt
    assert graphs[0].x.shape == (3, 3)
    plain = load_tudataset(write_tu(tmp_path / "plain", "P", parts))
    np.testing.assert_array_equal(plain[0].x, np.ones((3, 1)))
    assert plain[0].edge_attr is None


@pytest.mark.skipif(torch is None, reason="torch_geometric not installed (optional baseline)")
def test_tudataset_matches_pyg(tmp_path):
    write_tu(tmp_path / "TOY" / "raw")
    theirs = PygTU(str(tmp_path), "TOY")
    ours = load_tudataset(tmp_path, "TOY")
    assert len(theirs) == len(ours)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.x, b.x.numpy())
        np.testing.assert_array_equal(a.edge_index, b.edge_index.numpy())
        np.testing.assert_array_equal(a.y, b.y.numpy())
        np.testing.assert_array_equal(a.edge_attr, b.edge_attr.numpy())


@pytest.mark.parametrize("part, text, match", [
    ("A", "1, 2\n2\n", "line 2: 1 fields"),
    ("A", "1, 2\n2, x\n", "line 2: 'x' is not an integer"),
    ("A", "1, 2.5\n", "'2.5' is not an integer"),
    ("A", "1, 9\n", r"\[1, 5\]"),
    ("A", "1, 4\n", "between graphs 1 and 2"),
    ("graph_indicator", "1\n1\n2\n1\n2\n", "never decrease"),
    ("graph_indicator", "1\n1\n1\n3\n3\n", "skip"),
    ("graph_labels", "1\n", "1 graph labels for 2 graphs"),
    ("node_labels", "0\n1\n", "2 rows, expected 5"),
    ("node_attributes", "0.5, nan\n" * 5, "non-finite"),
])
def test_tudataset_hostile_files(tmp_path, part, text, match):
    write_tu(tmp_path, parts={**TOY, part: text})
    with pytest.raises(DataError, match=match):
        load_tudataset(tmp_path, "TOY", use_node_attr=True)


def test_tudataset_missing_files(tmp_path):
    with pytest.raises(DataError, match="no TUDataset"):
        load_tudataset(tmp_path, "TOY")
    write_tu(tmp_path, parts={k: v for k, v in TOY.items() if k != "graph_indicator"})
    with pytest.raises(DataError, match="graph_indicator.txt: file not found"):
        load_tudataset(tmp_path, "TOY")
    (tmp_path / "TOY_graph_indicator.txt").write_bytes(b"\xff\xfe1\n")
    with pytest.raises(DataError, match="not UTF-8"):
        load_tudataset(tmp_path, "TOY")


# -- OGB -------------------------------------------------------------------------------------------

def gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write(text)


def write_ogb(root: Path, short: str = "arxiv", **override: str) -> Path:
    folder = root / f"ogbn_{short}"
    files = {
        "raw/edge.csv.gz": "0,1\n1,2\n3,0\n",
        "raw/num-node-list.csv.gz": "4\n",
        "raw/num-edge-list.csv.gz": "3\n",
        "raw/node-feat.csv.gz": "0.1,0.2\n0.3,0.4\n0.5,0.6\n0.7,0.8\n",
        "raw/node-label.csv.gz": "1\n0\n2\nnan\n",
        "split/time/train.csv.gz": "0\n1\n",
        "split/time/valid.csv.gz": "2\n",
        "split/time/test.csv.gz": "3\n",
    }
    files.update({k.replace("__", "/").replace("_csv_gz", ".csv.gz"): v for k, v in override.items()})
    for rel, text in files.items():
        if text is not None:
            gz(folder / rel, text)
    return folder


def test_ogb_node_reader(tmp_path):
    write_ogb(tmp_path)
    d = load_ogb_node(tmp_path, "ogbn-arxiv")
    np.testing.assert_array_equal(d.edge_index, [[0, 1, 3], [1, 2, 0]])  # arxiv: no inverse edges (OGB)
    np.testing.assert_allclose(d.x, [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]], rtol=1e-6)
    assert d.x.dtype == np.float32 and d.y.tolist() == [1, 0, 2, -1]
    assert d.train_mask.tolist() == [True, True, False, False] and d.test_mask.tolist() == [False] * 3 + [True]
    assert d.split_idx["valid"].tolist() == [2] and d.num_nodes == 4
    both = load_ogb_node(tmp_path, "ogbn-arxiv", add_inverse_edge=True)
    assert both.edge_index.shape == (2, 6)
    write_ogb(tmp_path, "products")
    assert load_ogb_node(tmp_path, "ogbn-products").edge_index.shape == (2, 6)  # OGB: products adds them


@pytest.mark.parametrize("override, match", [
    ({"raw__edge_csv_gz": "0,1\n1,9\n"}, r"\[0, 4\)"),
    ({"raw__edge_csv_gz": "0,1\n1\n"}, "line 2: 1 fields"),
    ({"raw__num-edge-list_csv_gz": "5\n"}, "num-edge-list says"),
    ({"raw__node-feat_csv_gz": "0.1,0.2\n"}, "1 rows for 4 nodes"),
    ({"raw__node-label_csv_gz": "1\n0.5\n2\n0\n"}, "non-negative integers"),
    ({"split__time__test_csv_gz": "7\n"}, "outside"),
    ({"raw__num-node-list_csv_gz": "4\n5\n"}, "2 graphs"),
])
def test_ogb_hostile_files(tmp_path, override, match):
    write_ogb(tmp_path, **override)
    with pytest.raises(DataError, match=match):
        load_ogb_node(tmp_path, "ogbn-arxiv")


def test_ogb_truncated_gzip_and_missing(tmp_path):
    with pytest.raises(DataError, match="no OGB node dataset"):
        load_ogb_node(tmp_path, "ogbn-arxiv")
    folder = write_ogb(tmp_path)
    data = (folder / "raw" / "node-feat.csv.gz").read_bytes()
    (folder / "raw" / "node-feat.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated"):
        load_ogb_node(tmp_path, "ogbn-arxiv")
    (folder / "raw" / "num-node-list.csv.gz").unlink()
    with pytest.raises(DataError, match="num-node-list.csv.gz not found"):
        load_ogb_node(tmp_path, "ogbn-arxiv")


def test_read_table_plain(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("1, 2\n\n3, 4\n")
    np.testing.assert_array_equal(read_table(p, np.int64, 2), [[1, 2], [3, 4]])
    p.write_text("99999999999999999999, 1\n")
    with pytest.raises(DataError, match="not an integer"):
        read_table(p, np.int64)
    p.write_text("")
    assert read_table(p, np.float32, 3).shape == (0, 3)


def write_graphs_as_tu(folder: Path, graphs, name: str = "FAM") -> Path:
    """Generated graphs in the TU raw format (1-based ids, one indicator line per node)."""
    folder.mkdir(parents=True, exist_ok=True)
    edges, indicator, labels, offset = [], [], [], 0
    for k, g in enumerate(graphs):
        edges += [f"{a + offset + 1}, {b + offset + 1}" for a, b in g.edge_index.T]
        indicator += [str(k + 1)] * g.num_nodes
        labels.append(str(g.y))
        offset += g.num_nodes
    for part, lines in (("A", edges), ("graph_indicator", indicator), ("graph_labels", labels)):
        (folder / f"{name}_{part}.txt").write_text("\n".join(lines) + "\n")
    return folder


def test_gin_demo_reads_a_tudataset_folder(tmp_path, capsys):
    import json

    from polygrad.apps.cli import main
    from polygrad.data import random_graph_families

    graphs = random_graph_families(40, seed=0)
    folder = write_graphs_as_tu(tmp_path / "FAM", graphs)
    read = load_tudataset(folder)
    assert [int(g.y[0]) for g in read] == [g.y for g in graphs]
    for a, b in zip(read, graphs):
        np.testing.assert_array_equal(a.edge_index, coalesce(b.edge_index, num_nodes=b.num_nodes))  # sorted, as PyG
    assert main(["demo", "gin", "--data", str(folder), "--epochs", "2", "--no-progress", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["dataset"] == "TUDataset FAM" and out["num_graphs"] == 40 and out["chance_accuracy"] == 0.5
    assert main(["demo", "gin", "--data", str(tmp_path / "nothing"), "--epochs", "1", "--no-progress"]) == 1
    assert "no TUDataset" in capsys.readouterr().err


def _zip(path: Path, members: dict) -> str:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path.as_uri()


def test_download_unpacks_a_zip_and_refuses_escapes(tmp_path):
    from polygrad.data import download_tudataset
    from polygrad.data._files import download_zip

    src = tmp_path / "src"
    src.mkdir()
    members = {f"TOY/TOY_{part}.txt": text for part, text in TOY.items()}
    _zip(src / "TOY.zip", members)
    root = tmp_path / "root"
    folder = download_tudataset("TOY", root, base_url=src.as_uri())
    assert folder == root / "TOY" and len(load_tudataset(root, "TOY")) == 2
    ogb = {f"arxiv/raw/{n}": gzip.compress(t.encode()) for n, t in (("edge.csv.gz", "0,1\n"),
                                                                     ("num-node-list.csv.gz", "2\n"))}
    _zip(src / "arxiv.zip", ogb)
    from polygrad.data import download_ogb_node
    assert download_ogb_node("ogbn-arxiv", root, base_url=src.as_uri()) == root / "arxiv"
    assert load_ogb_node(root, "ogbn-arxiv").edge_index.tolist() == [[0], [1]]
    evil = _zip(src / "EVIL.zip", {"EVIL/../../escaped.txt": "x"})
    with pytest.raises(DataError, match="outside"):
        download_zip(evil, tmp_path / "r2", "EVIL")
    assert not (tmp_path / "escaped.txt").exists()
    (src / "BAD.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="not a readable zip"):
        download_zip((src / "BAD.zip").as_uri(), tmp_path / "r3", "BAD")
    with pytest.raises(DataError, match="could not download"):
        download_zip((src / "MISSING.zip").as_uri(), tmp_path / "r4", "MISSING")
    with pytest.raises(DataError, match="holds no"):
        download_zip((src / "TOY.zip").as_uri(), tmp_path / "r5", "OTHER")
