"""Normalisation layers: PyTorch's ``BatchNorm1d``, PyG's ``BatchNorm`` (which wraps it) and PyG's
graph ``LayerNorm``.

Running statistics are buffers (saved in ``state_dict``, never optimised) and are updated in
place outside autodiff, as PyTorch updates them; state-dict keys are PyTorch's / PyG's
(``module.running_mean``, ``module.num_batches_tracked``, ...).
"""
from __future__ import annotations

from typing import Any

import numpy as np

import polygrad as pg
from polygrad.ir.errors import ShapeError
from polygrad.sparse.graph_ops import scatter_sum
from polygrad.tensor import Tensor, is_sparse

from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm", "LayerNorm"]


def _features(layer: str, x: Any, channels: int) -> Tensor:
    if is_sparse(x):
        x = x.to_dense()
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != channels:
        raise ShapeError(f"{layer}: input of shape {getattr(x, 'shape', type(x).__name__)} must be [N, {channels}]")
    return x if x.dtype.kind == "f" else x.cast(pg.default_float)


def _param(value: float, channels: int, dtype: Any, backend: Any) -> Tensor:
    dtype = dtype if dtype is not None else pg.default_float
    return pg.tensor(np.full(channels, value), dtype=dtype, requires_grad=True, backend=backend)


def _buffer(value: float, channels: int, dtype: Any, backend: Any) -> Tensor:
    dtype = dtype if dtype is not None else pg.default_float
    return pg.tensor(np.full(channels, value), dtype=dtype, backend=backend)


class BatchNorm1d(Module):
    """PyTorch's ``BatchNorm1d`` on ``[N, C]`` inputs: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Training (or ``track_running_stats=False``): the batch's mean and biased variance, and (when
    tracking) ``running_mean`` / ``running_var`` move by ``momentum`` towards the batch's mean
    and *unbiased* variance (``momentum=None``: a cumulative average over
    ``num_batches_tracked`` batches), exactly as PyTorch.  Eval: the running statistics.
    A training batch of one row is an error, as in PyTorch.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype: Any = None, backend: Any = None):
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        c = self.num_features
        self.weight = _param(1.0, c, dtype, backend) if self.affine else None
        self.bias = _param(0.0, c, dtype, backend) if self.affine else None
        self.running_mean: Tensor | None = None
        self.running_var: Tensor | None = None
        self.num_batches_tracked: Tensor | None = None
        if self.track_running_stats:
            self.running_mean = _buffer(0.0, c, dtype, backend)
            self.running_var = _buffer(1.0, c, dtype, backend)
            self.num_batches_tracked = pg.tensor(np.array(0, dtype=np.int64), backend=backend)

    def _stats(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.running_mean is None or self.running_var is None or self.num_batches_tracked is None:
            raise ShapeError(f"{type(self).__name__}: no running statistics (built with track_running_stats=False)")
        return self.running_mean, self.running_var, self.num_batches_tracked

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            mean, var, tracked = self._stats()
            mean.update_(np.zeros(self.num_features))
            var.update_(np.ones(self.num_features))
            tracked.update_(np.array(0, dtype=np.int64))

    def _update_running_stats(self, mean: Tensor, var: Tensor, n: int) -> None:
        running_mean, running_var, num_batches = self._stats()
        tracked = int(num_batches.item()) + 1
        num_batches.update_(np.array(tracked, dtype=np.int64))
        factor = 1.0 / tracked if self.momentum is None else float(self.momentum)
        unbiased = var.detach() * (n / (n - 1))
        running_mean.update_(running_mean * (1.0 - factor) + mean.detach() * factor)
        running_var.update_(running_var * (1.0 - factor) + unbiased * factor)

    def normalize(self, x: Tensor, use_batch_stats: bool, update: bool) -> Tensor:
        """The normalisation with batch (``use_batch_stats``) or running statistics."""
        if use_batch_stats:
            n = x.shape[0]
            if n <= 1 and self.training:
                raise ShapeError(f"{type(self).__name__}: expected more than 1 value per channel when training, "
                                 f"got input of shape {x.shape}")
            mean = x.mean(0)
            centered = x - mean
            var = (centered * centered).mean(0)
            if update:
                self._update_running_stats(mean, var, n)
            out = centered / (var + self.eps) ** 0.5
        else:
            running_mean, running_var, _ = self._stats()
            out = (x - running_mean) / (running_var + self.eps) ** 0.5
        if self.weight is not None and self.bias is not None:
            out = out * self.weight + self.bias
        return out

    def forward(self, x: Tensor) -> Tensor:
        x = _features(type(self).__name__, x, self.num_features)
        batch_stats = self.training or not self.track_running_stats
        return self.normalize(x, batch_stats, self.training and self.track_running_stats)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm(Module):
    """PyG's ``BatchNorm``: node-wise batch normalisation, a :class:`BatchNorm1d` kept as ``module``
    (so state-dict keys are PyG's: ``module.weight``, ``module.running_mean``, ...).

    ``allow_single_element=True`` normalises a batch of at most one row with the running
    statistics instead of failing (requires ``track_running_stats``), as PyG.
    """

    def __init__(self, in_channels: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, allow_single_element: bool = False,
                 dtype: Any = None, backend: Any = None):
        if allow_single_element and not track_running_stats:
            raise ValueError("BatchNorm: 'allow_single_element' requires 'track_running_stats' to be set to True")
        self.module = BatchNorm1d(in_channels, eps, momentum, affine, track_running_stats, dtype, backend)
        self.in_channels = int(in_channels)
        self.allow_single_element = bool(allow_single_element)

    def reset_running_stats(self) -> None:
        self.module.reset_running_stats()

    def forward(self, x: Tensor) -> Tensor:
        if self.allow_single_element and isinstance(x, Tensor) and x.shape[0] <= 1:
            x = _features("BatchNorm", x, self.in_channels)
            return self.module.normalize(x, use_batch_stats=False, update=False)
        return self.module(x)

    def extra_repr(self) -> str:
        return self.module.extra_repr()


def _std_of_centered(centered: Tensor) -> Tensor:
    """``sqrt(mean(centered ** 2))`` (PyG's ``x.std(unbiased=False)``) with PyTorch's gradient at a
    zero std: 0, not ``sqrt'(0) * 0 = inf * 0 = nan`` (``torch.std``'s backward masks it).  The
    square root is taken of 1 there, so the branch ``where`` drops stays finite."""
    var = (centered * centered).mean()
    zero = var == 0
    return pg.where(zero, 0.0, pg.where(zero, 1.0, var) ** 0.5)


class LayerNorm(Module):
    """PyG's ``LayerNorm`` (``torch_geometric.nn.norm.LayerNorm``), default ``mode="graph"``:
    each graph's nodes and features normalised together.

    * ``mode="graph"``, no ``batch``: ``(x - mean(x)) / (std(x) + eps)`` over all entries (the
      biased std, with ``eps`` added to it: PyG's formula);
    * ``mode="graph"`` with ``batch`` (the graph of each node): per graph,
      ``(x - mean) / sqrt(var + eps)`` over that graph's ``nodes x features`` entries;
    * ``mode="node"``: each row on its own, ``(x - mean) / sqrt(var + eps)`` -- PyTorch's
      ``LayerNorm(in_channels)``.

    Then ``* weight + bias`` when ``affine``.  Not PyTorch's ``nn.LayerNorm`` by default (PyG's
    name and default mode, on purpose).
    """

    def __init__(self, in_channels: int, eps: float = 1e-5, affine: bool = True, mode: str = "graph",
                 dtype: Any = None, backend: Any = None):
        if mode not in ("graph", "node"):
            raise ValueError(f"LayerNorm: unknown normalization mode {mode!r} (choose 'graph' or 'node')")
        self.in_channels, self.eps, self.affine, self.mode = int(in_channels), float(eps), bool(affine), mode
        self.weight = _param(1.0, self.in_channels, dtype, backend) if self.affine else None
        self.bias = _param(0.0, self.in_channels, dtype, backend) if self.affine else None

    def forward(self, x: Tensor, batch: Any = None, batch_size: int | None = None) -> Tensor:
        x = _features("LayerNorm", x, self.in_channels)
        if self.mode == "node":
            centered = x - x.mean(-1, keepdims=True)
            out = centered / ((centered * centered).mean(-1, keepdims=True) + self.eps) ** 0.5
        elif batch is None:
            centered = x - x.mean()
            out = centered / (_std_of_centered(centered) + self.eps)
        else:
            idx = batch.numpy() if isinstance(batch, Tensor) else np.asarray(batch)
            idx = idx.astype(np.int64, copy=False)
            if idx.shape != (x.shape[0],):
                raise ShapeError(f"LayerNorm: batch of shape {idx.shape} must have one entry per node ({x.shape[0]})")
            size = int(idx.max()) + 1 if batch_size is None else int(batch_size)
            count = np.maximum(np.bincount(idx, minlength=size)[:size], 1) * x.shape[1]
            norm = pg.tensor(count.reshape(-1, 1).astype(x.dtype), backend=x._be)
            mean = scatter_sum(x, idx, size).sum(-1, keepdims=True) / norm
            centered = x - mean[idx]
            var = scatter_sum(centered * centered, idx, size).sum(-1, keepdims=True) / norm
            out = centered / ((var + self.eps) ** 0.5)[idx]
        if self.weight is not None:
            out = out * self.weight + self.bias
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, affine={self.affine}, mode={self.mode!r}"
