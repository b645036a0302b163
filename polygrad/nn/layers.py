"""Dense layers: Linear, MLP (incl. micrograd's ``MLP(nin, nouts)``), Dropout, activations, Sequential."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import polygrad as pg
from polygrad.runtime.pool import HOST_POOL
from polygrad.runtime.random_blocks import draw_raw_in_blocks
from polygrad.compile import fresh, keyed_call
from polygrad.ir.errors import ShapeError
from polygrad.tensor import Tensor, addmm

from . import init as _init
from .module import Module

#: dropout's draw resolution: 16 random bits per entry
DROPOUT_LEVELS = 1 << 16
#: entries drawn per chunk (a multiple of 4: whole 64-bit words, so chunking never changes the bits)
DROPOUT_CHUNK = 1 << 20

__all__ = ["Linear", "MLP", "Dropout", "ReLU", "Tanh", "Sigmoid", "Identity", "Sequential", "dropout",
           "as_input"]


def as_input(x: Any, like: Tensor) -> Tensor:
    """``x`` as a tensor on ``like``'s backend (lists / arrays get ``like``'s dtype, as micrograd takes lists)."""
    if isinstance(x, Tensor):
        return x
    return pg.tensor(np.asarray(x, dtype=like.dtype), backend=like.backend)


class Linear(Module):
    """``y = x @ W + b`` with ``W`` of shape ``[in_features, out_features]``.

    ``init``: "glorot" (default, Xavier uniform), "micrograd" (U(-1, 1) weights, zero bias, as
    micrograd's ``Neuron``), "kaiming", or a callable ``fn(shape) -> array``.  Biases start at 0.
    ``x`` may be dense ``[..., in]`` or a sparse ``[N, in]`` matrix (then ``x @ W`` is an SpMM).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 init: "str | Callable[..., Any]" = "glorot", dtype: Any = None, backend: Any = None):
        if in_features < 0 or out_features < 0:
            raise ShapeError(f"Linear: feature sizes must be >= 0, got {in_features} -> {out_features}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.weight = _init.make(init, (self.in_features, self.out_features), dtype, backend)
        self.bias = _init.zeros((self.out_features,), dtype, backend) if bias else None

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self.weight)
        if not x.shape or x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear({self.in_features} -> {self.out_features}): input of shape "
                             f"{x.shape} ({getattr(x, 'layout', 'dense')}) must end in {self.in_features}")
        # x @ W + b as one op where it can be (polygrad.tensor.addmm: the same bits)
        return addmm(self.bias, x, self.weight) if self.bias is not None else x @ self.weight

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sigmoid()


class Identity(Module):
    def forward(self, x: Any) -> Any:
        return x


_ACTIVATIONS: dict[str, Callable[[], Module]] = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid,
                                                 "identity": Identity, "none": Identity}


def random_key() -> tuple[int, int]:
    """A key for a backend's keyed draw (:attr:`polygrad.Backend.random_mask`): two numbers in
    ``[0, 2**31)`` from one 64-bit word of ``pg.manual_seed``'s generator."""
    word = int(pg.rng().bit_generator.random_raw())
    return word & 0x7FFFFFFF, (word >> 32) & 0x7FFFFFFF


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout: zero each entry with probability ``p``, scale the rest by ``1/(1-p)``.

    On a sparse tensor only its stored values are dropped; the pattern is kept (Kipf & Welling's
    sparse dropout on the input features), so the result stays sparse and cheap.  Draws from
    polygrad's seeded generator, 16 bits per entry: ``p`` is honoured to 1/65536 (an entry is dropped
    when its draw is below ``round(p * 65536)``; exact for p = 0.5, within 8e-6 of any other p).
    Identity when not ``training`` or ``p == 0``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    target = x.values if pg.is_sparse(x) else x
    if target.dtype.kind != "f":
        raise pg.errors.DTypeError(f"dropout needs a floating tensor, got {target.dtype}")
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    shape, dtype = target.shape, target.dtype
    be = target._be
    scale_value = dtype.type(scale)
    drop_below = np.uint16(min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1))
    size = int(np.prod(shape, dtype=np.int64))

    def draw() -> np.ndarray:  # a compiled step (pg.compile) draws again on every replay
        mask = HOST_POOL.empty(shape, dtype)  # a large mask reuses a buffer: no fresh pages per step
        if p == 1.0:
            mask.fill(0)
            return mask
        # 16 random bits per element, four from each 64-bit word of the generator (a float draw
        # per element costs twice the generator's time), in chunks of whole words drawn on
        # polygrad's threads, each from the generator jumped to its first word: the bits of one
        # serial draw at any thread count, and the temporaries stay small
        flat = mask.reshape(-1)

        def chunk(first_word: int, words: np.ndarray) -> None:
            lo = 4 * first_word
            n = min(DROPOUT_CHUNK, size - lo)
            np.multiply(words.view(np.uint16)[:n] >= drop_below, scale_value, out=flat[lo:lo + n])  # 0 or scale

        draw_raw_in_blocks(pg.rng().bit_generator, (size + 3) // 4, DROPOUT_CHUNK // 4, chunk)
        return mask

    if be.random_mask is not None:  # drawn by the backend from a key (Backend.random_mask)
        attrs = {"shape": shape, "dtype": dtype, "drop_below": int(drop_below), "scale": float(scale)}
        mask = Tensor._make(keyed_call(be, be.random_mask, attrs, random_key), be, shape, dtype)
    else:  # the mask is ours alone: wrapped as it is (pg.tensor would copy it, a second pass over N x F)
        mask = fresh(lambda: Tensor._make(be.from_numpy(draw()), be, shape, dtype), lambda: be.from_numpy(draw()))
    if not pg.is_sparse(x):
        return x * mask
    return x.with_values(x.values * mask)  # same pattern, dropped values (differentiable)


class Dropout(Module):
    """Dropout layer (active in ``train()`` mode only).  Works on dense and sparse inputs."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Sequential(Module):
    """Modules applied in order: ``Sequential(Linear(2, 16), ReLU(), Linear(16, 1))``."""

    def __init__(self, *modules: Module):
        if len(modules) == 1 and isinstance(modules[0], (list, tuple)):
            modules = tuple(modules[0])
        for m in modules:
            if not isinstance(m, Module):
                raise TypeError(f"Sequential takes Modules, got {type(m).__name__}")
        self.layers = list(modules)

    def forward(self, x: Any) -> Any:
        for m in self.layers:
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)


class MLP(Module):
    """A multi-layer perceptron with micrograd's signature: ``MLP(nin, nouts)``.

    ``MLP(2, [16, 16, 1])`` is micrograd's moons model: Linear(2, 16) -> ReLU -> Linear(16, 16)
    -> ReLU -> Linear(16, 1) (the last layer is linear, as micrograd's ``nonlin=i!=len(nouts)-1``).
    It runs on batches: input ``[N, nin]`` (or one sample ``[nin]``, or a list of floats) gives
    ``[N, nouts[-1]]``.  ``init="micrograd"`` reproduces micrograd's U(-1, 1) weights; the default
    is Glorot.  ``dropout`` > 0 adds Dropout after every hidden activation.
    """

    def __init__(self, nin: int, nouts: Sequence[int] | int, activation: str = "relu",
                 init: "str | Callable[..., Any]" = "glorot", bias: bool = True, dropout: float = 0.0,
                 dtype: Any = None, backend: Any = None):
        sizes = [int(nin)] + ([int(nouts)] if isinstance(nouts, (int, np.integer)) else [int(n) for n in nouts])
        if len(sizes) < 2:
            raise ShapeError("MLP: nouts must name at least one layer size")
        act = _ACTIVATIONS.get(activation)
        if act is None:
            raise ValueError(f"MLP: unknown activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}")
        self.sizes = sizes
        self.activation = activation
        self.dropout = float(dropout)
        self.layers = [Linear(sizes[i], sizes[i + 1], bias=bias, init=init, dtype=dtype, backend=backend)
                       for i in range(len(sizes) - 1)]
        self._act = act()
        self._drop = Dropout(self.dropout) if self.dropout > 0 else None

    def forward(self, x: Any) -> Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i != last:
                x = self._act(x)
                if self._drop is not None:
                    x = dropout(x, self.dropout, self.training)
        return x

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activation={self.activation!r}"
