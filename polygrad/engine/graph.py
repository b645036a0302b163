"""The define-by-run graph: one Node per recorded op application, and its topological order.

A Node belongs to the tensor it produced (``t._node``) and points only *backwards* at its inputs,
so the graph has no reference cycles: dropping the last tensor frees it by reference counting.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..ir.ops import Op

if TYPE_CHECKING:
    from ..tensor import Tensor


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

    def _from_host(self, host: np.ndarray) -> Any:
        """``host`` (a numpy array) as a plain dense tensor on this tensor's backend."""
        be = self._be
        return self._new(be.from_numpy(host), be, host.shape, host.dtype)


class Node:
    """op, its inputs (a tuple, in order), attrs, the layout its kernel ran in.

    ``scalar`` holds a scalar decomposition (input Values, output Values) when the op was computed
    by fallback: its gradient then comes from ``Value.backward`` over that decomposition, not
    from the VJP rule.  ``inputs`` is set to None once the backward pass has consumed the node
    (unless retain_graph), which frees everything it kept alive.
    """

    __slots__ = ("op", "inputs", "attrs", "layout", "backend", "scalar", "made_by", "made_at", "__weakref__")

    def __init__(self, op: Op, inputs: tuple, attrs: dict, layout: str, backend: Any,
                 scalar: Any = None):
        self.op = op
        self.inputs: tuple | None = inputs
        self.attrs = attrs
        self.layout = layout
        self.backend = backend
        self.scalar = scalar
        #: the pg.compile default-mode call that made this node (its Cursor's token; None: none),
        #: and the position of its op in that call (``made_at``, set with it)
        self.made_by: Any = None
        self.made_at = -1

    def free(self) -> None:
        self.inputs = None
        self.scalar = None

    def __repr__(self) -> str:  # in error messages and debuggers: which op, and whether backward freed it
        return f"Node({self.op}, layout={self.layout!r}, freed={self.inputs is None})"


#: ``(op, needs) -> which inputs' data the op's gradient reads`` (None: all of them), and the ops
#: whose gradient reads their own output: set by ``polygrad.engine.grad_rules``, which owns the rules.
#: Until it is imported every input is kept whole.
data_needed: "Callable[[Op, tuple[bool, ...]], tuple[bool, ...] | None] | None" = None
reads_output: "frozenset[Op]" = frozenset()


def graph_key(t: Any) -> int:
    """The identity autodiff knows a tensor by: its node when it has one, so a tensor and its
    data-less stand-in (:func:`saved_inputs`) are one vertex of the graph."""
    node = t._node
    return id(node) if node is not None else id(t)


def saved_inputs(op: Op, inputs: tuple) -> tuple:
    """The inputs a new node keeps: each one whose data its gradient will never read is replaced
    by a data-less stand-in (same node, shape, dtype, backend), so the intermediate's array is
    freed as soon as the forward pass no longer uses it -- a GCN's ``x @ W``, ``A @ xW`` and
    pre-ReLU activations (256 MB each at 1M x 64 float32) no longer wait for backward.

    Only results of recorded ops (non-leaves) are replaced: a leaf is the user's, and its
    ``.grad`` is delivered to that very object.  An input whose own gradient reads its output
    (relu, exp, tanh...) is kept whole."""
    needed = data_needed(op, tuple(t.requires_grad for t in inputs)) if data_needed else None
    if needed is None:
        return inputs
    kept = []
    for t, need in zip(inputs, needed):
        node = t._node
        if need or node is None or node.op in reads_output or t._data is None:
            kept.append(t)
            continue
        kept.append(stand_in(t))
    return tuple(kept)


def stand_in(t: Any) -> Any:
    """A data-less tensor standing for the recorded result ``t`` in the graph (same node, so the
    same :func:`graph_key`; same shape, dtype, backend and name)."""
    s = t._new(None, t._be, t.shape, t.dtype)
    s.requires_grad = True
    s._node = t._node
    s.name = t.name
    return s


def toposort(roots: "list[Tensor]") -> "list[Tensor]":
    """Tensors reachable from ``roots`` through recorded nodes, inputs before consumers.

    Iterative (no recursion limit) and deterministic: inputs are visited in their tuple order.
    Only tensors that require grad are followed, so the order covers exactly the nodes that lead
    to leaves needing gradients.
    """
    order: list = []
    seen: set[int] = set()  # graph_key: a tensor and its data-less stand-in are visited once
    stack: list = [(r, False) for r in reversed(roots)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        key = graph_key(t)
        if key in seen:
            continue
        seen.add(key)
        node = t._node
        if node is None:
            continue
        stack.append((t, True))
        inputs = node.inputs
        if inputs is None:
            continue  # freed: autodiff reports it when it reaches this tensor
        for inp in reversed(inputs):
            if inp.requires_grad and inp._node is not None and graph_key(inp) not in seen:
                stack.append((inp, False))
    return order
