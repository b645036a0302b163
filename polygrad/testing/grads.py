"""Gradient checks: VJPs against central differences (float64), and backends against each other.

These are public test helpers, for users checking their own composite functions and for backend
authors::

    from polygrad.testing import check_grads, assert_backends_agree
    check_grads(lambda x, w: (x @ w).tanh().sum(), [np.random.randn(3, 4), np.random.randn(4, 2)])
    assert_backends_agree(lambda x: x.softmax(-1), [np.random.randn(2, 5)], backends=["scalar", "numpy"])

``fn`` takes polygrad tensors and returns one tensor.  Inputs may be numpy arrays, Python data or
dense polygrad tensors; every floating input is made a float64 leaf and differentiated (choose a
subset with ``wrt``).  A disagreement raises :class:`polygrad.errors.ConformanceError` whose
message names the input, the largest error, where it occurs and the tolerances.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..engine.autodiff import grad, no_grad
from ..ir.errors import ConformanceError, DTypeError, ShapeError
from ..runtime.registry import list_backends
from ..tensor import Tensor, tensor

Fn = Callable[..., Any]


def _host(x: Any) -> np.ndarray:
    """numpy copy of an input (tensor, array or Python data)."""
    if isinstance(x, Tensor):
        if getattr(x, "layout", "dense") != "dense":
            raise ShapeError("polygrad.testing: pass sparse operands through a closure (fn) and "
                             "their values as a dense input; sparse inputs are not perturbed directly")
        return x.numpy()
    return np.asarray(x)


def _backend_of(inputs: Sequence[Any], backend: Any) -> Any:
    if backend is not None:
        return backend
    for x in inputs:
        if isinstance(x, Tensor):
            return x._be
    return None


def _wrt(arrays: Sequence[np.ndarray], wrt: Sequence[int] | None) -> tuple[bool, ...]:
    if wrt is None:
        return tuple(a.dtype.kind == "f" for a in arrays)
    chosen = {int(i) % len(arrays) for i in wrt}
    return tuple(i in chosen for i in range(len(arrays)))


def _prepare(inputs: Sequence[Any], wrt: Sequence[int] | None) -> tuple[list[np.ndarray], tuple[bool, ...]]:
    """float64 host copies of the inputs (floating ones), and which ones get differentiated."""
    arrays = [_host(x) for x in inputs]
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    diff = _wrt(arrays, wrt)
    for i, d in enumerate(diff):
        if d and arrays[i].dtype.kind != "f":
            raise DTypeError(f"polygrad.testing: input {i} has dtype {arrays[i].dtype}; only floating "
                             "inputs can be differentiated")
    return arrays, diff


def _call(fn: Fn, arrays: Sequence[np.ndarray], diff: Sequence[bool], backend: Any,
          requires_grad: bool) -> tuple[Any, list]:
    ts = [tensor(a, backend=backend, requires_grad=requires_grad and d) for a, d in zip(arrays, diff)]
    out = fn(*ts)
    if not isinstance(out, Tensor):
        raise DTypeError(f"polygrad.testing: fn must return a polygrad Tensor, got {type(out).__name__}")
    if out.dtype.kind != "f":
        raise DTypeError(f"polygrad.testing: fn returned a {out.dtype} tensor; gradients need a floating output")
    return out, ts


def _seed_grad(shape: tuple, grad_output: Any, seed: int) -> np.ndarray:
    if grad_output is not None:
        g = np.asarray(_host(grad_output), dtype=np.float64)
        if g.shape != tuple(shape):
            raise ShapeError(f"polygrad.testing: grad_output of shape {g.shape} does not match the output {shape}")
        return g
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return np.ones(shape)  # a scalar loss: the VJP is the plain gradient
    # a random cotangent exercises every output element with a different weight
    return np.random.default_rng(seed).normal(size=shape)


def numerical_grad(fn: Fn, inputs: Sequence[Any], eps: float = 1e-6, grad_output: Any = None,
                   wrt: Sequence[int] | None = None, backend: Any = None, seed: int = 0) -> list[np.ndarray | None]:
    """Central-difference gradient of ``sum(fn(*inputs) * grad_output)`` in float64.

    ``grad_output`` defaults to a seeded random cotangent (the same one :func:`check_grads` uses
    for the same ``seed``).  Returns one float64 array per input (None for inputs not
    differentiated).  Costs two forward evaluations per differentiated element.
    """
    arrays, diff = _prepare(inputs, wrt)
    backend = _backend_of(inputs, backend)
    with no_grad():
        out, _ = _call(fn, arrays, diff, backend, False)
        g = _seed_grad(out.shape, grad_output, seed)

        def objective(args: list[np.ndarray]) -> float:
            value, _ = _call(fn, args, diff, backend, False)
            return float(np.sum(np.asarray(value.numpy(), dtype=np.float64) * g))

        grads: list[np.ndarray | None] = []
        for i, (a, d) in enumerate(zip(arrays, diff)):
            if not d:
                grads.append(None)
                continue
            grad = np.zeros(a.shape, dtype=np.float64)
            work = list(arrays)
            flat = a.copy().reshape(-1)
            for j in range(flat.size):
                orig = flat[j]
                flat[j] = orig + eps
                work[i] = flat.reshape(a.shape)
                plus = objective(work)
                flat[j] = orig - eps
                minus = objective(work)
                flat[j] = orig
                grad.reshape(-1)[j] = (plus - minus) / (2 * eps)
            grads.append(grad)
    return grads


def vjp_grads(fn: Fn, inputs: Sequence[Any], grad_output: Any = None, wrt: Sequence[int] | None = None,
              backend: Any = None, seed: int = 0) -> tuple[Any, list[np.ndarray | None]]:
    """(output as numpy, analytic VJP of each input as float64 numpy or None) through ``pg.grad``."""
    arrays, diff = _prepare(inputs, wrt)
    out, ts = _call(fn, arrays, diff, _backend_of(inputs, backend), True)
    g = _seed_grad(out.shape, grad_output, seed)
    wanted = [t for t, d in zip(ts, diff) if d]
    if not wanted:
        return out.numpy(), [None] * len(ts)
    if not out.requires_grad:
        got = [np.zeros(t.shape) for t in wanted]  # output does not depend on any input
    else:
        res = grad(out, wanted, grad_outputs=tensor(g.astype(out.dtype), backend=out._be), allow_unused=True)
        got = [np.zeros(t.shape) if r is None else np.asarray(r.numpy(), dtype=np.float64)
               for r, t in zip(res, wanted)]
    it = iter(got)
    return out.numpy(), [next(it) if d else None for d in diff]


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[bool, float, tuple]:
    """(all close?, largest abs error, index of the worst element) -- NaNs must match NaNs."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return False, float("inf"), ()
    if got.size == 0:
        return True, 0.0, ()
    if got.dtype.kind not in "fc" and want.dtype.kind not in "fc":
        bad = got != want
        return (not bad.any(), float(bad.sum()), tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else ())
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_mismatch = np.isnan(g) != np.isnan(w)
    with np.errstate(invalid="ignore"):
        err = np.where(np.isnan(g) & np.isnan(w), 0.0, np.abs(g - w))
        err = np.where(np.isinf(g) & np.isinf(w) & (g == w), 0.0, err)
        err = np.where(nan_mismatch, np.inf, err)
        bad = err > atol + rtol * np.abs(np.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0))
    worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
    return (not bad.any(), float(np.max(err)), tuple(int(i) for i in worst))


def _num(x: Any) -> str:
    x = np.asarray(x).item()
    return f"{x:.9g}" if isinstance(x, float) else repr(x)


def _explain(label: str, got: np.ndarray, want: np.ndarray, err: float, where: tuple, rtol: float,
             atol: float, got_name: str, want_name: str) -> str:
    if got.shape != want.shape:
        return f"{label}: shape {got.shape} ({got_name}) != {want.shape} ({want_name})"
    at = f" at index {where}" if where else ""
    detail = ""
    if got.size and (where or got.ndim == 0):
        detail = f" ({got_name} {_num(got[where])}, {want_name} {_num(want[where])})"
    return f"{label}: max abs error {err:.3g}{at}{detail}; rtol {rtol:g}, atol {atol:g}"


def check_grads(fn: Fn, inputs: Sequence[Any], eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-6,
                wrt: Sequence[int] | None = None, backend: Any = None, grad_output: Any = None,
                seed: int = 0) -> list[np.ndarray | None]:
    """Check ``fn``'s reverse-mode gradient against central differences, in float64.

    Computes the VJP of a (seeded random) cotangent through ``pg.grad`` and the same quantity
    by central differences with step ``eps``; raises ConformanceError naming the input, the
    largest error and where it is when they differ by more than ``atol + rtol * |numerical|``.
    Returns the analytic gradients (float64 numpy, None for inputs not differentiated).
    """
    _, analytic = vjp_grads(fn, inputs, grad_output, wrt, backend, seed)
    numeric = numerical_grad(fn, inputs, eps, grad_output, wrt, backend, seed)
    problems = []
    for i, (a, n) in enumerate(zip(analytic, numeric)):
        if a is None or n is None:  # not differentiated (both None: the same wrt)
            continue
        ok, err, where = compare(a, n, rtol, atol)
        if not ok:
            problems.append(_explain(f"input {i} {tuple(n.shape)}", a, n, err, where, rtol, atol,
                                     "analytic", "central differences"))
    if problems:
        name = getattr(fn, "__name__", "fn")
        raise ConformanceError(f"check_grads({name}): gradient disagrees with central differences "
                               f"(eps {eps:g}): " + "; ".join(problems))
    return analytic


def _available_backends() -> list[str]:
    return [b.name for b in list_backends() if b.available]


def assert_backends_agree(fn: Fn, inputs: Sequence[Any], backends: Sequence[str] | None = None,
                          rtol: float = 1e-6, atol: float = 1e-8, grads: bool = True,
                          wrt: Sequence[int] | None = None, seed: int = 0) -> dict[str, tuple]:
    """Run ``fn`` on every backend and check outputs (and gradients) agree with the first one.

    ``backends`` defaults to every available backend.  Inputs are float64 host data moved to each
    backend.  Raises ConformanceError naming both backends, what differs and the largest error.
    Returns ``{backend: (output, [gradients])}`` as numpy arrays.
    """
    names = list(backends) if backends is not None else _available_backends()
    if len(names) < 2:
        raise ConformanceError(f"assert_backends_agree needs at least two backends, got {names}")
    arrays = [_host(x) for x in inputs]
    results: dict[str, tuple] = {}
    for name in names:
        if grads:
            arrays64, diff = _prepare(arrays, wrt)
            if any(diff):
                results[name] = vjp_grads(fn, arrays64, None, wrt, name, seed)
                continue
        with no_grad():
            out, _ = _call_any(fn, arrays, name)
        results[name] = (out, [])
    ref_name = names[0]
    ref_out, ref_grads = results[ref_name]
    problems = []
    for name in names[1:]:
        out, gs = results[name]
        ok, err, where = compare(out, ref_out, rtol, atol)
        if not ok:
            problems.append(_explain(f"output on {name!r} vs {ref_name!r}", np.asarray(out), np.asarray(ref_out),
                                     err, where, rtol, atol, name, ref_name))
        for i, (g, rg) in enumerate(zip(gs, ref_grads)):
            if g is None or rg is None:
                continue
            ok, err, where = compare(g, rg, rtol, atol)
            if not ok:
                problems.append(_explain(f"gradient of input {i} on {name!r} vs {ref_name!r}", g, rg, err,
                                         where, rtol, atol, name, ref_name))
    if problems:
        raise ConformanceError("backends disagree: " + "; ".join(problems))
    return results


def _call_any(fn: Fn, arrays: Sequence[np.ndarray], backend: str) -> tuple[np.ndarray, list]:
    """Forward only, any output dtype (used when there is nothing to differentiate)."""
    out = fn(*[tensor(a, backend=backend) for a in arrays])
    if not isinstance(out, Tensor):
        raise DTypeError(f"polygrad.testing: fn must return a polygrad Tensor, got {type(out).__name__}")
    return out.numpy(), []
