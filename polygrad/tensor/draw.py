"""Draw the recorded autodiff graph of a tensor with graphviz.

::

    loss = model(x).sum()
    pg.draw_graph(loss).render(outfile="graph.svg")     # needs graphviz's `dot` program
    pg.draw_graph(loss).source                           # DOT text, needs only the Python package
    save_graph(loss, "graph.svg")                        # .svg/.png/.pdf via dot, .gv/.dot as text

Each op node shows the op, output shape, dtype, layout and backend (and nnz for sparse ops);
each leaf shows its shape, dtype, backend and whether it requires grad (and ``t.name`` when set).
Draw before ``backward()`` (or pass ``retain_graph=True`` to it): backward frees the nodes it
consumed, and a freed node is drawn without its inputs.

graphviz is optional (``pip install polygrad-core[viz]``); :func:`graph_spec` needs nothing and gives
the same nodes and edges as plain data.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..ir.errors import PolygradError
from .tensor_class import Tensor

_INSTALL = "pip install graphviz (or pip install 'polygrad-core[viz]')"


@dataclass
class GraphNode:
    id: str
    kind: str                 # "op", "leaf" (a tensor without a node) or "freed" (consumed by backward)
    label: str
    attrs: dict = field(default_factory=dict)


@dataclass
class GraphSpec:
    """The drawable graph: nodes, edges (input id -> consumer id), whether it was truncated."""
    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)
    truncated: bool = False


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _describe_tensor(t: Any) -> dict:
    return {"shape": tuple(t.shape), "dtype": str(t.dtype), "backend": t.backend,
            "layout": getattr(t, "layout", "dense"), "requires_grad": bool(t.requires_grad)}


def graph_spec(tensor: Any, max_nodes: int = 1000) -> GraphSpec:
    """Walk ``tensor``'s recorded graph (iteratively) and describe every node and edge.

    Follows every input, not only those needing gradients, so constants appear as leaves.
    At most ``max_nodes`` nodes are described (``truncated`` says when the walk stopped early).
    """
    if not isinstance(tensor, Tensor):
        raise PolygradError(f"draw_graph needs a polygrad Tensor, got {type(tensor).__name__}")
    spec = GraphSpec()
    seen: dict[int, str] = {}
    stack = [tensor]
    keep_alive = []  # ids are only unique while the tensors live
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        if len(seen) >= max_nodes:
            spec.truncated = True
            break
        nid = f"t{len(seen)}"
        seen[id(t)] = nid
        keep_alive.append(t)
        info = _describe_tensor(t)
        node = t._node
        name = f"{t.name}\n" if getattr(t, "name", None) else ""
        if node is None:
            grad = " requires_grad" if info["requires_grad"] else ""
            label = f"{name}leaf {_shape(t.shape)} {info['dtype']}\n{info['layout']} @ {info['backend']}{grad}"
            spec.nodes.append(GraphNode(nid, "leaf", label, info))
            continue
        info.update(op=node.op.value, layout=node.layout, backend=node.backend.name)
        pattern = node.attrs.get("pattern") if node.attrs else None
        extra = f" nnz={pattern.nnz}" if pattern is not None else ""
        if node.inputs is None:
            label = f"{name}{node.op.value} (freed by backward)\n{_shape(t.shape)} {info['dtype']}"
            spec.nodes.append(GraphNode(nid, "freed", label, info))
            continue
        label = f"{name}{node.op.value}{extra}\n{_shape(t.shape)} {info['dtype']}\n{node.layout} @ {node.backend.name}"
        spec.nodes.append(GraphNode(nid, "op", label, info))
        for inp in node.inputs:
            stack.append(inp)
    # edges once every id is known (inputs may have been reached through another path)
    for t in keep_alive:
        node = t._node
        if node is None or node.inputs is None:
            continue
        for inp in node.inputs:
            if id(inp) in seen:
                spec.edges.append((seen[id(inp)], seen[id(t)]))
    return spec


_STYLE = {"op": {"shape": "box", "style": "rounded,filled", "fillcolor": "#dbe9f6"},
          "leaf": {"shape": "ellipse", "style": "filled", "fillcolor": "#f2f2f2"},
          "freed": {"shape": "box", "style": "dashed"}}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dot_source(spec: GraphSpec, max_nodes: int = 1000, rankdir: str = "BT") -> str:
    """DOT text of a :class:`GraphSpec` (what ``draw_graph(t).source`` holds, without graphviz)."""
    lines = ["digraph polygrad {", f"\tgraph [rankdir={rankdir}]", "\tnode [fontname=Helvetica fontsize=10]"]
    for n in spec.nodes:
        style = " ".join(f"{k}={_quote(v)}" for k, v in _STYLE[n.kind].items())
        lines.append(f"\t{n.id} [label={_quote(n.label)} {style}]")
    lines.extend(f"\t{a} -> {b}" for a, b in spec.edges)
    if spec.truncated:
        lines.append(f"\ttruncated [label={_quote(f'... more than {max_nodes} nodes')} shape=plaintext]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_graph(tensor: Any, max_nodes: int = 1000, rankdir: str = "BT", format: str = "svg") -> Any:
    """A ``graphviz.Digraph`` of ``tensor``'s graph (inputs point to the ops that consume them).

    Render it with ``.render(outfile="graph.svg")`` (needs the ``dot`` program), get DOT text
    from ``.source``, or display it inline in Jupyter.  Raises ImportError naming the install
    command when the graphviz package is missing.
    """
    try:
        import graphviz
    except ImportError as exc:
        raise ImportError(f"pg.draw_graph needs the graphviz Python package: {_INSTALL}") from exc
    spec = graph_spec(tensor, max_nodes)
    dot = graphviz.Digraph("polygrad", format=format, graph_attr={"rankdir": rankdir},
                           node_attr={"fontname": "Helvetica", "fontsize": "10"})
    for n in spec.nodes:
        dot.node(n.id, n.label, **_STYLE[n.kind])
    for a, b in spec.edges:
        dot.edge(a, b)
    if spec.truncated:
        dot.node("truncated", f"... more than {max_nodes} nodes", shape="plaintext")
    return dot


def save_graph(tensor: Any, path: str | os.PathLike, max_nodes: int = 1000) -> str:
    """Write ``tensor``'s graph to ``path``: ``.gv``/``.dot`` as DOT text, other suffixes via ``dot``.

    Returns the path written.  Rendering an image needs graphviz's ``dot`` program; when it is
    missing this raises a PolygradError that says so and suggests a ``.gv`` path instead.
    """
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix in ("gv", "dot"):  # DOT text needs no graphviz at all
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(dot_source(graph_spec(tensor, max_nodes), max_nodes))
        return path
    dot = draw_graph(tensor, max_nodes)
    import graphviz
    try:
        dot.render(outfile=path, format=suffix or "svg", cleanup=True)
    except graphviz.ExecutableNotFound as exc:
        raise PolygradError(f"cannot render {path}: graphviz's `dot` program is not installed "
                            f"(apt-get install graphviz / brew install graphviz), or save as .gv: {exc}") from exc
    return path
