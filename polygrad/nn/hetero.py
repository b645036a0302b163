"""``HeteroConv``: one graph layer per edge type of a heterogeneous graph, PyG's signature.

It takes plain dictionaries -- ``x_dict`` ``{node type: features}``, ``edge_index_dict``
``{(src, relation, dst): edge_index}`` and any ``<name>_dict`` -- so it works with any
``HeteroData``-like object (``conv(data.x_dict, data.edge_index_dict)``) and with none.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

from polygrad.ir.errors import ShapeError
from polygrad.tensor import Tensor, concat, stack

from .module import Module

__all__ = ["HeteroConv", "EdgeTypeDict", "group"]

EdgeType = tuple[str, str, str]


def internal_key(key: Any) -> str:
    """PyG's ``ModuleDict`` key for an edge type: ``("a", "to", "b")`` -> ``"<a___to___b>"``."""
    if isinstance(key, tuple):
        key = f"<{'___'.join(key)}>"
    if not isinstance(key, str):
        raise TypeError(f"HeteroConv: an edge type must be a (src, relation, dst) tuple, got {key!r}")
    return key.replace(".", "#")


class EdgeTypeDict(dict):
    """Modules keyed by PyG's internal strings (so parameters are discovered and state-dict keys
    are PyG's, ``convs.<a___to___b>.lin.weight``), also looked up by ``(src, rel, dst)`` tuples."""

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(internal_key(key))

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, (str, tuple)) and super().__contains__(internal_key(key))


def group(xs: list[Tensor], aggr: str | None) -> Tensor | None:
    """PyG's ``HeteroConv`` grouping of the outputs for one destination type: None -> stacked
    ``[N, R, F]``; "cat" -> concatenated features; "sum", "mean", "max", "min" -> reduced."""
    if not xs:
        return None
    if aggr is None:
        return stack(xs, 1)
    if len(xs) == 1:
        return xs[0]
    if aggr == "cat":
        return concat(xs, -1)
    out = stack(xs, 0)
    return getattr(out, aggr)(0)


class HeteroConv(Module):
    """PyG's ``HeteroConv``: ``convs`` maps each edge type ``(src, relation, dst)`` to a layer;
    each layer runs on its edge type and the outputs per destination type are combined by
    ``aggr`` ("sum" default, "mean", "max", "min", "cat" or None to stack them).

    ``forward(x_dict, edge_index_dict, *more_dicts, **name_dicts)``: as PyG, every dictionary
    is looked up per edge type -- an entry for the edge type itself, else the node features of
    ``src`` (when ``src == dst``), else the pair ``(value[src], value[dst])`` -- and keyword
    dictionaries must be named ``<argument>_dict`` (``edge_attr_dict=`` becomes ``edge_attr=``).
    An edge type with no edge-level entry (no ``edge_index``) is skipped.  Layers on two node
    types take the pair ``(x_src, x_dst)``: GraphConv, GINEConv, NNConv do.
    """

    def __init__(self, convs: Mapping[EdgeType, Module], aggr: str | None = "sum"):
        if aggr not in (None, "sum", "mean", "max", "min", "cat"):
            raise ValueError(f"HeteroConv: aggr must be 'sum', 'mean', 'max', 'min', 'cat' or None, got {aggr!r}")
        for key in convs:
            if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key)):
                raise TypeError(f"HeteroConv: edge types must be (src, relation, dst) string tuples, got {key!r}")
        src_types, dst_types = {k[0] for k in convs}, {k[-1] for k in convs}
        if src_types - dst_types:
            warnings.warn(f"There exist node types ({src_types - dst_types}) whose representations do not get "
                          "updated during message passing as they do not occur as destination type in any edge "
                          "type. This may lead to unexpected behavior.", stacklevel=2)
        self.edge_types: list[EdgeType] = list(convs)
        self.convs = EdgeTypeDict((internal_key(k), m) for k, m in convs.items())
        self.aggr = aggr

    def forward(self, *args_dict: Mapping[Any, Any], **kwargs_dict: Mapping[Any, Any]) -> dict[str, Tensor]:
        out_dict: dict[str, list[Tensor]] = {}
        for edge_type in self.edge_types:
            src, _, dst = edge_type
            has_edge_level_arg = False
            args = []
            for value_dict in args_dict:
                if edge_type in value_dict:
                    has_edge_level_arg = True
                    args.append(value_dict[edge_type])
                elif src == dst and src in value_dict:
                    args.append(value_dict[src])
                elif src in value_dict or dst in value_dict:
                    args.append((value_dict.get(src), value_dict.get(dst)))
            kwargs = {}
            for arg, value_dict in kwargs_dict.items():
                if not arg.endswith("_dict"):
                    raise ShapeError(f"HeteroConv: keyword arguments need to end with '_dict' (got {arg!r})")
                name = arg[:-5]
                if edge_type in value_dict:
                    has_edge_level_arg = True
                    kwargs[name] = value_dict[edge_type]
                elif src == dst and src in value_dict:
                    kwargs[name] = value_dict[src]
                elif src in value_dict or dst in value_dict:
                    kwargs[name] = (value_dict.get(src), value_dict.get(dst))
            if not has_edge_level_arg:
                continue
            out_dict.setdefault(dst, []).append(self.convs[edge_type](*args, **kwargs))
        return {key: group(value, self.aggr) for key, value in out_dict.items()}  # type: ignore[misc]

    def extra_repr(self) -> str:
        return f"num_relations={len(self.edge_types)}, aggr={self.aggr!r}"
