"""Softmax cross-entropy, the steps of primitives ``Op.CROSS_ENTROPY`` (integer classes) and
``Op.SOFT_CROSS_ENTROPY`` (class probabilities).

``pg.cross_entropy(logits, target)`` is defined by its composite (``tensor/losses.py``:
``log_softmax`` with a detached max shift, a gather of each row's class, negation, the
reduction): 12 dispatched ops forward and their rules backward.  The primitive runs that very
sequence of primitive steps as one op -- :func:`loss` and :func:`logits_grad` below, written
once over a :class:`Steps` object -- so that

* the VJP rule (``grad_rules._cross_entropy_rule``) runs them with ``apply`` (differentiable
  again, for ``create_graph``),
* a backend's forward kernel and fused backward run them over its own raw kernels
  (``backends/cross_entropy_kernels.py``), with no dispatch in between,

and all of them make the composite's kernel calls on the same arrays in the same order: the
same bits, signed zeros, NaNs and floating-point warnings included (the backward is the
composite's backward, step for step: the rules of neg, add, log, exp, sum, getitem and mul, and
autodiff's one unbroadcast sum).  ``tests/unit/test_cross_entropy_op.py`` checks it bitwise
against the composite with generated logits (infinities, NaNs, ties, one class, no rows).

Target classes are an attribute (an int64 array ``[N]``, validated by the caller like a
getitem index), ``reduction`` is "mean", "sum" or "none".

Class probabilities (PyTorch's "target of the input's shape") are the second input of
``Op.SOFT_CROSS_ENTROPY``: :func:`soft_loss` and :func:`soft_grads` are the steps of the
composite ``-(log_softmax(x) * probs).sum(-1)``, reduced, and of its backward (the rules of mul,
sum, neg and ``log_softmax``'s ops), gradients for both inputs
(``tests/unit/test_soft_cross_entropy_op.py``, bitwise against the composite).
"""
from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

REDUCTIONS = ("mean", "sum", "none")


class Steps(Protocol):
    """The primitive steps the computation is made of: ``apply`` of each op (the rule), or a
    backend's raw kernel for it (a fused kernel).  ``const(like, value)`` is a 0-d constant of
    ``like``'s dtype; ``detached(x)`` is ``x`` with no gradient flowing through it."""

    def neg(self, x: Any) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def maximum(self, a: Any, b: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def where(self, c: Any, a: Any, b: Any) -> Any: ...
    def exp(self, x: Any) -> Any: ...
    def log(self, x: Any) -> Any: ...
    def reciprocal(self, x: Any) -> Any: ...
    def sum(self, x: Any, axes: tuple, keepdims: bool) -> Any: ...
    def max(self, x: Any, axes: tuple, keepdims: bool) -> Any: ...
    def getitem(self, x: Any, index: tuple) -> Any: ...
    def index_add(self, x: Any, index: tuple, shape: tuple) -> Any: ...
    def expand(self, x: Any, shape: tuple) -> Any: ...
    def reshape(self, x: Any, shape: tuple) -> Any: ...
    def const(self, like: Any, value: float) -> Any: ...
    def detached(self, x: Any) -> Any: ...


def picked_index(target: np.ndarray) -> tuple:
    """The getitem index of each row's target class, as ``logp[np.arange(N), target]`` normalises it."""
    return (np.arange(target.shape[0], dtype=np.int64), target)


def mean_scale(n: int) -> float:
    """What ``losses.mean()`` multiplies the sum by (NaN for no rows, as the composite)."""
    return 1.0 / n if n else math.nan


def _shifted(x: Any, k: Steps) -> Any:
    """``x - max``: the max of each row (detached), the steps of ``reductions._row_max`` and the
    subtraction in ``log_softmax`` (a row whose max is +inf or -inf turns NaN, as in PyTorch)."""
    return k.add(x, k.neg(k.max(k.detached(x), (1,), True)))


def _exp_sum(shifted: Any, k: Steps, keep: dict | None = None) -> tuple[Any, Any]:
    """``exp(shifted)`` and its row sums, also put in ``keep`` (a forward's, for a backward that
    takes them as ``saved`` instead of recomputing them)."""
    e = k.exp(shifted)
    s = k.sum(e, (1,), True)
    if keep is not None:
        keep.update(e=e, s=s)
    return e, s


def loss(x: Any, target: np.ndarray, reduction: str, k: Steps, keep: dict | None = None) -> Any:
    """The loss of logits ``x [N, C]`` at classes ``target``: ``[N]`` for "none", else ``()``.
    ``keep`` (a dict) receives the forward's ``exp(shifted)`` and its row sums as ``"e"`` and
    ``"s"``, which :func:`logits_grad` takes instead of recomputing them (as :func:`soft_loss`)."""
    shifted = _shifted(x, k)
    _, s = _exp_sum(shifted, k, keep)
    losses = k.neg(k.getitem(_logp(shifted, s, k), picked_index(target)))
    if reduction == "none":
        return losses
    total = k.sum(losses, (0,), False)
    return k.mul(total, k.const(total, mean_scale(target.shape[0]))) if reduction == "mean" else total


def logits_grad(g: Any, x: Any, target: np.ndarray, reduction: str, k: Steps, saved: tuple | None = None) -> Any:
    """``dx`` from the loss's gradient ``g``: the composite's backward, rule by rule (the
    exponentials recomputed, or the forward's own ``(e, s)``, ``saved`` from :func:`loss`'s
    ``keep``: the same bits either way)."""
    n, c = x.shape
    e, s = _recomputed(x, k) if saved is None else saved
    g = _row_upstream(g, x, reduction, k)
    d_logp = k.index_add(k.neg(g), picked_index(target), (n, c))  # neg rule, getitem rule
    return _log_softmax_grad(d_logp, e, s, n, c, k)


def _row_upstream(g: Any, x: Any, reduction: str, k: Steps) -> Any:
    """Each row's upstream gradient ``[N]`` from the loss's: the reduction's rules (the mean's mul
    by the forward's constant, of the loss's dtype, then the sum's expand)."""
    n = x.shape[0]
    if reduction == "mean":
        g = k.mul(g, k.const(x, mean_scale(n)))
    return g if reduction == "none" else k.expand(g, (n,))


def _recomputed(x: Any, k: Steps) -> tuple[Any, Any]:
    """The forward's ``exp(shifted)`` and its row sums, recomputed for a backward: the same kernels
    on the same arrays give the forward's bits.  Its floating-point warnings were the forward's
    (the composite's backward does not recompute, so it does not warn again), and a backward run
    under ``np.errstate(invalid="raise")`` must not fail where the composite's would not."""
    with np.errstate(all="ignore"):
        return _exp_sum(_shifted(x, k), k)


def _log_softmax_grad(d_logp: Any, e: Any, s: Any, n: int, c: int, k: Steps) -> Any:
    """``d shifted`` from ``d logp [n, c]``: ``log_softmax``'s ops' rules (``e = exp(shifted)``,
    ``s`` its row sums), which is ``dx`` (the max shift is detached)."""
    # logp = shifted + (-log s): add's rule gives d_logp to both; unbroadcast sums it to [N, 1]
    d_log = d_logp if c == 1 else k.sum(d_logp, (1,), True)
    d_s = k.mul(k.neg(d_log), k.reciprocal(s))  # neg rule, log rule
    d_e = d_s if c == 1 else k.expand(d_s, (n, c))  # sum rule
    return k.add(d_logp, k.mul(d_e, e))  # exp rule; the two paths into ``shifted`` accumulate


def _logp(shifted: Any, s: Any, k: Steps) -> Any:
    """``log_softmax``'s last steps: ``shifted - log(s)``, ``s`` the row sums of ``exp(shifted)``."""
    return k.add(shifted, k.neg(k.log(s)))


def soft_loss(x: Any, probs: Any, reduction: str, k: Steps, keep: dict | None = None) -> Any:
    """The loss of logits ``x [N, C]`` at class probabilities ``probs [N, C]`` (the composite
    ``-(log_softmax(x) * probs).sum(-1)``, then the reduction): ``[N]`` for "none", else ``()``.
    ``keep`` (a dict) receives the forward's ``exp(shifted)`` and its row sums as ``"e"`` and
    ``"s"``, which :func:`soft_grads` takes instead of recomputing them (a backend that can hold
    them from its forward to its backward)."""
    shifted = _shifted(x, k)
    _, s = _exp_sum(shifted, k, keep)
    losses = k.neg(k.sum(k.mul(_logp(shifted, s, k), probs), (1,), False))
    if reduction == "none":
        return losses
    total = k.sum(losses, (0,), False)
    return k.mul(total, k.const(total, mean_scale(x.shape[0]))) if reduction == "mean" else total


def soft_grads(g: Any, x: Any, probs: Any, reduction: str, needs: tuple, k: Steps,
               saved: tuple | None = None) -> tuple:
    """``(dx, dprobs)`` from the loss's gradient ``g`` (None where ``needs`` says no): the
    composite's backward, rule by rule (the exponentials, and ``logp`` for ``dprobs``, recomputed:
    the same kernels on the same arrays give the forward's bits; or the forward's own ``(e, s)``,
    ``saved`` from :func:`soft_loss`'s ``keep``: the same bits, without the recomputation)."""
    n, c = x.shape
    e, s = _recomputed(x, k) if saved is None else saved
    g = _row_upstream(g, x, reduction, k)
    # neg rule, then the row sum's rule: its axis put back as size 1, expanded to the terms
    d_terms = k.reshape(k.neg(g), (n, 1))
    if c != 1:
        d_terms = k.expand(d_terms, (n, c))
    dx = _log_softmax_grad(k.mul(d_terms, probs), e, s, n, c, k) if needs[0] else None  # mul rule
    if not needs[1]:
        return dx, None
    with np.errstate(all="ignore"):  # recomputed (the forward warned)
        logp = _logp(_shifted(x, k), s, k)
    return dx, k.mul(d_terms, logp)
