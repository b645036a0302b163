"""``MLP``: PyG's ``MLP(channel_list, norm=, dropout=, act=, plain_last=)``, still taking
micrograd's ``MLP(nin, nouts)``.

PyG's form has one positional argument (``channel_list``, or an int ``in_channels`` with
``hidden_channels=``, ``out_channels=``, ``num_layers=``); micrograd's has two.  So
``MLP([16, 32, 2], norm="batch_norm")`` is PyG's model and ``MLP(2, [16, 16, 1])`` is micrograd's
(:class:`polygrad.nn.layers.MLP`, whose behaviour and parameter names it keeps) -- one name, no
ambiguity, and existing code keeps working.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from polygrad.tensor.activations import elu, gelu, leaky_relu, softplus
from polygrad.ir.errors import ShapeError
from polygrad.tensor import Tensor

from . import layers
from .layers import Identity, Linear, ReLU, Sigmoid, Tanh, dropout
from .module import Module
from .norm import BatchNorm, LayerNorm

__all__ = ["MLP", "resolve_activation", "resolve_norm"]

#: activation name -> a factory taking the activation's keyword arguments; what it makes is a
#: Module or a functools.partial, so an MLP pickles and deep-copies like any module
_ACTIVATIONS: dict[str, Callable[..., Callable[[Tensor], Tensor]]] = {
    "relu": ReLU,
    "tanh": Tanh,
    "sigmoid": Sigmoid,
    "leaky_relu": lambda negative_slope=0.01: partial(leaky_relu, negative_slope=negative_slope),
    "elu": lambda alpha=1.0: partial(elu, alpha=alpha),
    "gelu": lambda approximate="none": partial(gelu, approximate=approximate),
    "softplus": lambda beta=1.0, threshold=20.0: partial(softplus, beta=beta, threshold=threshold),
}


def resolve_activation(act: Any, **kwargs: Any) -> Callable[[Tensor], Tensor] | None:
    """PyG's ``activation_resolver``: a name ("relu", "leaky_relu", "elu", "gelu", ...) with its
    keyword arguments, a callable (a module or function) as it is, or None."""
    if act is None or callable(act):
        return act
    key = str(act).lower().replace("leakyrelu", "leaky_relu")
    make = _ACTIVATIONS.get(key)
    if make is None:
        raise ValueError(f"MLP: unknown activation {act!r}; choose one of {sorted(_ACTIVATIONS)} or pass a callable")
    return make(**kwargs)


def resolve_norm(norm: Any, channels: int, **kwargs: Any) -> Module:
    """PyG's ``normalization_resolver``: "batch_norm" / "layer_norm" (PyG's layers), a callable
    ``norm(channels, **kwargs)``, or None (an Identity)."""
    if norm is None:
        return Identity()
    if callable(norm):
        return norm(channels, **kwargs)
    key = str(norm).lower().replace("batchnorm", "batch_norm").replace("layernorm", "layer_norm")
    if key == "batch_norm":
        return BatchNorm(channels, **kwargs)
    if key == "layer_norm":
        return LayerNorm(channels, **kwargs)
    raise ValueError(f"MLP: unknown norm {norm!r}; choose 'batch_norm', 'layer_norm', None or a callable")


def _per_layer(name: str, value: Any, n: int, kind: type) -> list:
    if isinstance(value, kind) and not isinstance(value, (list, tuple)):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"MLP: {len(values)} {name} values for {n} layers")
    return values


class MLP(layers.MLP):
    """A multi-layer perceptron, PyG's ``torch_geometric.nn.MLP`` (or micrograd's, see the module).

    ``MLP([in, hidden..., out])`` or ``MLP(in_channels=, hidden_channels=, out_channels=,
    num_layers=)``: each layer ``Linear -> norm -> act -> dropout`` (``act_first``: act before
    the norm); with ``plain_last`` (default) the last layer is a bare Linear.  PyG's defaults:
    ``norm="batch_norm"``, ``act="relu"``, ``dropout=0.0`` (a float is used for every layer but a
    plain last one; a list gives one per layer), ``bias=True`` (or one per layer).  ``norm`` may
    also be "layer_norm" (which then gets ``batch`` / ``batch_size`` from forward), a callable or
    None.  PyG's parameter names (``lins.i.*``, ``norms.i.module.*``).  Differs on purpose:
    Linear weights start Glorot (PyG: kaiming-uniform).
    """

    dropout: Any  # PyG's form: one rate per layer (micrograd's: one float)

    def __init__(self, channel_list: Any = None, nouts: Any = None,
                 *, in_channels: int | None = None, hidden_channels: int | None = None,
                 out_channels: int | None = None, num_layers: int | None = None,
                 dropout: "float | Sequence[float]" = 0.0, act: Any = "relu", act_first: bool = False,
                 act_kwargs: dict | None = None, norm: Any = "batch_norm", norm_kwargs: dict | None = None,
                 plain_last: bool = True, bias: "bool | Sequence[bool]" = True,
                 activation: str = "relu", init: Any = "glorot", dtype: Any = None, backend: Any = None):
        self._micrograd = nouts is not None
        if self._micrograd:  # micrograd's MLP(nin, nouts, activation=, init=, bias=, dropout=)
            super().__init__(channel_list, nouts, activation=activation, init=init, bias=bool(bias),
                             dropout=float(dropout), dtype=dtype, backend=backend)  # type: ignore[arg-type]
            return
        if isinstance(channel_list, (int, np.integer)):
            in_channels = int(channel_list)
        if in_channels is not None:
            if num_layers is None:
                raise ValueError("MLP: argument num_layers must be given")
            if num_layers > 1 and hidden_channels is None:
                raise ValueError(f"MLP: argument hidden_channels must be given for num_layers={num_layers}")
            if out_channels is None:
                raise ValueError("MLP: argument out_channels must be given")
            channel_list = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        if not isinstance(channel_list, (list, tuple)) or len(channel_list) < 2:
            raise ShapeError(f"MLP: channel_list must list at least two sizes, got {channel_list!r}")
        self.channel_list = [int(c) for c in channel_list]
        n = len(self.channel_list) - 1
        if isinstance(dropout, (int, float)):
            drops = [float(dropout)] * n
            if plain_last:
                drops[-1] = 0.0
        else:
            drops = [float(d) for d in _per_layer("dropout", dropout, n, float)]
        self.dropout = drops
        self.act = resolve_activation(act, **(act_kwargs or {}))
        self.act_first, self.plain_last = bool(act_first), bool(plain_last)
        biases = _per_layer("bias", bias, n, bool)
        self.lins = [Linear(a, b, bias=bool(use), init=init, dtype=dtype, backend=backend)
                     for a, b, use in zip(self.channel_list[:-1], self.channel_list[1:], biases)]
        kwargs = dict(norm_kwargs or {})
        if norm is not None and not callable(norm):
            kwargs.setdefault("dtype", dtype)
            kwargs.setdefault("backend", backend)
        hidden = self.channel_list[1:-1] if self.plain_last else self.channel_list[1:]
        self.norms = [resolve_norm(norm, c, **kwargs) for c in hidden]
        self.supports_norm_batch = bool(self.norms) and isinstance(self.norms[0], LayerNorm)

    @property
    def in_channels(self) -> int:
        return self.sizes[0] if self._micrograd else self.channel_list[0]

    @property
    def out_channels(self) -> int:
        return self.sizes[-1] if self._micrograd else self.channel_list[-1]

    @property
    def num_layers(self) -> int:
        return len(self.sizes if self._micrograd else self.channel_list) - 1

    def forward(self, x: Any, batch: Any = None, batch_size: int | None = None,
                return_emb: bool | None = None) -> Any:
        if self._micrograd:
            return super().forward(x)
        emb = None
        for i, (lin, norm) in enumerate(zip(self.lins, self.norms)):
            x = lin(x)
            if self.act is not None and self.act_first:
                x = self.act(x)
            x = norm(x, batch, batch_size) if self.supports_norm_batch else norm(x)
            if self.act is not None and not self.act_first:
                x = self.act(x)
            x = dropout(x, self.dropout[i], self.training)
            emb = x
        if self.plain_last:
            x = self.lins[-1](x)
            x = dropout(x, self.dropout[-1], self.training)
        return (x, emb) if isinstance(return_emb, bool) else x

    def extra_repr(self) -> str:
        if self._micrograd:
            return super().extra_repr()
        return f"{self.channel_list}, norm={type(self.norms[0]).__name__ if self.norms else None}"
