"""The tensor layer: the ``Tensor`` class and the functions behind its methods, one module per kind.

Every op is defined once, as a function of this package (``add`` in :mod:`.elementwise`, ``sum`` in
:mod:`.reductions`, ...); the class in :mod:`.tensor` binds those functions as its methods and
operators.  Composites (sub, div, sigmoid, softmax, the losses) are written with primitives, so
their gradients come from the gradient table.

    args            argument checks (ints, shapes, dims); Tensor as the functions know it
    creation        tensor, from_numpy, zeros/ones/full/arange, rand/randn, manual_seed, rng
    sparse_routing  how dense functions hand sparse operands to polygrad.sparse
    elementwise     add, mul, sub, div, pow, maximum, minimum, abs, clip, where, sigmoid, addcmul
    movement        reshape, permute, transpose, expand, (un)squeeze, flatten, concat, stack
    reductions      sum, mean, max, min, argmax, argmin, logsumexp, softmax, log_softmax
    losses          cross_entropy, mse
    indexing        x[index], index_add, nonzero, masked_fill, index_put
    linalg          matmul, addmm, spmm, sddmm, segment_sum, segment_max
    tensor_class    the Tensor class
    activations     leaky_relu, elu, gelu, softplus
    torch_names     PyTorch's dim=/keepdim= spellings
    interop, lazy, draw   DLPack exchange, materialize, draw_graph
"""
from __future__ import annotations

from .args import _floating
from .creation import (
    arange, from_numpy, full, manual_seed, ones, ones_like, rand, randn, rng, tensor, tensor_from_numpy, zeros,
    zeros_like,
)
from .elementwise import abs, add, addcmul, clip, div, maximum, minimum, mul, pow, sigmoid, sub, where  # noqa: A004
from .indexing import getitem, index_add, index_put, masked_fill, nonzero
from .linalg import addmm, matmul, sddmm, segment_max, segment_sum, spmm
from .losses import cross_entropy, mse, reduce_losses
from .movement import cat, concat, expand, flatten, permute, reshape, squeeze, stack, transpose, unsqueeze
from .reductions import argmax, argmin, log_softmax, logsumexp, max, mean, min, softmax, sum  # noqa: A004
from .sparse_routing import is_sparse, register_sparse_api
from .tensor_class import Tensor, dlpack_source

__all__ = [
    "Tensor", "abs", "add", "addcmul", "addmm", "arange", "argmax", "argmin", "cat", "clip", "concat", "cross_entropy",
    "div",
    "dlpack_source", "expand", "flatten", "from_numpy", "full", "getitem", "index_add", "index_put", "is_sparse",
    "log_softmax", "logsumexp", "manual_seed", "masked_fill", "matmul", "max", "maximum", "mean", "min", "minimum",
    "mse", "mul", "nonzero", "ones", "ones_like", "permute", "pow", "rand", "randn", "reduce_losses",
    "register_sparse_api", "reshape", "rng", "sddmm", "segment_max", "segment_sum", "sigmoid", "softmax", "spmm",
    "squeeze", "stack", "sub", "sum", "tensor", "tensor_from_numpy", "transpose", "unsqueeze", "where", "zeros",
    "zeros_like", "_floating",
]
