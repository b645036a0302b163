"""Fusing a step's graph into fewer tasks without changing a single computation.

A training step on the ``dask`` backend is ~190 small tasks per epoch, most of them elementwise
ops on one row block whose only consumer is the next op on the same row block.  Each task is a
round trip through the scheduler (a few ms on a busy machine), and the chain of them, not the
workers' compute, sets the epoch time.

:func:`fuse_in_place` merges every task that has exactly one consumer *placed on the same worker
(or equally unplaced)* into that consumer: the group becomes one task, under the consumer's key
and placement, that runs the very same task objects (same functions, same arguments) in
dependency order inside one call (dask's ``Task.fuse``).  No computation is rewritten, reordered
or merged, so every result has the bits the unfused graph gives.  What is not fused:

* a requested key (the arrays being persisted keep their futures);
* a task with several consumers (its result is shared; computing it twice would double work);
* a task placed elsewhere than its consumer (fusing would move its inputs, a row block, between
  workers), placed loosely on several workers, or carrying other annotations (priority,
  retries, resources);
* a task marked ``block_fusion`` by dask, or one of ``sparse_kernels.KEEP_APART`` (an SpMM's own
  tile, which runs while the halo rows are in transit: fused into the halo's task it would wait
  for them).

Unlike dask's own graph optimisation (blockwise fusion, which rewrites ops into new functions and
renames keys), the fused graph keeps every surviving key and its placement.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

#: annotation types a task may carry and still be fused (they are compared, and must be equal)
PLACEMENT = ("workers", "allow_other_workers")


def layer_annotations(graph: Any) -> dict[Hashable, dict]:
    """Per key, the annotations its high-level-graph layer gives it (callables applied)."""
    out: dict[Hashable, dict] = {}
    for layer in graph.layers.values():
        if not layer.annotations:
            continue
        for key in layer:
            out[key] = {t: (v(key) if callable(v) else v) for t, v in layer.annotations.items()}
    return out


def _placement(annotations: dict) -> tuple | None:
    """A hashable form of a task's placement, or None where it is not fused: it carries other
    annotations, or may run on several workers.  (The scheduler runs such a task where most of
    its inputs are; fused with its consumer it would run where the *group's* inputs are: a task
    summing per-row-block partials, fused with the products it sums, would fetch whole row
    blocks instead of the partials.)  No annotation at all means one worker (or none to choose)."""
    if any(t not in PLACEMENT for t in annotations):
        return None
    workers = annotations.get("workers")
    if isinstance(workers, (list, tuple, set)):
        if len(workers) != 1:
            return None
        workers = tuple(workers)
    return workers, bool(annotations.get("allow_other_workers", False))


def fuse_groups(dependencies: dict, keep: set, annotations: dict, unfusable: set) -> dict:
    """``{root: [keys]}``: each key joins the group of its one consumer when both have the same
    placement (``annotations[key]``), the key is not in ``keep`` and not ``unfusable``.  Every
    key is in exactly one group; a group's members other than its root each have their one
    consumer inside the group (an in-tree ending at the root), listed producers first."""
    dependents: dict = {k: [] for k in dependencies}
    for k, deps in dependencies.items():
        for d in deps:
            if d in dependents:
                dependents[d].append(k)
    parent: dict = {}
    for k, users in dependents.items():
        if k in keep or k in unfusable or len(users) != 1:
            continue
        (user,) = users
        mine, theirs = _placement(annotations.get(k, {})), _placement(annotations.get(user, {}))
        if mine is not None and mine == theirs:
            parent[k] = user

    def root(k: Hashable) -> Hashable:
        while k in parent:
            k = parent[k]
        return k

    groups: dict = {}
    for k in _topological(dependencies):
        groups.setdefault(root(k), []).append(k)
    return groups


def _topological(dependencies: dict) -> list:
    """The keys of ``dependencies`` with every key after the keys it depends on (within it)."""
    order: list = []
    state: dict = {}
    for start in dependencies:
        if start in state:
            continue
        stack = [(start, iter(dependencies[start]))]
        state[start] = 1
        while stack:
            k, it = stack[-1]
            for d in it:
                if d in dependencies and d not in state:
                    state[d] = 1
                    stack.append((d, iter(dependencies[d])))
                    break
            else:
                stack.pop()
                order.append(k)
    return order


def fuse_in_place(dsk: dict, keep: set, annotations: dict) -> dict:
    """``dsk`` (key -> dask ``GraphNode``) with each group of :func:`fuse_groups` as one task under
    its root's key (see the module's docstring)."""
    from dask._task_spec import Task

    dependencies = {k: set(node.dependencies) for k, node in dsk.items()}
    from .sparse_kernels import KEEP_APART

    unfusable = {k for k, node in dsk.items()
                 if getattr(node, "block_fusion", False) or getattr(node, "func", None) in KEEP_APART}
    out = {}
    for top, members in fuse_groups(dependencies, keep, annotations, unfusable).items():
        out[top] = dsk[top] if len(members) == 1 else Task.fuse(*(dsk[k] for k in members), key=top)
    return out


def fused_graph(collections: list, default: Callable[[Hashable], dict]) -> tuple[Any, list]:
    """The merged graph of ``collections`` with fusible groups fused, as a ``HighLevelGraph``
    whose layers carry each surviving task's placement, and the flat list of the collections'
    keys.  A task's placement is its layer's annotations (``cluster.pinned``) or, without
    them, ``default(key)`` (``cluster.row_table``'s; ``{}``, no placement, only where the
    cluster has one worker)."""
    from dask._task_spec import convert_legacy_graph
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from dask.utils import ensure_dict

    graph = HighLevelGraph.merge(*(c.__dask_graph__() for c in collections))
    keys = [k for c in collections for k in flatten(c.__dask_keys__())]
    dsk = convert_legacy_graph(ensure_dict(graph))
    placed = layer_annotations(graph)
    annotations = {k: placed.get(k) or default(k) for k in dsk}
    fused = fuse_in_place(dsk, set(keys), annotations)
    # one layer per distinct set of annotations (a layer's annotations apply to all its keys)
    by_kind: dict = {}
    for k, node in fused.items():
        a = annotations[k]
        kind = tuple(sorted((t, tuple(v) if isinstance(v, (list, tuple, set)) else v) for t, v in a.items()))
        by_kind.setdefault(kind, ({}, a))[0][k] = node
    layers = {f"polygrad-fused-{n}": MaterializedLayer(tasks, annotations=dict(a) or None)
              for n, (tasks, a) in enumerate(by_kind.values())}
    return HighLevelGraph(layers, {name: set() for name in layers}), keys


__all__ = ["fuse_in_place", "fuse_groups", "fused_graph", "layer_annotations", "PLACEMENT"]
