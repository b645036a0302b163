"""Transforms of a :class:`~polygrad.data.Data` with PyG's names, defaults and results
(``torch_geometric.transforms``): :class:`Compose`, :class:`NormalizeFeatures`,
:class:`ToUndirected`, :class:`RandomNodeSplit`, :class:`RandomLinkSplit`.

A transform is called on a ``Data`` and returns a new one (a shallow copy with the changed
attributes replaced): unlike PyG's, the input is never modified in place.  The random ones take
``seed=`` (None, an int or a numpy Generator) where PyG reads torch's global generator.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from ..ir.errors import DataError
from .data import Data
from .link import negative_sampling
from .csr import CSRMatrix
from .seeds import as_generator
from .utils import to_undirected

__all__ = ["BaseTransform", "Compose", "NormalizeFeatures", "ToUndirected", "RandomNodeSplit", "RandomLinkSplit"]


class BaseTransform:
    """A callable on :class:`Data`; subclasses define :meth:`forward`."""

    def __call__(self, data: Any) -> Any:
        if not isinstance(data, Data):
            raise DataError(f"{type(self).__name__}: expects a polygrad.data.Data, got {type(data).__name__}")
        return self.forward(copy.copy(data))

    def forward(self, data: Data) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Compose(BaseTransform):
    """Apply ``transforms`` in order (the last may return a tuple, as :class:`RandomLinkSplit`)."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, data: Any) -> Any:
        for t in self.transforms:
            if isinstance(data, (tuple, list)):
                data = type(data)(t(d) for d in data)
            else:
                data = t(data)
        return data

    def __repr__(self) -> str:
        inner = ",\n".join(f"  {t!r}" for t in self.transforms)
        return f"Compose([\n{inner}\n])"


class NormalizeFeatures(BaseTransform):
    """Shift ``attrs`` (default ``x``) so the smallest value is 0, then divide each row by its
    sum (rows summing to less than 1 are divided by 1), as PyG."""

    def __init__(self, attrs: Sequence[str] = ("x",)) -> None:
        self.attrs = list(attrs)

    def forward(self, data: Data) -> Data:
        for key in self.attrs:
            value = data[key]
            if value is None:
                continue
            data[key] = _normalize_rows(value, key)
        return data


def _normalize_rows(value: Any, key: str) -> Any:
    if isinstance(value, CSRMatrix):
        low = min(0.0, float(value.data.min())) if value.nnz else 0.0
        if low < 0 and value.nnz < value.shape[0] * value.shape[1]:
            value = value.to_dense()  # shifting by a negative minimum fills the implicit zeros
        else:
            rows = value.row_ids()
            data = value.data - low
            denom = np.maximum(np.bincount(rows, weights=data, minlength=value.shape[0]), 1.0)
            return CSRMatrix(value.indptr, value.indices, (data / denom[rows]).astype(value.data.dtype), value.shape)
    arr = np.asarray(value)
    if arr.dtype.kind != "f":
        raise DataError(f"NormalizeFeatures: {key} must hold floats, got {arr.dtype}")
    if arr.size == 0:
        return arr
    arr = arr - arr.min()
    return arr / np.maximum(arr.sum(axis=-1, keepdims=True), 1.0).astype(arr.dtype)


class ToUndirected(BaseTransform):
    """Add every edge's reverse and merge repeated edges, reducing their edge features with
    ``reduce`` (default "add"), as PyG's transform on a homogeneous graph."""

    def __init__(self, reduce: str = "add", merge: bool = True) -> None:
        self.reduce = reduce
        self.merge = merge

    def forward(self, data: Data) -> Data:
        if data.edge_index is None:
            return data
        keys = [k for k in data.keys() if data.is_edge_attr(k)]
        ei, values = to_undirected(data.edge_index, [data[k] for k in keys], data.num_nodes, self.reduce)
        data.edge_index = ei
        for k, v in zip(keys, values):
            data[k] = v
        return data


def _count(value: Any, total: int, name: str, rounding: Callable[[float], int]) -> int:
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise DataError(f"{name} as a fraction must lie in [0, 1], got {value}")
        return int(rounding(value * total))
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise DataError(f"{name} must be a non-negative int or a fraction, got {value!r}")
    return int(value)


class RandomNodeSplit(BaseTransform):
    """New ``train_mask`` / ``val_mask`` / ``test_mask`` (PyG's defaults: ``split="train_rest"``,
    ``num_val=500``, ``num_test=1000``, ``num_train_per_class=20``; floats are fractions of the
    nodes).  "train_rest": val, test, then every other node trains; "test_rest": per-class train
    nodes, val, then the rest tests; "random": per-class train nodes, val and test."""

    def __init__(self, split: str = "train_rest", num_splits: int = 1, num_train_per_class: int = 20,
                 num_val: "int | float" = 500, num_test: "int | float" = 1000, key: str = "y",
                 seed: Any = None) -> None:
        if split not in ("train_rest", "test_rest", "random"):
            raise DataError(f"RandomNodeSplit: split must be 'train_rest', 'test_rest' or 'random', got {split!r}")
        if num_splits != 1:
            raise DataError("RandomNodeSplit: only num_splits=1 is supported (PyG stacks masks into [N, splits])")
        self.split, self.num_train_per_class = split, int(num_train_per_class)
        self.num_val, self.num_test, self.key = num_val, num_test, key
        self.rng = as_generator(seed, "RandomNodeSplit: seed")

    def forward(self, data: Data) -> Data:
        n = data.num_nodes
        if n is None:
            raise DataError("RandomNodeSplit: the Data has no nodes (no x, edge_index or num_nodes)")
        num_val = _count(self.num_val, n, "RandomNodeSplit: num_val", round)
        num_test = _count(self.num_test, n, "RandomNodeSplit: num_test", round)
        train, val, test = (np.zeros(n, dtype=bool) for _ in range(3))
        if self.split == "train_rest":
            perm = self.rng.permutation(n)
            val[perm[:num_val]] = True
            test[perm[num_val:num_val + num_test]] = True
            train[perm[num_val + num_test:]] = True
        else:
            y = data[self.key]
            if y is None:
                raise DataError(f"RandomNodeSplit: split={self.split!r} needs labels in data.{self.key}")
            y = np.asarray(y)
            for c in range(int(y.max()) + 1 if y.size else 0):
                idx = np.flatnonzero(y == c)
                train[self.rng.permutation(idx)[:self.num_train_per_class]] = True
            rest = self.rng.permutation(np.flatnonzero(~train))
            val[rest[:num_val]] = True
            test[rest[num_val:] if self.split == "test_rest" else rest[num_val:num_val + num_test]] = True
        data.train_mask, data.val_mask, data.test_mask = train, val, test
        return data


class RandomLinkSplit(BaseTransform):
    """Split the edges into train / val / test link-prediction sets (PyG's ``RandomLinkSplit``,
    same defaults: ``num_val=0.1``, ``num_test=0.2``, ``neg_sampling_ratio=1.0``).

    Returns ``(train_data, val_data, test_data)``.  Each keeps the node attributes; its
    ``edge_index`` holds the edges the model may pass messages over (train: the train edges;
    val: the train edges; test: train and val edges), and ``edge_label_index`` / ``edge_label``
    the pairs to score: that split's positive edges (label 1) followed by sampled negatives
    (label 0; with ``add_negative_train_samples=False`` the train split has none, the training
    loop samples them).  No positive edge is in two splits, no split's supervision edges are in
    its own or an earlier split's ``edge_index``, and every negative is a non-edge of the whole
    graph, distinct from every other negative.  ``is_undirected=True``: each undirected edge
    (stored in both directions) is split once, its message edges kept in both directions.
    Differs from PyG: only the default ``key="edge_label"`` without existing labels, and no
    ``disjoint_train_ratio`` / ``split_labels`` / heterogeneous edge types (refused if asked).
    """

    def __init__(self, num_val: "int | float" = 0.1, num_test: "int | float" = 0.2, is_undirected: bool = False,
                 key: str = "edge_label", split_labels: bool = False, add_negative_train_samples: bool = True,
                 neg_sampling_ratio: float = 1.0, disjoint_train_ratio: "int | float" = 0.0,
                 seed: Any = None) -> None:
        if key != "edge_label" or split_labels or disjoint_train_ratio:
            raise DataError("RandomLinkSplit: key, split_labels and disjoint_train_ratio other than PyG's "
                            "defaults are not supported yet")
        if neg_sampling_ratio < 0:
            raise DataError(f"RandomLinkSplit: neg_sampling_ratio must be >= 0, got {neg_sampling_ratio}")
        self.num_val, self.num_test = num_val, num_test
        self.is_undirected = bool(is_undirected)
        self.add_negative_train_samples = bool(add_negative_train_samples)
        self.neg_sampling_ratio = float(neg_sampling_ratio)
        self.rng = as_generator(seed, "RandomLinkSplit: seed")

    def forward(self, data: Data) -> tuple[Data, Data, Data]:
        ei = data.edge_index
        if ei is None:
            raise DataError("RandomLinkSplit: the Data has no edge_index")
        if "edge_label" in data:
            raise DataError("RandomLinkSplit: data already has edge_label; existing labels are not supported yet")
        n = data.num_nodes or 0
        if self.is_undirected:
            perm = np.flatnonzero(ei[0] <= ei[1])
            perm = perm[self.rng.permutation(perm.shape[0])]
        else:
            perm = self.rng.permutation(ei.shape[1])
        num_val = _count(self.num_val, perm.shape[0], "RandomLinkSplit: num_val", int)
        num_test = _count(self.num_test, perm.shape[0], "RandomLinkSplit: num_test", int)
        num_train = perm.shape[0] - num_val - num_test
        if num_train <= 0:
            raise DataError(f"RandomLinkSplit: insufficient number of edges for training ({perm.shape[0]} "
                            f"edges, {num_val} val, {num_test} test)")
        train_edges = perm[:num_train]
        val_edges = perm[num_train:num_train + num_val]
        test_edges = perm[num_train + num_val:]
        train_data, val_data, test_data = copy.copy(data), copy.copy(data), copy.copy(data)
        self._message_edges(train_data, data, train_edges)
        self._message_edges(val_data, data, train_edges)
        self._message_edges(test_data, data, perm[:num_train + num_val])

        num_neg_train = int(num_train * self.neg_sampling_ratio) if self.add_negative_train_samples else 0
        num_neg_val = int(num_val * self.neg_sampling_ratio)
        num_neg_test = int(num_test * self.neg_sampling_ratio)
        num_neg = num_neg_train + num_neg_val + num_neg_test
        neg = negative_sampling(ei, n, num_neg_samples=num_neg, seed=self.rng)
        if neg.shape[1] < num_neg:  # as PyG: fewer non-edges than asked, shrink each share
            found = neg.shape[1]
            warnings.warn(f"RandomLinkSplit: not enough negative edges; the ratio is adjusted to "
                          f"{found / num_neg:.2f}", stacklevel=2)
            num_neg_train = int(num_neg_train / num_neg * found)
            num_neg_val = int(num_neg_val / num_neg * found)
            num_neg_test = found - num_neg_train - num_neg_val
        self._labels(train_data, ei[:, train_edges], neg[:, num_neg_val + num_neg_test:])
        self._labels(val_data, ei[:, val_edges], neg[:, :num_neg_val])
        self._labels(test_data, ei[:, test_edges], neg[:, num_neg_val:num_neg_val + num_neg_test])
        return train_data, val_data, test_data

    def _message_edges(self, out: Data, data: Data, index: np.ndarray) -> None:
        for key in data.keys():
            if key != "edge_index" and data.is_edge_attr(key):
                value = np.asarray(data[key])[index]
                out[key] = np.concatenate([value, value], axis=0) if self.is_undirected else value
        ei = data.edge_index[:, index]
        out.edge_index = np.concatenate([ei, ei[::-1]], axis=1) if self.is_undirected else ei

    @staticmethod
    def _labels(out: Data, pos: np.ndarray, neg: np.ndarray) -> None:
        out.edge_label_index = np.concatenate([pos, neg], axis=1)
        out.edge_label = np.concatenate([np.ones(pos.shape[1], dtype=np.float32),
                                         np.zeros(neg.shape[1], dtype=np.float32)])

    def __repr__(self) -> str:
        return f"RandomLinkSplit(num_val={self.num_val}, num_test={self.num_test})"
