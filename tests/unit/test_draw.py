"""pg.draw_graph: nodes label op, shape, dtype, layout and backend; graphviz optional."""
from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

import polygrad as pg
from polygrad.tensor.draw import graph_spec, save_graph
from polygrad.errors import PolygradError
from polygrad.tensor import spmm
from polygrad.testing.cases import sample_pattern


def small_graph():
    p = sample_pattern()
    w = pg.tensor(np.ones((3, 2)), requires_grad=True)
    w.name = "W"
    x = pg.tensor(np.ones((5, 3)))
    v = pg.tensor(np.ones(p.nnz))
    return (spmm(v, x @ w, p).relu() * 2.0).sum()


def test_graph_spec_nodes_and_edges():
    spec = graph_spec(small_graph())
    ops = {n.attrs["op"]: n for n in spec.nodes if n.kind == "op"}
    assert set(ops) == {"sum", "mul", "relu", "spmm", "matmul"}
    assert ops["spmm"].attrs["layout"] == "csr" and "nnz=7" in ops["spmm"].label
    assert "csr @ numpy" in ops["spmm"].label and "[4, 2] float64" in ops["spmm"].label
    assert "dense @ numpy" in ops["matmul"].label
    leaves = [n for n in spec.nodes if n.kind == "leaf"]
    assert len(leaves) == 4                    # W, x, the spmm values, the constant 2.0
    (w,) = [n for n in leaves if n.label.startswith("W\n")]
    assert "requires_grad" in w.label and w.attrs["shape"] == (3, 2)
    ids = {n.id for n in spec.nodes}
    assert len(spec.edges) == 8 and all(a in ids and b in ids for a, b in spec.edges)
    assert not spec.truncated


def test_freed_nodes_after_backward_and_retain_graph():
    out = small_graph()
    out.backward(retain_graph=True)
    assert all(n.kind != "freed" for n in graph_spec(out).nodes)
    out = small_graph()
    out.backward()
    kinds = [n.kind for n in graph_spec(out).nodes]
    assert kinds[0] == "freed" and "freed by backward" in graph_spec(out).nodes[0].label


def test_long_chain_is_walked_iteratively_and_truncated():
    x = pg.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(3000):
        y = y + 1.0
    spec = graph_spec(y, max_nodes=100_000)
    assert len([n for n in spec.nodes if n.kind == "op"]) == 3000 and not spec.truncated
    assert graph_spec(y, max_nodes=50).truncated


def test_not_a_tensor():
    with pytest.raises(PolygradError, match="needs a polygrad Tensor"):
        graph_spec(np.ones(3))


def test_missing_graphviz_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)   # import graphviz -> ImportError
    with pytest.raises(ImportError, match="pip install graphviz"):
        pg.draw_graph(small_graph())


def test_draw_graph_returns_digraph_and_saves_dot(tmp_path):
    graphviz = pytest.importorskip("graphviz", reason="graphviz (polygrad-core[viz]) not installed")
    dot = pg.draw_graph(small_graph())
    assert isinstance(dot, graphviz.Digraph)
    src = dot.source
    assert "spmm nnz=7" in src and "csr @ numpy" in src and "rankdir=BT" in src
    path = save_graph(small_graph(), tmp_path / "g.gv")
    assert open(path).read().startswith("digraph polygrad")


def test_save_graph_svg_needs_dot_program(tmp_path):
    pytest.importorskip("graphviz", reason="graphviz (polygrad-core[viz]) not installed")
    target = tmp_path / "g.svg"
    if shutil.which("dot") is None:
        with pytest.raises(PolygradError, match="`dot` program is not installed"):
            save_graph(small_graph(), target)
    else:
        save_graph(small_graph(), target)
        assert target.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_gv_text_needs_no_graphviz_package(monkeypatch, tmp_path):
    import sys

    from polygrad.tensor.draw import save_graph
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz -> ImportError
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    x.name = 'x "quoted"'
    path = save_graph((x.exp() * 2).sum(), tmp_path / "g.gv")
    text = open(path).read()
    assert text.startswith("digraph polygrad {") and text.rstrip().endswith("}")
    assert 'label="x \\"quoted\\"\\nleaf [2] float32' in text
    assert text.count(" -> ") == 4 and "exp" in text and "sum" in text
