"""Reverse-mode autodiff: ``backward()`` and ``pg.grad()`` over the recorded graph.

One engine serves both: it orders the tensors that lead to leaves needing gradients
(``graph.toposort``, iterative and deterministic), runs each node's VJP in reverse order,
accumulates with ``+`` in a fixed order, undoes broadcasting in exactly one place
(:func:`unbroadcast`) and frees each node as soon as it has been used unless ``retain_graph``.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, cast

import numpy as np

from . import grad_rules
from ..runtime.config import config
from .dispatch import (
    KernelFault, _grad_enabled, _recording, registry, report_fallback, run_kernel, scalar_cost, scalar_decompose,
)
from ..ir.errors import DTypeError, GraphError, PolygradError, ShapeError
from . import graph
from .graph import Node, TensorBase, graph_key, stand_in, toposort
from ..ir.ops import Op, kernel_key
from .value import Value
from .value_backward import _run as value_run
from .value_backward import _toposort as value_toposort

if TYPE_CHECKING:
    from ..tensor import Tensor

#: serialises the read-add-write of a leaf's ``.grad``: backward passes running in several
#: threads over graphs that share a leaf (data-parallel workers, one model) must not lose each
#: other's contributions.  One lock for all leaves: the critical section is one dispatch of ``+``.
_accumulate_lock = threading.Lock()
#: the backward plans of the ``pg.compile`` default-mode call running in this context (None: none;
#: see polygrad.compile.backward_plan): ``plans.backward(root, eager)`` runs a plain backward()
backward_plans: ContextVar[Any] = ContextVar("polygrad_backward_plans", default=None)


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


def unbroadcast(g: Any, shape: tuple, reduce_sum: Callable[..., Any] | None = None) -> Any:
    """Sum ``g`` down to ``shape``: the one place broadcasting is undone.

    ``g`` is a tensor (summed with the SUM op), or a backend's raw array with ``reduce_sum`` its
    SUM kernel (``reduce_sum(x, axes=..., keepdims=...)``): a fused backward such as
    ``backends/matmul_vjp.py`` makes the calls this would dispatch."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead < 0:
        raise ShapeError(f"internal: gradient of shape {g.shape} cannot reduce to {shape}")
    if lead:  # summing the extra leading axes away needs no reshape afterwards
        axes = tuple(range(lead))
        g = g.sum(axis=axes) if reduce_sum is None else reduce_sum(g, axes=axes, keepdims=False)
    ones = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if ones:
        g = g.sum(axis=ones, keepdims=True) if reduce_sum is None else reduce_sum(g, axes=ones, keepdims=True)
    return g


def _scalar_vjp(node, out: "Tensor", g: "Tensor") -> tuple:
    """Gradient of an op computed by fallback: ``Value.backward`` over its decomposition.

    No VJP rule or kernel is involved.  The decomposition's gradients are reset first, so a
    retained graph (``retain_graph=True``) can be backpropagated through it again."""
    leaves, outs = node.scalar
    return _decomposition_grads(node.inputs, leaves, outs, g)


def _decomposition_grads(inputs: tuple, leaves: list, outs: list, g: "Tensor") -> tuple:
    """Input gradients from a scalar decomposition (leaves per input, output elements) seeded by g."""
    seeds = g._be.to_numpy(g._data).ravel().tolist()
    pairs = [(o, s) for o, s in zip(outs, seeds) if isinstance(o, Value)]
    # Value.backward semantics (micrograd: grads accumulate), on a decomposition reset first
    order = value_toposort([o for o, _ in pairs])
    for v in order:
        v.grad = 0
    for items in leaves:
        for v in items:
            if isinstance(v, Value):
                v.grad = 0
    for o, s in pairs:
        o.grad += float(s)
    value_run(order)
    grads: list[TensorBase | None] = []
    for items, inp in zip(leaves, inputs):
        if not inp.requires_grad or (items and not isinstance(items[0], Value)):
            grads.append(None)
            continue
        arr = np.asarray([v.grad for v in items], dtype=inp.dtype).reshape(inp.shape)
        grads.append(inp._from_host(arr))
    return tuple(grads)


def _fused_vjp(node, kernel, out: "Tensor", g: "Tensor"):
    """Input gradients from the backend's fused backward ``kernel`` for this node.

    A fused kernel that raises, returns the wrong number of gradients, leaves out a gradient
    that is needed or returns one of the wrong shape is a kernel fault, handled like a failing
    forward kernel: ``pg.config.fallback == "raise"`` re-raises; otherwise the fault is reported
    (hook, warning, ``pg.stats()``) and the gradient is recomputed by scalar decomposition --
    the op's scalar reference over Values, backpropagated by ``Value.backward`` -- so nothing of
    the failing backend is trusted.  When that decomposition would exceed
    ``pg.config.scalar_fallback_max_elements``, the VJP rule serves instead of raising: unlike a
    failed forward, the backward has a second trustworthy path (the rule is polygrad's own,
    built from primitives whose kernels are each checked and fall back on their own), and a
    training run should not die on the cost of the slower one.
    """
    be = node.backend
    needs = tuple(t.requires_grad for t in node.inputs)
    try:
        arrays = tuple(kernel(g._data, *[_data_or_stand_in(t) for t in node.inputs], needs=needs,
                              **node.attrs))
        if len(arrays) != len(node.inputs):
            raise KernelFault(f"fused backward of '{node.op}' on backend {be.name!r} returned "
                              f"{len(arrays)} gradients for {len(node.inputs)} inputs")
        grads: list[TensorBase | None] = []
        for t, arr, need in zip(node.inputs, arrays, needs):
            if not need:
                grads.append(None)
                continue
            if arr is None:
                raise KernelFault(f"fused backward of '{node.op}' on backend {be.name!r} returned no "
                                  f"gradient for an input of shape {t.shape} that needs one")
            if be.shape(arr) != t.shape:
                raise KernelFault(f"fused backward of '{node.op}' on backend {be.name!r} returned shape "
                                  f"{be.shape(arr)} for an input of shape {t.shape}")
            grads.append(g._new(arr, be, t.shape, be.dtype(arr)))
        rec = _recording.get()
        if rec is not None:  # pg.compile is capturing this step (polygrad.capture)
            # keyed as dispatch keys it: "coo" and "csr" share one storage, so one table entry
            rec.fused(be, kernel_key(node.op, node.layout), (g, *node.inputs), {"needs": needs, **node.attrs},
                      grads)
        return tuple(grads)
    except KernelFault as exc:
        fault: Exception = exc
    except PolygradError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing fused kernel goes to the fallback policy
        fault = exc
    return _fused_fallback(node, out, g, fault, report_fallback)


def _data_or_stand_in(t: "Tensor"):
    """An input's array for a fused backward kernel.  An input the graph keeps without its data
    (``graph.saved_inputs``: the gradients needed never read it) is passed as zeros of its shape
    and dtype broadcast from one element -- the backend's own EXPAND, so no memory -- which a
    correct kernel, honouring ``needs``, never reads."""
    if t._data is not None:
        return t._data
    be = t._be
    zero = be.from_numpy(np.zeros((), t.dtype))
    return run_kernel(be, Op.EXPAND, "dense", [zero], {"shape": t.shape}, t.shape, t.dtype)


def _fused_fallback(node, out: "Tensor", g: "Tensor", exc: Exception, report) -> tuple | None:
    """Gradients by scalar decomposition after a fused backward kernel failed (None: use the rule)."""
    if config.fallback == "raise":
        raise exc
    report(node.op, node.backend, node.layout, exc)
    if any(t._data is None for t in node.inputs):
        return None  # an input kept without its data cannot be decomposed: the rule does not read it
    if scalar_cost(node.op, tuple(t.shape for t in node.inputs), node.attrs,
                   out.shape) > config.scalar_fallback_max_elements:
        return None
    leaves, outs = scalar_decompose(node.op, node.inputs, node.attrs, out.shape, exc, node.backend,
                                    node.layout)
    return _decomposition_grads(node.inputs, leaves, outs, g)


def _run(roots: Sequence["Tensor"], seeds: Sequence["Tensor"], retain_graph: bool, create_graph: bool,
         capture: dict[int, "Tensor | None"] | None) -> None:
    order = toposort(list(roots))
    vjp_tables = registry.vjp_tables
    # pg.grad: run only the part of the graph between the roots and the requested inputs, so the
    # rest is neither computed nor freed (a later backward through it must still work)
    wanted = None if capture is None else _depends_on(order, capture)
    # keyed by graph_key: a tensor and the data-less stand-ins of it that nodes keep are one vertex
    grads: dict[int, "Tensor"] = {}
    for r, s in zip(roots, seeds):
        key = graph_key(r)
        grads[key] = grads[key] + s if key in grads else s
    produced: list[tuple[TensorBase, TensorBase]] = []
    started = time.perf_counter()
    with _grad_mode(create_graph):
        # leaves that are roots themselves (x.backward() on a leaf)
        for r in roots:
            if r._node is None and id(r) in grads:
                _deliver(r, grads.pop(id(r)), capture, produced)
        num_nodes = len(order)
        while order:
            # popped, not iterated: once its node has run (and is freed) a tensor is released, so
            # the forward's intermediates are freed one by one during backward, not after it
            t = order.pop()
            key = graph_key(t)
            g = grads.pop(key, None)
            node = cast(Node, t._node)  # toposort orders only tensors that have a node
            if g is None:
                continue
            if capture is not None:
                if key in capture:
                    capture[key] = g if capture[key] is None else capture[key] + g
                if wanted is not None and key not in wanted:
                    continue  # nothing below this tensor was asked for
            if node.op not in graph.reads_output:
                t = stand_in(t)  # its VJP never reads it: the array goes as soon as nothing else holds it
            inputs = node.inputs
            if inputs is None:
                raise GraphError(
                    f"trying to backward through the graph a second time (op '{node.op}' has already "
                    "been freed); pass retain_graph=True to the first backward() if you need to")
            try:
                in_grads = _node_vjp(node, t, g, create_graph, vjp_tables)
            except Exception:
                if node.inputs is None:  # freed under us by a backward running in another thread
                    raise GraphError(f"op '{node.op}' was freed by a concurrent backward() through the "
                                     "same graph; pass retain_graph=True to backpropagate it from "
                                     "several threads") from None
                raise
            _pass_down(inputs, in_grads, grads, capture, produced)
            if not retain_graph:
                node.free()
            del t, g, inputs, in_grads  # hold nothing into the next node's VJP
    rec = _recording.get()
    if rec is not None:  # pg.compile: a replay re-fires this event with the replayed gradients
        rec.backward_finished(num_nodes, produced)
    ev = registry.events["polygrad_backward_finished"]
    if ev is not None:
        ev(num_nodes=num_nodes, seconds=time.perf_counter() - started, grads=produced)


def _pass_down(inputs: tuple, in_grads: tuple, grads: dict, capture, produced: list) -> None:
    """Deliver a node's input gradients to leaves, or add them up (by graph_key) for the nodes below."""
    for inp, ig in zip(inputs, in_grads):
        if ig is None or not inp.requires_grad:
            continue
        if ig.shape != inp.shape:
            ig = unbroadcast(ig, inp.shape)
        if inp._node is None:
            _deliver(inp, ig, capture, produced)
        else:
            key = graph_key(inp)
            grads[key] = grads[key] + ig if key in grads else ig


def _node_vjp(node, t: "Tensor", g: "Tensor", create_graph: bool, vjp_tables: dict) -> tuple:
    """The input gradients of one node: its scalar decomposition, fused kernel or VJP rule."""
    if node.scalar is not None and not create_graph:
        return _scalar_vjp(node, t, g)
    # create_graph: the rule (made of differentiable polygrad ops, each of which falls back on
    # its own) is the only path whose gradients can be differentiated again -- a scalar
    # decomposition or fused kernel yields constants.
    in_grads = None
    if not create_graph:
        fused = vjp_tables.get(node.backend.name)
        kernel = fused.get(kernel_key(node.op, node.layout)) if fused else None
        if kernel is not None:
            in_grads = _fused_vjp(node, kernel, t, g)
    if in_grads is None:
        in_grads = grad_rules.vjp(node, t, g)
    return in_grads


def _depends_on(order: list, capture: dict) -> set[int]:
    """ids of the tensors in ``order`` whose inputs lead to a captured tensor (inputs first)."""
    wanted: set[int] = set()
    for t in order:
        inputs = t._node.inputs or ()
        for inp in inputs:
            key = graph_key(inp)
            if key in capture or key in wanted:
                wanted.add(graph_key(t))
                break
    return wanted


def _deliver(leaf: "Tensor", g: "Tensor", capture, produced: list) -> None:
    if g.dtype != leaf.dtype:
        g = g.cast(leaf.dtype)
    if capture is not None:
        if id(leaf) in capture:  # a leaf's graph_key is its id
            capture[id(leaf)] = g if capture[id(leaf)] is None else capture[id(leaf)] + g
        return
    with _accumulate_lock:
        leaf.grad = g if leaf.grad is None else leaf.grad + g
        produced.append((leaf, leaf.grad))


def _seed(root: "Tensor", grad) -> "Tensor":
    be = root._be
    if grad is None:
        if root.numel != 1:
            raise GraphError(f"backward() without a gradient needs a single-element output, got shape "
                             f"{root.shape}; pass grad= (a tensor of that shape)")
        return root._from_host(np.ones(root.shape, root.dtype))
    if not isinstance(grad, TensorBase):
        try:
            host = np.asarray(be.to_numpy(grad) if be.owns(grad) else grad, dtype=root.dtype)
        except (TypeError, ValueError) as exc:
            raise DTypeError(f"backward(): cannot use a {type(grad).__name__} as the gradient of a "
                             f"{root.dtype} output: {exc}") from None
        grad = root._from_host(host)
    if grad.shape != root.shape:
        raise ShapeError(f"backward(): grad of shape {grad.shape} does not match the output's {root.shape}")
    return grad


def backward(root: "Tensor", grad=None, retain_graph: bool = False, create_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into every leaf's ``.grad`` that requires grad."""
    if not root.requires_grad:
        raise GraphError(f"backward() on a tensor of shape {root.shape} that does not require grad "
                         "(no input had requires_grad=True, or it was computed under no_grad)")
    plans = backward_plans.get()
    if plans is not None and grad is None and not (retain_graph or create_graph):
        plans.backward(root, lambda: _run([root], [_seed(root, grad)], False, False, None))
        return
    _run([root], [_seed(root, grad)], retain_graph or create_graph, create_graph, None)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """Gradients of ``outputs`` w.r.t. ``inputs`` (returned, not accumulated into ``.grad``).

    With ``create_graph=True`` the returned gradients are differentiable themselves
    (gradients of gradients)."""
    single_out = isinstance(outputs, TensorBase)
    outs = [outputs] if single_out else list(outputs)
    ins = [inputs] if isinstance(inputs, TensorBase) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outs)
    elif isinstance(grad_outputs, TensorBase):
        grad_outputs = [grad_outputs]
    for x in (*outs, *ins):
        if not isinstance(x, TensorBase):
            raise DTypeError(f"pg.grad(): outputs and inputs must be polygrad tensors, got {type(x).__name__}")
    for o in outs:
        if not o.requires_grad:
            raise GraphError(f"pg.grad(): an output of shape {o.shape} does not require grad")
    for i in ins:
        if not i.requires_grad:
            raise GraphError(f"pg.grad(): input of shape {i.shape} does not require grad")
    capture: dict[int, "Tensor | None"] = {graph_key(i): None for i in ins}
    if retain_graph is None:
        retain_graph = create_graph
    _run(outs, [_seed(o, g) for o, g in zip(outs, grad_outputs)], retain_graph, create_graph, capture)
    result = []
    for i in ins:
        g = capture[graph_key(i)]
        if g is None and not allow_unused:
            raise GraphError(f"pg.grad(): an input of shape {i.shape} is not used in the graph of the "
                             "outputs (pass allow_unused=True to get None for it)")
        result.append(g)
    return tuple(result)
