"""The conformance kit's edge-point set: gradients where calculus is undefined or one-sided.

Numerical differentiation cannot check these points (a central difference straddles the kink),
so each case carries the gradient PyTorch returns there -- the convention users port code from.
The values were produced with ``torch 2.13`` (``tests/reliability/test_edge_gradients.py``
re-derives them from torch when it is installed, so a drift is caught).

A backend author runs them with::

    from polygrad.testing.edges import check_edge_points
    assert check_edge_points("mybackend") == []

Every case runs through the public ops (so composites such as ``clip`` and ``abs`` are covered
as users call them) and compares every input's gradient, NaN and the sign of infinity included;
where a case carries PyTorch's forward value too (the losses and normalisers at non-finite
inputs), that is compared as well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

INF = math.inf
NAN = math.nan


@dataclass(frozen=True)
class EdgeCase:
    """``fn(*tensors)`` summed and differentiated at ``inputs``; ``grads`` is PyTorch's answer
    (and ``value``, when given, PyTorch's ``fn(*tensors)`` before the sum)."""
    name: str
    fn: Callable
    inputs: tuple
    grads: tuple
    torch_fn: Callable | None = None   # the same computation in torch (for the drift check)
    value: object = None


# The losses and normalisers, called as users call them (polygrad imported when a case runs, torch
# only by the drift check): a row whose max is +-inf is NaN throughout in softmax, log_softmax and
# cross_entropy (PyTorch's kernels shift by the plain max), while logsumexp replaces a non-finite
# max by 0 (as torch.logsumexp), so a +inf entry gives +inf.
def _pg():
    import polygrad
    return polygrad


def _torch():
    import torch
    return torch


def _classes(*t):
    return _torch().tensor(list(t))


def _ce(x, t=(0,), red="mean"):
    return _pg().cross_entropy(x, list(t), reduction=red)


def _torch_ce(x, t=(0,), red="mean"):
    return _torch().nn.functional.cross_entropy(x, _classes(*t), reduction=red)


def _ce_options(x, t, weight=None, **kwargs):
    """cross_entropy with PyTorch's options (class weight, ignore_index, label_smoothing)."""
    w = None if weight is None else np.asarray(weight, dtype=np.float64)
    return _pg().cross_entropy(x, np.asarray(t), w, **kwargs)


def _torch_ce_options(x, t, weight=None, **kwargs):
    torch = _torch()
    target = torch.tensor(np.asarray(t))
    w = None if weight is None else torch.tensor(weight, dtype=torch.float64)
    return torch.nn.functional.cross_entropy(x, target, w, **kwargs)


def _graph_layer_norm(x):
    from polygrad.nn import LayerNorm
    return LayerNorm(x.shape[1], affine=False, backend=x.backend)(x)


def _torch_graph_layer_norm(x):  # torch_geometric.nn.LayerNorm(mode="graph") without batch
    x = x - x.mean()
    return x / (x.std(unbiased=False) + 1e-5)


def _nll_none_counted(x):
    from polygrad.nn import nll_loss
    return nll_loss(x, [-100, -100], reduction="none")


EDGE_CASES: tuple[EdgeCase, ...] = (
    EdgeCase("pow-zero-exponent-at-zero", lambda x: x ** 0.0, ([0.0, -0.0, 2.0],), ([0.0, 0.0, 0.0],)),
    EdgeCase("pow-tensor-zero-exponent", lambda x, y: x ** y, ([0.0, 0.0], [0.0, 0.0]),
             ([0.0, 0.0], [0.0, 0.0])),
    EdgeCase("pow-zero-base-d-exponent", lambda x, y: x ** y, ([0.0, 0.0, 0.0], [0.0, 2.0, -1.0]),
             ([0.0, 0.0, -INF], [0.0, 0.0, -INF])),
    EdgeCase("rpow-zero-base", lambda y: 0.0 ** y, ([0.0, 1.0, 3.0],), ([0.0, 0.0, 0.0],)),
    EdgeCase("pow-square-at-zero", lambda x: x ** 2.0, ([0.0],), ([0.0],)),
    EdgeCase("pow-negative-exponent-at-zero", lambda x: x ** -1.0, ([0.0],), ([-INF],)),
    EdgeCase("sqrt-at-zero", lambda x: x.sqrt(), ([0.0],), ([INF],)),
    EdgeCase("log-at-zero", lambda x: x.log(), ([0.0],), ([INF],)),
    EdgeCase("reciprocal-at-zero", lambda x: x.reciprocal(), ([0.0],), ([-INF],)),
    EdgeCase("relu-at-zero", lambda x: x.relu(), ([0.0, -0.0],), ([0.0, 0.0],)),
    EdgeCase("abs-at-zero", lambda x: x.abs(), ([0.0],), ([0.0],)),
    EdgeCase("clip-at-bounds", lambda x: x.clip(0.0, 1.0), ([-1.0, 0.0, 0.5, 1.0, 2.0],),
             ([0.0, 1.0, 1.0, 1.0, 0.0],), lambda x: x.clamp(0.0, 1.0)),
    EdgeCase("clip-tensor-bound", lambda x, lo: x.clip(lo), ([-1.0, 3.0, 0.0], [0.0, 0.0, 0.0]),
             ([0.0, 1.0, 1.0], [1.0, 0.0, 0.0]), lambda x, lo: x.clamp(min=lo)),
    EdgeCase("maximum-tie", lambda a, b: a.maximum(b), ([1.0], [1.0]), ([0.5], [0.5]),
             lambda a, b: a.maximum(b)),
    EdgeCase("minimum-tie", lambda a, b: a.minimum(b), ([0.0], [0.0]), ([0.5], [0.5]),
             lambda a, b: a.minimum(b)),
    EdgeCase("max-reduce-ties", lambda x: x.max(), ([1.0, 1.0, 0.0],), ([0.5, 0.5, 0.0],),
             lambda x: x.amax()),
    EdgeCase("relu-nan", lambda x: x.relu(), ([NAN],), ([1.0],)),
    EdgeCase("maximum-nan", lambda a, b: a.maximum(b), ([NAN, 1.0], [1.0, NAN]), ([1.0, 1.0], [1.0, 1.0]),
             lambda a, b: a.maximum(b)),
    EdgeCase("abs-nan", lambda x: x.abs(), ([NAN],), ([0.0],)),
    EdgeCase("clip-nan", lambda x: x.clip(0.0, 1.0), ([NAN],), ([0.0],), lambda x: x.clamp(0.0, 1.0)),
    EdgeCase("max-reduce-nan", lambda x: x.max(), ([NAN, 1.0],), ([1.0, 0.0],), lambda x: x.max()),
    EdgeCase("tanh-saturated", lambda x: x.tanh(), ([40.0, -40.0],), ([0.0, 0.0],)),
    EdgeCase("exp-underflow", lambda x: x.exp(), ([-1000.0],), ([0.0],)),
    EdgeCase("cross-entropy-inf-logit", _ce, ([[INF, 0.0]],), ([[NAN, NAN]],), _torch_ce, value=NAN),
    EdgeCase("cross-entropy-inf-logit-other-class", lambda x: _ce(x, (1,)), ([[INF, 0.0]],), ([[NAN, NAN]],),
             lambda x: _torch_ce(x, (1,)), value=NAN),
    EdgeCase("cross-entropy-rows-apart", lambda x: _ce(x, (1, 0), "none"),
             ([[INF, 0.0, 1.0], [0.5, -INF, 2.0]],),
             ([[NAN, NAN, NAN], [-0.8175744761936437, 0.0, 0.8175744761936437]],),
             lambda x: _torch_ce(x, (1, 0), "none"), value=[NAN, 1.7014132779827524]),
    EdgeCase("cross-entropy-all-neg-inf-row", lambda x: _ce(x, (1, 0), "none"), ([[-INF, -INF], [0.5, -INF]],),
             ([[NAN, NAN], [0.0, 0.0]],), lambda x: _torch_ce(x, (1, 0), "none"), value=[NAN, 0.0]),
    EdgeCase("log-softmax-inf", lambda x: _pg().log_softmax(x, -1), ([[INF, 0.0]],), ([[NAN, NAN]],),
             lambda x: x.log_softmax(-1), value=[[NAN, NAN]]),
    EdgeCase("log-softmax-neg-inf", lambda x: _pg().log_softmax(x, -1), ([[-INF, -INF], [-INF, 0.0]],),
             ([[NAN, NAN], [1.0, -1.0]],), lambda x: x.log_softmax(-1), value=[[NAN, NAN], [-INF, 0.0]]),
    EdgeCase("softmax-inf", lambda x: _pg().softmax(x, -1), ([[INF, 0.0]],), ([[NAN, NAN]],),
             lambda x: x.softmax(-1), value=[[NAN, NAN]]),
    EdgeCase("logsumexp-non-finite", lambda x: _pg().logsumexp(x, -1), ([[INF, 0.0], [-INF, -INF]],),
             ([[NAN, 0.0], [NAN, NAN]],), lambda x: x.logsumexp(-1), value=[INF, -INF]),
    EdgeCase("softmax-empty-axis", lambda x: _pg().softmax(x, 0), (np.zeros((0, 3)),), (np.zeros((0, 3)),),
             lambda x: x.softmax(0), value=np.zeros((0, 3))),
    EdgeCase("logsumexp-empty-axis", lambda x: _pg().logsumexp(x, 0), (np.zeros((0, 3)),), (np.zeros((0, 3)),),
             lambda x: x.logsumexp(0), value=[-INF, -INF, -INF]),
    EdgeCase("nll-loss-no-counted-row", _nll_none_counted, ([[1.0, 2.0], [3.0, 4.0]],), ([[0.0, 0.0], [0.0, 0.0]],),
             lambda x: _torch().nn.functional.nll_loss(x, _classes(-100, -100), reduction="none"),
             value=[0.0, 0.0]),
    EdgeCase("layer-norm-graph-constant", _graph_layer_norm, ([[1.0, 1.0], [1.0, 1.0]],), ([[0.0, 0.0], [0.0, 0.0]],),
             _torch_graph_layer_norm, value=[[0.0, 0.0], [0.0, 0.0]]),
    EdgeCase("elu-nan", lambda x: _pg().elu(x), ([NAN, 0.0, -1.0],), ([1.0, 1.0, 0.36787944117144233],),
             lambda x: _torch().nn.functional.elu(x), value=[NAN, 0.0, -0.6321205588285577]),
    EdgeCase("elu-expm1-near-zero", lambda x: _pg().elu(x), ([-1e-8, -0.0, -1e-300],),
             ([0.9999999900000001, 1.0, 1.0],),
             lambda x: _torch().nn.functional.elu(x), value=[-9.999999950000001e-09, -0.0, -1e-300]),
    EdgeCase("cross-entropy-all-ignored-weighted-mean", lambda x: _ce_options(x, (-100, -100), (1.0, 2.0)),
             ([[1.0, 2.0], [3.0, 4.0]],), ([[0.0, 0.0], [0.0, 0.0]],),
             lambda x: _torch_ce_options(x, (-100, -100), (1.0, 2.0)), value=NAN),
    EdgeCase("cross-entropy-smoothing-neg-inf-logit",
             lambda x: _ce_options(x, (0, 1), label_smoothing=0.1, reduction="none"), ([[0.0, -INF], [1.0, 2.0]],),
             ([[0.04999999999999993, -0.05], [0.21894142136999512, -0.21894142136999517]],),
             lambda x: _torch_ce_options(x, (0, 1), label_smoothing=0.1, reduction="none"),
             value=[INF, 0.3632616875182229]),
    EdgeCase("cross-entropy-smoothing-zero-weight-neg-inf",  # 0 * -inf in the smoothing sum: NaN, as torch
             lambda x: _ce_options(x, (0, 1), (1.0, 0.0), label_smoothing=0.2), ([[0.0, -INF], [1.0, 2.0]],),
             ([[0.0, 0.0], [-0.07310585786300049, 0.07310585786300049]],),
             lambda x: _torch_ce_options(x, (0, 1), (1.0, 0.0), label_smoothing=0.2), value=NAN),
    EdgeCase("cross-entropy-smoothing-inf-logit-ignored-row",
             lambda x: _ce_options(x, (0, -100), label_smoothing=0.1, reduction="sum"), ([[INF, 0.0], [1.0, 2.0]],),
             ([[NAN, NAN], [0.0, 0.0]],),
             lambda x: _torch_ce_options(x, (0, -100), label_smoothing=0.1, reduction="sum"), value=NAN),
    EdgeCase("relu-neg-inf", lambda x: x.relu(), ([-INF, -2.0, -0.0],), ([0.0, 0.0, 0.0],), value=[0.0, 0.0, -0.0]),
)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    both_nan = np.isnan(got) & np.isnan(want)
    close = np.isclose(got, want, rtol=1e-9, atol=1e-12)  # inf == inf of the same sign
    return bool(np.all(both_nan | close))


def check_edge_point(backend: str, case: EdgeCase) -> str | None:
    """None when ``backend``'s gradients match PyTorch's at this case, else a message."""
    import warnings

    import polygrad as pg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf/nan in the forward are the point
        xs = [pg.tensor(np.asarray(a, dtype=np.float64), requires_grad=True, backend=backend)
              for a in case.inputs]
        out = case.fn(*xs)
        out.sum().backward()
    if case.value is not None:
        got = out.numpy().astype(np.float64)
        if not _same(got, np.asarray(case.value, dtype=np.float64)):
            return (f"edge case {case.name!r} on backend {backend!r}: value at {list(case.inputs[0])} is "
                    f"{got.tolist()}, PyTorch gives {case.value}")
    for i, (x, want) in enumerate(zip(xs, case.grads)):
        got = np.zeros(x.shape) if x.grad is None else x.grad.numpy().astype(np.float64)
        if not _same(got, np.asarray(want, dtype=np.float64)):
            return (f"edge case {case.name!r} on backend {backend!r}: gradient of input {i} at "
                    f"{list(case.inputs[i])} is {got.tolist()}, PyTorch gives {list(want)}")
    return None


def check_edge_points(backend: str, cases: Sequence[EdgeCase] = EDGE_CASES) -> list[str]:
    """Messages for every edge case whose gradients on ``backend`` differ from PyTorch's (empty: all agree)."""
    failures = []
    for case in cases:
        try:
            message = check_edge_point(backend, case)
        except Exception as exc:  # noqa: BLE001 - a backend that raises fails the case, by name
            message = f"edge case {case.name!r} on backend {backend!r} raised {type(exc).__name__}: {exc}"
        if message is not None:
            failures.append(message)
    return failures
