"""Graph containers with PyG's names: :class:`Data` (one graph) and :class:`HeteroData` (node and
edge stores by type).

``Data`` holds named attributes like PyG's ``torch_geometric.data.Data``: ``x``, ``edge_index``,
``edge_attr``, ``y``, masks and any extra attribute a user sets (``data.foo = ...``), read as
attributes or by key (``data["x"]``).  Values stay numpy arrays (host memory), as everything in
:mod:`polygrad.data`; :meth:`Data.to` turns the feature arrays into polygrad tensors on a backend.
"""
from __future__ import annotations

import copy
from typing import Any, Iterator

import numpy as np

from ..ir.errors import DataError
from ..sparse import sparse_csr
from ..tensor import Tensor, tensor
from .csr import CSRMatrix

__all__ = ["Data", "HeteroData"]


def _size(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return str(list(shape))
    if isinstance(value, (list, tuple)):
        return f"[{len(value)}]"
    return repr(value)


class Data:
    """One graph: ``Data(x=..., edge_index=..., edge_attr=..., y=..., **extra)``.

    ``num_nodes`` is the value set explicitly (``Data(num_nodes=5)``), else the rows of ``x``,
    else ``edge_index.max() + 1`` (PyG's inference order).  Absent attributes read as ``None``
    (as PyG: ``data.edge_attr is None``).
    """

    def __init__(self, x: Any = None, edge_index: Any = None, edge_attr: Any = None, y: Any = None,
                 **kwargs: Any) -> None:
        object.__setattr__(self, "_store", {})
        for key, value in (("x", x), ("edge_index", edge_index), ("edge_attr", edge_attr), ("y", y),
                           *kwargs.items()):
            if value is not None:
                self[key] = value

    @classmethod
    def from_dataset(cls, ds: Any) -> "Data":
        """A :class:`~polygrad.data.GraphDataset` (what ``load_planetoid`` returns) as a ``Data``:
        ``x`` (CSRMatrix), ``edge_index``, ``y`` and the three masks, as PyG's ``Planetoid()[0]``."""
        return cls(x=ds.x, edge_index=ds.edge_index, y=ds.y, train_mask=ds.train_mask, val_mask=ds.val_mask,
                   test_mask=ds.test_mask, num_nodes=ds.num_nodes)

    # -- attribute access ------------------------------------------------------------------------
    def __getattr__(self, key: str) -> Any:
        store = self.__dict__.get("_store")
        if key.startswith("__") or store is None:  # dunder lookups, and copy/pickle before _store exists
            raise AttributeError(key)
        return store.get(key)

    def __setattr__(self, key: str, value: Any) -> None:
        if isinstance(getattr(type(self), key, None), property):
            object.__setattr__(self, key, value)  # num_nodes' setter
        else:
            self[key] = value

    def __delattr__(self, key: str) -> None:
        self._store.pop(key, None)

    def __getitem__(self, key: str) -> Any:
        return self._store.get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "num_nodes":
            self.num_nodes = value
            return
        if key == "edge_index" and value is not None:
            value = _edge_index(value, "Data")
        if value is None:
            self._store.pop(key, None)
        else:
            self._store[key] = value

    def __delitem__(self, key: str) -> None:
        self._store.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._store

    def keys(self) -> list[str]:
        return [k for k in self._store if k != "_num_nodes"]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self._store[k]) for k in self.keys()]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self.keys())

    def __copy__(self) -> "Data":
        out = type(self).__new__(type(self))
        object.__setattr__(out, "_store", dict(self._store))
        return out

    def clone(self) -> "Data":
        """A deep copy (arrays copied)."""
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={_size(v)}" for k, v in self.items())
        return f"{type(self).__name__}({parts})"

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int | None:
        if "_num_nodes" in self._store:
            return int(self._store["_num_nodes"])
        x = self._store.get("x")
        if x is not None and getattr(x, "ndim", 0) >= 1:
            return int(x.shape[0])
        ei = self._store.get("edge_index")
        if ei is not None:
            return int(ei.max()) + 1 if ei.size else 0
        return None

    @num_nodes.setter
    def num_nodes(self, value: Any) -> None:
        if value is None:
            self._store.pop("_num_nodes", None)
            return
        if int(value) != value or value < 0:
            raise DataError(f"Data: num_nodes must be a non-negative integer, got {value!r}")
        self._store["_num_nodes"] = int(value)

    @property
    def num_edges(self) -> int:
        ei = self._store.get("edge_index")
        return 0 if ei is None else int(ei.shape[1])

    @property
    def num_node_features(self) -> int:
        x = self._store.get("x")
        return 0 if x is None else (1 if x.ndim == 1 else int(x.shape[1]))

    num_features = num_node_features

    @property
    def num_edge_features(self) -> int:
        a = self._store.get("edge_attr")
        return 0 if a is None else (1 if a.ndim == 1 else int(a.shape[1]))

    def is_edge_attr(self, key: str) -> bool:
        """Whether ``key`` holds one row per edge (PyG's rule: the size fits, and ``"edge"`` is in
        the name when the node and edge counts would both fit)."""
        value = self._store.get(key)
        if key == "edge_index" or value is None or getattr(value, "ndim", 0) < 1:
            return False
        if value.shape[0] != self.num_edges:
            return False
        return "edge" in key or value.shape[0] != self.num_nodes

    def is_node_attr(self, key: str) -> bool:
        value = self._store.get(key)
        if key == "edge_index" or value is None or getattr(value, "ndim", 0) < 1:
            return False
        return value.shape[0] == self.num_nodes and not self.is_edge_attr(key)

    def has_isolated_nodes(self) -> bool:
        ei = self._store.get("edge_index")
        n = self.num_nodes or 0
        if ei is None:
            return n > 0
        return bool(np.unique(ei).shape[0] < n)

    def has_self_loops(self) -> bool:
        ei = self._store.get("edge_index")
        return ei is not None and bool((ei[0] == ei[1]).any())

    def validate(self) -> bool:
        """Raise :class:`DataError` unless ``edge_index`` refers to nodes in ``[0, num_nodes)``
        and every edge attribute has one row per edge."""
        ei = self._store.get("edge_index")
        n = self.num_nodes
        if ei is not None and ei.size and n is not None and (ei.min() < 0 or ei.max() >= n):
            raise DataError(f"Data: edge_index refers to nodes outside [0, {n}) "
                            f"(range [{int(ei.min())}, {int(ei.max())}])")
        attr = self._store.get("edge_attr")
        if attr is not None and ei is not None and np.shape(attr)[0] != ei.shape[1]:
            raise DataError(f"Data: edge_attr has {np.shape(attr)[0]} rows for {ei.shape[1]} edges")
        return True

    # -- moving ----------------------------------------------------------------------------------
    def to(self, backend: Any) -> "Data":
        """A copy whose float arrays (``x``, ``edge_attr``, ...) are polygrad tensors on ``backend``
        (a :class:`CSRMatrix` ``x`` becomes a sparse CSR tensor); integer and bool arrays (indices,
        labels, masks) stay numpy, since polygrad reads graph structure and labels on the host.
        Tensors already there move with ``Tensor.to``."""
        out = copy.copy(self)
        for key, value in self.items():
            out._store[key] = _to_backend(value, backend)
        return out


def _to_backend(value: Any, backend: Any) -> Any:
    if isinstance(value, Tensor):
        return value.to(backend)
    if isinstance(value, CSRMatrix):
        return sparse_csr(value.indptr, value.indices, value.data, value.shape, backend=backend)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return tensor(value, backend=backend)
    return value


def _edge_index(value: Any, where: str) -> Any:
    if isinstance(value, Tensor):
        value = value.numpy()
    ei = np.asarray(value)
    if ei.size == 0:
        return ei.reshape(2, 0).astype(np.int64)
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype.kind not in "iu":
        raise DataError(f"{where}: edge_index must be an integer array [2, E], got {ei.dtype} {ei.shape}")
    if ei.min() < 0:
        raise DataError(f"{where}: edge_index holds a negative node id ({int(ei.min())})")
    return ei.astype(np.int64, copy=False)


class _Store(Data):
    """The attributes of one node type or one edge type of a :class:`HeteroData`."""


class HeteroData:
    """A heterogeneous graph (PyG's ``HeteroData``): node stores by type (``data["paper"].x``)
    and edge stores by ``(src_type, relation, dst_type)`` (``data["paper", "cites",
    "paper"].edge_index``).  ``x_dict`` / ``edge_index_dict`` give the plain dicts a
    ``HeteroConv`` takes."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Store] = {}
        self._edges: dict[tuple[str, str, str], _Store] = {}

    def _edge_key(self, key: Any) -> tuple[str, str, str] | None:
        if isinstance(key, tuple):
            if len(key) == 3:
                return (str(key[0]), str(key[1]), str(key[2]))
            if len(key) == 2:  # (src, dst) when exactly one relation joins them, as PyG
                found = [k for k in self._edges if k[0] == key[0] and k[2] == key[1]]
                if len(found) == 1:
                    return found[0]
                if not found:
                    return (str(key[0]), "to", str(key[1]))
                raise DataError(f"HeteroData: {key} is ambiguous, relations {[k[1] for k in found]}")
            raise DataError(f"HeteroData: an edge type is (src, relation, dst), got {key!r}")
        return None

    def __getitem__(self, key: Any) -> _Store:
        edge = self._edge_key(key)
        if edge is not None:
            return self._edges.setdefault(edge, _Store())
        if not isinstance(key, str):
            raise DataError(f"HeteroData: a node type is a string, got {key!r}")
        return self._nodes.setdefault(key, _Store())

    def __contains__(self, key: Any) -> bool:
        edge = self._edge_key(key)
        return edge in self._edges if edge is not None else key in self._nodes

    @property
    def node_types(self) -> list[str]:
        return list(self._nodes)

    @property
    def edge_types(self) -> list[tuple[str, str, str]]:
        return list(self._edges)

    def metadata(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        return self.node_types, self.edge_types

    def collect(self, key: str, edges: bool = False) -> dict[Any, Any]:
        """``{type: store[key]}`` over the stores that have ``key`` (PyG's ``collect``)."""
        stores: dict[Any, _Store] = dict(self._edges) if edges else dict(self._nodes)
        return {t: s[key] for t, s in stores.items() if key in s}

    @property
    def x_dict(self) -> dict[str, Any]:
        return self.collect("x")

    @property
    def y_dict(self) -> dict[str, Any]:
        return self.collect("y")

    @property
    def edge_index_dict(self) -> dict[tuple[str, str, str], Any]:
        return self.collect("edge_index", edges=True)

    @property
    def edge_attr_dict(self) -> dict[tuple[str, str, str], Any]:
        return self.collect("edge_attr", edges=True)

    @property
    def num_nodes_dict(self) -> dict[str, int | None]:
        return {t: s.num_nodes for t, s in self._nodes.items()}

    @property
    def num_nodes(self) -> int:
        return int(sum(n or 0 for n in self.num_nodes_dict.values()))

    @property
    def num_edges(self) -> int:
        return int(sum(s.num_edges for s in self._edges.values()))

    def validate(self) -> bool:
        """Each edge type's ``edge_index`` must refer to nodes of its source and destination types."""
        for (src, rel, dst), store in self._edges.items():
            ei = store.edge_index
            if ei is None or not ei.size:
                continue
            for row, ntype in ((0, src), (1, dst)):
                n = self._nodes[ntype].num_nodes if ntype in self._nodes else None
                if n is None:
                    raise DataError(f"HeteroData: edge type ({src}, {rel}, {dst}) refers to node type "
                                    f"{ntype!r}, which has no nodes")
                if ei[row].max() >= n:
                    raise DataError(f"HeteroData: edge type ({src}, {rel}, {dst}) row {row} refers to "
                                    f"{ntype} node {int(ei[row].max())} of {n}")
        return True

    def to(self, backend: Any) -> "HeteroData":
        out = HeteroData()
        out._nodes = {t: s.to(backend) for t, s in self._nodes.items()}  # type: ignore[misc]
        out._edges = {t: s.to(backend) for t, s in self._edges.items()}  # type: ignore[misc]
        return out

    def __repr__(self) -> str:
        lines = [f"  {t}={s!r}" for t, s in self._nodes.items()]
        lines += [f"  ({', '.join(t)})={s!r}" for t, s in self._edges.items()]
        return "HeteroData(\n" + ",\n".join(lines) + "\n)"
