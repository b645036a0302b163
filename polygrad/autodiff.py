"""Reverse-mode autodiff: ``backward()`` and ``pg.grad()`` over the recorded graph.

One engine serves both: it orders the tensors that lead to leaves needing gradients
(``graph.toposort``, iterative and deterministic), runs each node's VJP in reverse order,
accumulates with ``+`` in a fixed order, undoes broadcasting in exactly one place
(:func:`unbroadcast`) and frees each node as soon as it has been used unless ``retain_graph``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence

from . import grad_rules
from .dispatch import _grad_enabled, registry
from .errors import GraphError, ShapeError
from .graph import toposort
from .ops import Op
from .value import backward_many, Value

if TYPE_CHECKING:
    from .tensor import Tensor


@contextmanager
def no_grad() -> Iterator[None]:
    """Ops inside record no graph (inference, optimizer updates)."""
    token = _grad_enabled.set(False)
    try:
        yield
    finally:
        _grad_enabled.reset(token)


@contextmanager
def enable_grad() -> Iterator[None]:
    token = _grad_enabled.set(True)
    try:
        yield
    finally:
        _grad_enabled.reset(token)


def _grad_mode(enabled: bool):
    return enable_grad() if enabled else no_grad()


def unbroadcast(g: "Tensor", shape: tuple) -> "Tensor":
    """Sum ``g`` down to ``shape``: the one place broadcasting is undone."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead < 0:
        raise ShapeError(f"internal: gradient of shape {g.shape} cannot reduce to {shape}")
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape) if g.shape != shape else g


def _scalar_vjp(node, out: "Tensor", g: "Tensor") -> tuple:
    """Gradient of an op computed by fallback: ``Value.backward`` over its decomposition."""
    from .tensor import tensor_from_numpy

    leaves, outs = node.scalar
    if any(isinstance(x, Value) and x.grad for items in leaves for x in items):
        raise GraphError(f"op '{node.op}' was computed by scalar fallback; its decomposition can be "
                         "backpropagated once (recompute the forward to differentiate again)")
    seeds = g._be.to_numpy(g._data).ravel().tolist()
    pairs = [(o, s) for o, s in zip(outs, seeds) if isinstance(o, Value)]
    backward_many([o for o, _ in pairs], [s for _, s in pairs])
    grads = []
    for items, inp in zip(leaves, node.inputs):
        if not inp.requires_grad or not items or not isinstance(items[0], Value):
            grads.append(None)
            continue
        import numpy as np
        arr = np.asarray([v.grad for v in items], dtype=inp.dtype).reshape(inp.shape)
        grads.append(tensor_from_numpy(arr, inp._be))
    return tuple(grads)


def _fused_vjp(node, out: "Tensor", g: "Tensor"):
    """The backend's fused backward kernel for this node, if it has one (None otherwise)."""
    vjps = registry.vjp_tables.get(node.backend.name)
    if not vjps:
        return None
    kernel = vjps.get((node.op, node.layout))
    if kernel is None:
        return None
    from .tensor import Tensor
    from .dispatch import report_fallback
    be = node.backend
    needs = tuple(t.requires_grad for t in node.inputs)
    try:
        arrays = kernel(g._data, *[t._data for t in node.inputs], needs=needs, **node.attrs)
        grads = []
        for t, arr, need in zip(node.inputs, arrays, needs):
            if not need or arr is None:
                grads.append(None)
                continue
            if be.shape(arr) != t.shape:
                raise ValueError(f"fused backward of '{node.op}' returned shape {be.shape(arr)} for an "
                                 f"input of shape {t.shape}")
            grads.append(Tensor._make(arr, be, t.shape, be.dtype(arr)))
        return tuple(grads)
    except Exception as exc:  # noqa: BLE001 - a failing fused kernel: use the VJP rule instead
        from .errors import PolygradError
        if isinstance(exc, PolygradError):
            raise
        report_fallback(node.op, be, node.layout, exc)
        return None


def _run(roots: Sequence["Tensor"], seeds: Sequence["Tensor"], retain_graph: bool, create_graph: bool,
         capture: dict[int, "Tensor | None"] | None) -> None:
    from .tensor import Tensor

    order = toposort(list(roots))
    grads: dict[int, Tensor] = {}
    for r, s in zip(roots, seeds):
        grads[id(r)] = grads[id(r)] + s if id(r) in grads else s
    produced = []
    started = time.perf_counter()
    with _grad_mode(create_graph):
        # leaves that are roots themselves (x.backward() on a leaf)
        for r in roots:
            if r._node is None and id(r) in grads:
                _deliver(r, grads.pop(id(r)), capture, produced)
        for t in reversed(order):
            g = grads.pop(id(t), None)
            node = t._node
            if g is None:
                continue
            if capture is not None and id(t) in capture:
                capture[id(t)] = g if capture[id(t)] is None else capture[id(t)] + g
            inputs = node.inputs
            if inputs is None:
                raise GraphError(
                    f"trying to backward through the graph a second time (op '{node.op}' has already "
                    "been freed); pass retain_graph=True to the first backward() if you need to")
            if node.scalar is not None:
                in_grads = _scalar_vjp(node, t, g)
            else:
                in_grads = None if create_graph else _fused_vjp(node, t, g)
                if in_grads is None:
                    in_grads = grad_rules.vjp(node, t, g)
            for inp, ig in zip(inputs, in_grads):
                if ig is None or not inp.requires_grad:
                    continue
                if ig.shape != inp.shape:
                    ig = unbroadcast(ig, inp.shape)
                if inp._node is None:
                    _deliver(inp, ig, capture, produced)
                else:
                    key = id(inp)
                    grads[key] = grads[key] + ig if key in grads else ig
            if not retain_graph:
                node.free()
    ev = registry.events["polygrad_backward_finished"]
    if ev is not None:
        ev(num_nodes=len(order), seconds=time.perf_counter() - started, grads=produced)


def _deliver(leaf: "Tensor", g: "Tensor", capture, produced: list) -> None:
    if g.dtype != leaf.dtype:
        g = g.cast(leaf.dtype)
    if capture is not None:
        if id(leaf) in capture:
            capture[id(leaf)] = g if capture[id(leaf)] is None else capture[id(leaf)] + g
        return
    leaf.grad = g if leaf.grad is None else leaf.grad + g
    produced.append((leaf, leaf.grad))


def _seed(root: "Tensor", grad) -> "Tensor":
    from .tensor import Tensor, ones_like, tensor
    if grad is None:
        if root.numel != 1:
            raise GraphError(f"backward() without a gradient needs a single-element output, got shape "
                             f"{root.shape}; pass grad= (a tensor of that shape)")
        return ones_like(root)
    if not isinstance(grad, Tensor):
        grad = tensor(grad, dtype=root.dtype, backend=root._be)
    if grad.shape != root.shape:
        raise ShapeError(f"backward(): grad of shape {grad.shape} does not match the output's {root.shape}")
    return grad


def backward(root: "Tensor", grad=None, retain_graph: bool = False, create_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into every leaf's ``.grad`` that requires grad."""
    if not root.requires_grad:
        raise GraphError(f"backward() on a tensor of shape {root.shape} that does not require grad "
                         "(no input had requires_grad=True, or it was computed under no_grad)")
    _run([root], [_seed(root, grad)], retain_graph or create_graph, create_graph, None)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """Gradients of ``outputs`` w.r.t. ``inputs`` (returned, not accumulated into ``.grad``).

    With ``create_graph=True`` the returned gradients are differentiable themselves
    (gradients of gradients)."""
    from .tensor import Tensor
    single_out = isinstance(outputs, Tensor)
    outs = [outputs] if single_out else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    for o in outs:
        if not o.requires_grad:
            raise GraphError(f"pg.grad(): an output of shape {o.shape} does not require grad")
    for i in ins:
        if not i.requires_grad:
            raise GraphError(f"pg.grad(): input of shape {i.shape} does not require grad")
    capture: dict[int, Tensor | None] = {id(i): None for i in ins}
    if retain_graph is None:
        retain_graph = create_graph
    _run(outs, [_seed(o, g) for o, g in zip(outs, grad_outputs)], retain_graph, create_graph, capture)
    result = []
    for i in ins:
        g = capture[id(i)]
        if g is None and not allow_unused:
            raise GraphError(f"pg.grad(): an input of shape {i.shape} is not used in the graph of the "
                             "outputs (pass allow_unused=True to get None for it)")
        result.append(g)
    return tuple(result)
