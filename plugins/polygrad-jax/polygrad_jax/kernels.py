"""Every primitive op as a JAX kernel (pure functions of their inputs: they trace under jax.jit).

Sparse ops read the pattern's index arrays converted once to device arrays (``pattern.on``) and
reduce rows with sorted segment sums: each output row is the sum of its own nonzeros only, so an
``inf`` or ``NaN`` stays in its row and float32 error is that of a sum over the row.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from polygrad.ir.ops import Op
from polygrad.runtime.backend import elementwise_kernels

PATTERN_KEY = "jax"


def pattern_arrays(pattern: Any) -> tuple[Any, Any, Any]:
    """(indptr, rows, cols) as device arrays, converted once per pattern."""
    return pattern.on(PATTERN_KEY, lambda a: jax.device_put(np.asarray(a)))


def _index(index: tuple) -> tuple:
    return tuple(jnp.asarray(i) if isinstance(i, np.ndarray) and i.dtype.kind != "b" else i for i in index)


def relu(x):
    return jnp.maximum(x, jnp.zeros((), dtype=x.dtype))


def cast(x, *, dtype):
    return x.astype(dtype)


def reduce_sum(x, *, axes, keepdims):
    return jnp.sum(x, axis=axes, keepdims=keepdims) if axes or x.dtype.kind in "biu" else x


def reduce_max(x, *, axes, keepdims):
    return jnp.max(x, axis=axes, keepdims=keepdims) if axes else x


def reshape(x, *, shape):
    return jnp.reshape(x, shape)


def permute(x, *, perm):
    return jnp.transpose(x, perm)


def expand(x, *, shape):
    return jnp.broadcast_to(x, shape)


def getitem(x, *, index):
    return x[_index(index)]


def index_add(src, *, index, shape):
    return jnp.zeros(shape, dtype=src.dtype).at[_index(index)].add(src)


def concat(*arrays, axis):
    return jnp.concatenate(arrays, axis=axis)


def segment_sum(values, *, pattern):
    _, rows, _ = pattern_arrays(pattern)
    return jax.ops.segment_sum(values, rows, num_segments=pattern.shape[0], indices_are_sorted=True)


def segment_max(values, *, pattern):
    indptr, rows, _ = pattern_arrays(pattern)
    n = pattern.shape[0]
    top = jax.ops.segment_max(values, rows, num_segments=n, indices_are_sorted=True)
    nonempty = (indptr[1:] > indptr[:-1]).reshape((n,) + (1,) * (values.ndim - 1))
    return jnp.where(nonempty, top, jnp.zeros((), dtype=values.dtype))   # empty rows give 0


def spmm(values, x, *, pattern):
    _, rows, cols = pattern_arrays(pattern)
    x2 = x.reshape(-1, 1) if x.ndim == 1 else x
    contrib = values[:, None] * x2[cols]
    out = jax.ops.segment_sum(contrib, rows, num_segments=pattern.shape[0], indices_are_sorted=True)
    return out.reshape(-1) if x.ndim == 1 else out


def spmm_transposed(values, x, *, pattern):
    """``pattern.T @ x`` with ``pattern``'s own values (in its order): each stored value times its
    row of ``x``, read in order, summed into its column -- the product that a gather of the values
    into the transpose's order and an ``spmm`` over ``pattern.transpose()`` give (the compiled
    step's form of a backward pass's ``A^T @ g``, ``compile.py``)."""
    _, rows, cols = pattern_arrays(pattern)
    x2 = x.reshape(-1, 1) if x.ndim == 1 else x
    out = jax.ops.segment_sum(values[:, None] * x2[rows], cols, num_segments=pattern.shape[1])
    return out.reshape(-1) if x.ndim == 1 else out


def sddmm(p, q, *, pattern):
    _, rows, cols = pattern_arrays(pattern)
    return jnp.sum(p[rows] * q[cols], axis=1, dtype=jnp.result_type(p, q))


def make_kernels() -> dict[tuple[Op, str], Callable]:
    dense: dict[Op, Callable] = {
        **elementwise_kernels(jnp), Op.RELU: relu, Op.CAST: cast,
        Op.SUM: reduce_sum, Op.MAX: reduce_max,
        Op.RESHAPE: reshape, Op.PERMUTE: permute, Op.EXPAND: expand, Op.GETITEM: getitem,
        Op.INDEX_ADD: index_add, Op.CONCAT: concat, Op.MATMUL: jnp.matmul,
    }
    table = {(op, "dense"): fn for op, fn in dense.items()}
    table[(Op.SPMM, "csr")] = spmm          # "csr" serves "coo" too (polygrad.ir.ops.kernel_key)
    table[(Op.SDDMM, "csr")] = sddmm
    table[(Op.SEGMENT_SUM, "csr")] = segment_sum
    table[(Op.SEGMENT_MAX, "csr")] = segment_max
    return table
