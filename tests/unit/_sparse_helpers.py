"""Checking a sparse op against numerical differentiation and against the dense computation.

A sparse op is tested as a function of its *raw* COO values (duplicates allowed, so the
coalescing at construction is inside the differentiated function) and of its dense operands:

* ``check_sparse_op`` runs it on one backend, differentiates a fixed weighted sum of its output
  with polygrad's backward, and compares with float64 central differences (no VJP involved);
* it also runs the dense counterpart (``dense_fn`` on the dense matrix as a dense leaf), restricts
  the result to the sparse output's pattern, and compares forward and gradients there.

Independent of ``polygrad.testing`` on purpose: these helpers must not share code with what they
check.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

import polygrad as pg

EPS = 1e-6


def weights_for(shape: tuple) -> np.ndarray:
    """Fixed, non-uniform loss weights for an output of ``shape`` (so every entry matters differently)."""
    n = int(np.prod(shape, dtype=np.int64))
    return (0.5 + (np.arange(n) * 0.6180339887) % 1.0).reshape(shape)


def dense_of(indices: np.ndarray, values: np.ndarray, shape: tuple) -> np.ndarray:
    """The dense matrix of raw COO data, duplicates summed (numpy, independent of polygrad)."""
    out = np.zeros(shape, dtype=np.float64)
    if indices.shape[1]:
        np.add.at(out, (indices[0], indices[1]), values)
    return out


def _loss_and_layout(out) -> tuple[float, dict]:
    """sum(w * out) for a dense output, sum(w * values) for a sparse one, as a float."""
    if pg.is_sparse(out):
        vals = out.values.numpy().astype(np.float64)
        return float(np.sum(vals * weights_for(vals.shape))), {"rows": out.row_indices, "cols": out.col_indices}
    arr = out.numpy().astype(np.float64)
    return float(np.sum(arr * weights_for(arr.shape))), {}


def _loss_tensor(out):
    if pg.is_sparse(out):
        w = pg.tensor(weights_for((out.nnz,)), dtype=out.dtype, backend=out.backend)
        return (out.values * w).sum()
    w = pg.tensor(weights_for(out.shape), dtype=out.dtype, backend=out.backend)
    return (out * w).sum()


def numerical_grads(fn: Callable, arrays: Sequence[np.ndarray], backend: str, wrt: Sequence[bool]) -> list:
    """Central differences of the weighted output sum w.r.t. each array marked in ``wrt``."""
    def value(arrs) -> float:
        with pg.no_grad():
            return _loss_and_layout(fn(*[pg.tensor(a, backend=backend) for a in arrs]))[0]

    grads = []
    for i, (a, want) in enumerate(zip(arrays, wrt)):
        if not want:
            grads.append(None)
            continue
        g = np.zeros(a.shape, dtype=np.float64)
        for idx in np.ndindex(*a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i][idx] += EPS
            minus[i][idx] -= EPS
            g[idx] = (value(plus) - value(minus)) / (2 * EPS)
        grads.append(g)
    return grads


def analytic(fn: Callable, arrays: Sequence[np.ndarray], backend: str, wrt: Sequence[bool]):
    """(output, [gradient or None]) from polygrad's backward on ``backend``."""
    ts = [pg.tensor(a, backend=backend, requires_grad=w) for a, w in zip(arrays, wrt)]
    out = fn(*ts)
    if out.requires_grad:
        _loss_tensor(out).backward()
    grads = []
    for t, w in zip(ts, wrt):
        if not w:
            grads.append(None)
        else:
            grads.append(np.zeros(t.shape) if t.grad is None else t.grad.numpy().astype(np.float64))
    return out, grads


def check_sparse_op(op: Callable, indices: np.ndarray, shape: tuple, values: np.ndarray,
                    extras: Sequence[np.ndarray] = (), dense_op: Callable | None = None,
                    backend: str = "numpy", rtol: float = 1e-5, atol: float = 1e-7,
                    grad_extras: Sequence[bool] | None = None) -> dict:
    """Check ``op(A, *extras)`` with ``A = pg.sparse_coo(indices, values, shape)``.

    Gradients (w.r.t. the raw values and the floating extras) are compared with central
    differences; when ``dense_op(D, *extras)`` is given, its output restricted to the sparse
    output's pattern, and its gradient w.r.t. the dense matrix D at A's entries, are compared too.
    Returns the forward output and gradients (numpy) for cross-backend comparison.
    """
    indices = np.asarray(indices, dtype=np.int64).reshape(2, -1)
    values = np.asarray(values, dtype=np.float64)
    extras = [np.asarray(e, dtype=np.float64) for e in extras]
    if grad_extras is None:
        grad_extras = [True] * len(extras)
    arrays = [values] + extras
    wrt = [True] + list(grad_extras)

    def fn(v, *xs):
        return op(pg.sparse_coo(indices, v, shape), *xs)

    out, got = analytic(fn, arrays, backend, wrt)
    want = numerical_grads(fn, arrays, backend, wrt)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"gradient of input {i} on {backend}")

    result = {"out": out.to_dense().numpy() if pg.is_sparse(out) else out.numpy(), "grads": got,
              "sparse_out": pg.is_sparse(out)}
    if dense_op is None:
        return result
    # the dense computation, restricted to the sparse output's pattern
    dense = dense_of(indices, values, shape)
    d = pg.tensor(dense, backend=backend, requires_grad=True)
    xs = [pg.tensor(e, backend=backend, requires_grad=w) for e, w in zip(extras, grad_extras)]
    dout = dense_op(d, *xs)
    if pg.is_sparse(out):
        rows, cols = out.row_indices, out.col_indices
        np.testing.assert_allclose(out.values.numpy(), dout.numpy()[rows, cols], rtol=1e-9, atol=1e-12,
                                   err_msg="forward vs dense restricted to the pattern")
        picked = dout[rows, cols]
        loss = (picked * pg.tensor(weights_for(picked.shape), backend=backend)).sum()
    else:
        np.testing.assert_allclose(out.numpy(), dout.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg="forward vs dense")
        loss = (dout * pg.tensor(weights_for(dout.shape), backend=backend)).sum()
    if loss.requires_grad:
        loss.backward()
    gd = np.zeros(shape) if d.grad is None else d.grad.numpy()
    # d loss / d raw value e = dense gradient at e's position (duplicates share it)
    np.testing.assert_allclose(got[0], gd[indices[0], indices[1]], rtol=1e-8, atol=1e-10,
                               err_msg="values gradient vs dense gradient at the pattern")
    for i, (x, w) in enumerate(zip(xs, grad_extras)):
        if w:
            gx = np.zeros(x.shape) if x.grad is None else x.grad.numpy()
            np.testing.assert_allclose(got[1 + i], gx, rtol=1e-8, atol=1e-10,
                                       err_msg=f"gradient of dense operand {i} vs the dense computation")
    return result


def random_coo(rng: np.random.Generator, shape: tuple, k: int, duplicates: bool = True) -> np.ndarray:
    """``[2, k]`` int64 indices inside ``shape`` (with duplicates unless ``duplicates=False``)."""
    n, m = shape
    if k == 0 or n == 0 or m == 0:
        return np.zeros((2, 0), dtype=np.int64)
    if duplicates:
        return np.stack([rng.integers(0, n, k), rng.integers(0, m, k)]).astype(np.int64)
    flat = rng.choice(n * m, size=min(k, n * m), replace=False)
    return np.stack(np.divmod(flat, m)).astype(np.int64)
