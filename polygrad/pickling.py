"""Pickling tensors: ``pickle.dumps(t)`` / ``copy.deepcopy(t)`` / multiprocessing.

A tensor pickles as its values (a numpy array), its backend's *name*, ``requires_grad``, its
``.grad`` and its name -- never its backend object (whose kernels are local functions) or its
autodiff graph: an unpickled tensor is a leaf, like a checkpointed one.  A sparse tensor pickles
as its pattern (CSR arrays), values and layout.  Unpickling goes through the ordinary
constructors, so a hostile pickle of a tensor gets the same validation as ``pg.tensor`` (but
pickle itself can run code: unpickle only what you trust; ``pg.load`` is the safe format).
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["reduce_tensor"]


def reduce_tensor(t: Any) -> tuple:
    """``Tensor.__reduce__``: (rebuild function, its arguments)."""
    grad = t.grad
    if getattr(t, "layout", "dense") != "dense":
        p = t.pattern
        values = t.values
        sparse_grad = None if grad is None else grad.values.numpy().copy()
        return (_rebuild_sparse, (tuple(t.shape), np.array(p.indptr), np.array(p.cols),
                                  values.numpy().copy(), t.layout, t.backend,
                                  bool(t.requires_grad), sparse_grad, t.name))
    dense_grad = None if grad is None else _grad_array(grad)
    return (_rebuild_dense, (t.numpy().copy(), t.backend, bool(t.requires_grad), dense_grad, t.name))


def _grad_array(grad: Any) -> np.ndarray:
    return (grad.to_dense() if getattr(grad, "layout", "dense") != "dense" else grad).numpy().copy()


def _rebuild_dense(array: np.ndarray, backend: str, requires_grad: bool, grad: Any, name: Any) -> Any:
    from .tensor import tensor
    t = tensor(array, backend=backend, requires_grad=requires_grad and array.dtype.kind == "f")
    if grad is not None:
        t.grad = tensor(grad, backend=backend)
    t.name = name
    return t


def _rebuild_sparse(shape: tuple, indptr: np.ndarray, cols: np.ndarray, values: np.ndarray, layout: str,
                    backend: str, requires_grad: bool, grad: Any, name: Any) -> Any:
    from .sparse import sparse_csr
    t = sparse_csr(indptr, cols, values, shape, backend=backend, layout=layout, allow_nonfinite=True,
                   requires_grad=requires_grad and values.dtype.kind == "f")
    if grad is not None:
        t.grad = sparse_csr(indptr, cols, grad, shape, backend=backend, layout=layout, allow_nonfinite=True)
    t.name = name
    return t
