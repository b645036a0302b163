"""The define-by-run graph: one Node per recorded op application, and its topological order.

A Node belongs to the tensor it produced (``t._node``) and points only *backwards* at its inputs,
so the graph has no reference cycles: dropping the last tensor frees it by reference counting.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .ops import Op

if TYPE_CHECKING:
    from .tensor import Tensor


class TensorBase:
    """What the graph is made of: the layers below the user-facing :class:`polygrad.Tensor`
    (dispatch, the gradient rules, the autodiff engine) know tensors by this type, so they never
    import the Tensor module above them.  ``t._new(data, backend, shape, dtype)`` makes a plain
    dense tensor (never a subclass), the way dispatch makes each op's output."""

    __slots__ = ()
    _new: Any  # set to Tensor._make by polygrad.tensor

    # The slots polygrad.Tensor declares, typed here for the layers that know tensors by this type.
    _data: Any  # the backend's array
    _be: Any  # the Backend that owns _data
    shape: tuple[int, ...]
    dtype: np.dtype
    requires_grad: bool
    grad: Any  # None, or a tensor of the same shape (sparse for a sparse leaf)
    _node: Node | None  # the op that produced this tensor; None for a leaf
    name: str | None


class Node:
    """op, its inputs (a tuple, in order), attrs, the layout its kernel ran in.

    ``scalar`` holds a scalar decomposition (input Values, output Values) when the op was computed
    by fallback: its gradient then comes from ``Value.backward`` over that decomposition, not
    from the VJP rule.  ``inputs`` is set to None once the backward pass has consumed the node
    (unless retain_graph), which frees everything it kept alive.
    """

    __slots__ = ("op", "inputs", "attrs", "layout", "backend", "scalar", "__weakref__")

    def __init__(self, op: Op, inputs: tuple, attrs: dict, layout: str, backend: Any,
                 scalar: Any = None):
        self.op = op
        self.inputs: tuple | None = inputs
        self.attrs = attrs
        self.layout = layout
        self.backend = backend
        self.scalar = scalar

    def free(self) -> None:
        self.inputs = None
        self.scalar = None

    def __repr__(self) -> str:
        return f"Node({self.op}, layout={self.layout!r}, freed={self.inputs is None})"


def toposort(roots: "list[Tensor]") -> "list[Tensor]":
    """Tensors reachable from ``roots`` through recorded nodes, inputs before consumers.

    Iterative (no recursion limit) and deterministic: inputs are visited in their tuple order.
    Only tensors that require grad are followed, so the order covers exactly the nodes that lead
    to leaves needing gradients.
    """
    order: list = []
    seen: set[int] = set()
    stack: list = [(r, False) for r in reversed(roots)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        node = t._node
        if node is None:
            continue
        stack.append((t, True))
        inputs = node.inputs
        if inputs is None:
            continue  # freed: autodiff reports it when it reaches this tensor
        for inp in reversed(inputs):
            if inp.requires_grad and inp._node is not None and id(inp) not in seen:
                stack.append((inp, False))
    return order
