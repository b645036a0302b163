"""``materialize``: run the pending work of tensors on lazy backends, once, and keep the results.

A lazy backend (``Backend.lazy``, e.g. one building Dask task graphs) only records work when an
op runs; the work is done when a value is read.  A parameter updated step after step would then
carry the whole training history in its graph.  :func:`materialize` computes a set of tensors in
one go -- their common work (the forward pass shared by the loss and the gradients) once -- and
replaces their storage by the computed arrays, which stay where the backend keeps them (a GPU, a
cluster's workers).  Optimizers and ``fit`` call it once per step; on eager backends it returns
at once.  ``wait=False`` starts the work and returns before it is done (``Backend.submit``): ``fit``
builds the next epoch's step while the workers still run this one's.
"""
from __future__ import annotations

from typing import Any

from .tensor_class import Tensor
from .sparse_routing import is_sparse

__all__ = ["materialize"]


def _dense(t: Any) -> Tensor | None:
    """The dense tensor holding ``t``'s numbers (a sparse tensor's values), or None."""
    if not isinstance(t, Tensor):
        return None
    return t.values if is_sparse(t) else t


def materialize(*tensors: Any, wait: bool = True) -> None:
    """Compute ``tensors`` (``None`` and non-tensors are skipped) on their lazy backends, in place.

    Values do not change; only pending work is done and dropped from the tensors' storage.  With
    ``wait=False`` the work is started and this returns at once (``Backend.submit``); reading a
    value, or ``materialize`` of the same tensors with ``wait=True``, then waits for it, and the
    latter reports a failure of the started work as the backend's error."""
    groups: dict[int, tuple[Any, list[Tensor]]] = {}
    seen: set[int] = set()
    for t in tensors:
        d = _dense(t)
        if d is None or not d._be.lazy or id(d) in seen:
            continue
        seen.add(id(d))
        groups.setdefault(id(d._be), (d._be, []))[1].append(d)
    for be, ts in groups.values():
        run = be.materialize if wait else be.submit
        for t, array in zip(ts, run([t._data for t in ts])):
            t._data = array
