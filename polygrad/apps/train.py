"""``fit``: a small full-batch training loop with rollback to the last good checkpoint.

Each epoch computes the loss, and if it rose more than ``rollback_threshold`` (default 5%) above
the loss of the last good checkpoint -- or is NaN/Inf -- the model and optimizer are restored to
that checkpoint and the learning rate is multiplied by ``lr_decay`` instead of taking the step.
Otherwise the loss is backpropagated and the optimizer steps.  A checkpoint is "good" when its
loss is no higher than the previous good one's; it is kept in memory and, with
``checkpoint_path``, also written to disk atomically with :func:`polygrad.save`.

Rollback compares losses between epochs, so it suits deterministic (full-batch, no dropout)
objectives; with dropout or mini-batches the loss is noisy and ``rollback_threshold=None``
(rollback off) or a larger threshold is the right choice.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

import numpy as np

import polygrad as pg
from polygrad.runtime.backend import overrides, shares_arrays
from polygrad.runtime import sharing
from polygrad.runtime.heap import keep_heap_top
from polygrad.compile import Compiled
from polygrad.ir.errors import NonFiniteError

from ..nn.module import Module
from ..optim.optimizer import Optimizer, _leaf_of
from ..tensor import Tensor, is_sparse

__all__ = ["fit", "EpochRecord", "History"]


@dataclass
class EpochRecord:
    """What one epoch did (passed to the progress callback)."""
    epoch: int                 # 0-based
    epochs: int                # total requested
    loss: float                # the loss computed this epoch (before the step)
    lr: float                  # learning rate of the first group used for this epoch's step
    rolled_back: bool          # the step was replaced by a rollback
    seconds: float             # wall time of the epoch
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    records: list[EpochRecord] = field(default_factory=list)
    rollbacks: int = 0
    best_loss: float = math.inf
    best_epoch: int = -1
    stopped_early: bool = False
    stop_reason: str = ""
    #: epochs whose step ran as a pg.compile replay (0 with compile=False, or when every capture was
    #: refused, e.g. on a backend that opts out of replay; always 0 in the default mode, which runs
    #: the step's Python every epoch)
    replays: int = 0
    #: how the step ran: "eager" (compile=False), "default" (pg.compile) or "pure" (pure=True)
    compile_mode: str = "eager"
    #: epochs whose step was built and submitted while the previous epoch's step still ran (a lazy
    #: backend such as dask, compile=False and no callback; 0 elsewhere)
    steps_ahead: int = 0

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.records]

    @property
    def epoch_seconds(self) -> list[float]:
        return [r.seconds for r in self.records]


@dataclass
class _Snapshot:
    epoch: int
    loss: float
    model: dict[str, Tensor]
    optimizer: dict[str, Any]


def _copy_tensor(t: Tensor) -> Tensor:
    # a private copy: the snapshot must not change if someone writes into the live storage
    if is_sparse(t):
        return t.detach().with_values(_copy_tensor(t.values))   # same pattern, copied values
    if shares_arrays(t._be):  # immutable (or lazy) arrays: sharing one is a copy, no host trip
        return t.detach()
    be = t._be  # one copy, wrapped as it is (pg.tensor would copy it again and validate it)
    return Tensor.from_backend(be.from_numpy(be.to_numpy(t._data).copy()), be)


def _snapshot(epoch: int, loss: float, model: Module, optimizer: Optimizer) -> _Snapshot:
    params = {k: _copy_tensor(v) for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    opt["state"] = {k: {n: _copy_tensor(v) if isinstance(v, Tensor) else v for n, v in st.items()}
                    for k, st in opt["state"].items()}
    return _Snapshot(epoch, loss, params, opt)


class _HeldSnapshot:
    """Pure mode's checkpoint, held by reference instead of copied: the state before this epoch's
    step, which the step's undo (:class:`_StepUndo`) already holds -- arrays the step replaced,
    so nothing live can write into them -- plus the hyper-parameters as ``state_dict`` would
    have read them.  Copied into a :class:`_Snapshot` (:meth:`resolve`) only when a rollback
    loads it: a checkpoint is taken at most epochs of a falling loss (81 of Cora's 200) and loaded
    at few, and the copy (state dicts of the model and the optimizer, ~100-150 us on Cora's GCN)
    was a tenth of a replayed epoch.  Taken only where :func:`_holdable` says that the held arrays
    are all of the state the copy would have taken."""
    __slots__ = ("epoch", "loss", "undo", "groups")

    def __init__(self, epoch: int, loss: float, undo: _StepUndo, optimizer: Optimizer):
        self.epoch, self.loss, self.undo = epoch, loss, undo
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]

    def resolve(self, model: Module, optimizer: Optimizer) -> _Snapshot:
        """The copy that :func:`_snapshot` would have taken at the held epoch: the held state put
        back, copied, and the live state restored."""
        redo = self.undo.restore()
        try:
            snap = _snapshot(self.epoch, self.loss, model, optimizer)
        finally:
            redo.restore()
        for group, held in zip(snap.optimizer["param_groups"], self.groups):
            params = group.pop("params")
            group.clear()
            group.update(held)
            group["params"] = params  # the key order of Optimizer.state_dict
        return snap


_IMMUTABLE = (int, float, complex, str, bytes, tuple, type(None), np.generic)
_NO_STATE: dict = {}  # a parameter without optimizer state (read only)


def _only_parameters(model: Module, optimizer: Optimizer) -> bool:
    """Whether the model's state dict is exactly parameters the optimizer updates (no buffers, no
    parameter outside it): then a step's undo holds all of it (:class:`_HeldSnapshot`)."""
    updated = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return (next(iter(model.named_buffers()), None) is None
            and all(id(p) in updated for _, p in model.named_parameters()))


def _holdable(undo: _StepUndo, optimizer: Optimizer) -> bool:
    """Whether this epoch's step replaced every array its undo holds (each parameter's and each
    state array): a parameter without a gradient keeps its array live, which a callback or the
    user could write into, so that epoch's checkpoint is copied as in the eager loop.  So is one
    whose held arrays include memory the user can write (``Tensor.numpy()``, ``pg.from_numpy``,
    ``update_`` keeping the caller's array: marked by :mod:`polygrad.runtime.sharing`), even though
    the step replaced it: an edit through the user's reference would change the checkpoint."""
    arrays = []
    for leaf, data in undo.storage:
        if leaf._data is data:
            return False
        arrays.append(data)
    live = optimizer.state
    for key, held in undo.state.items():
        now = live.get(key, _NO_STATE)
        for name, v in held.items():
            if isinstance(v, _IMMUTABLE):
                continue
            if now.get(name) is v:
                return False
            arrays.append(v._data if isinstance(v, Tensor) else v)
    return not sharing.any_shared(arrays)  # one pass over the held arrays (taken at most epochs)


def _save_checkpoint(good: Any, path: Any) -> None:
    """Write ``good`` (a copied snapshot: ``hold`` is off with a path) to ``path``, if one is given."""
    if path is not None:
        assert isinstance(good, _Snapshot)
        pg.save({"model": good.model, "optimizer": good.optimizer, "epoch": good.epoch, "loss": good.loss}, path)


def _split(out: Any) -> tuple[Tensor, dict[str, Any]]:
    if isinstance(out, tuple):
        if len(out) != 2 or not isinstance(out[1], dict):
            raise TypeError("fit: loss_fn must return a scalar tensor or (loss, metrics_dict)")
        return out[0], out[1]
    return out, {}


def _check_loss(loss: Any) -> None:
    if not isinstance(loss, Tensor) or loss.numel != 1:
        raise TypeError(f"fit: loss_fn must return a single-element tensor, got "
                        f"{getattr(loss, 'shape', type(loss).__name__)}")


def _compile_mode(compile: bool | str) -> str:
    if compile is False:
        return "eager"
    if compile is True or compile == "default":
        return "default"
    if compile == "pure":
        return "pure"
    raise ValueError(f"fit: compile must be False, True, 'default' or 'pure', got {compile!r}")


def _compiled_step(model: Module, optimizer: Optimizer, loss_fn: Callable[[], Any], pure: bool,
                   update: bool = False) -> Compiled:
    """zero_grad + loss_fn + backward as one compiled step (``pg.compile``); with ``update``, the
    optimizer's step too (fit then undoes it where eager would not have stepped, see
    :class:`_StepUndo`), else the optimizer steps outside it, after the rollback decision, exactly
    as in the eager loop."""
    def forward_backward() -> tuple[Tensor, dict[str, Any]]:
        optimizer.zero_grad()
        loss, metrics = _split(loss_fn())
        _check_loss(loss)
        loss.backward()
        if update:
            if _steps_ahead(optimizer):
                # a lazy backend: the step joins the loss's and gradients' graph (one submission);
                # stepping alone would compute forward and backward for the new parameters, and
                # fit's read of the loss and gradients would compute them again
                _step_ahead(optimizer, loss)
            else:
                optimizer.step()
        return loss, metrics

    return pg.compile(forward_backward, modules=[model], pure=pure)


def _replaces_arrays(optimizer: Optimizer) -> bool:
    """Whether ``optimizer.step()`` only ever replaces its parameters' and state's arrays, never
    writing into them: an optimizer defined by a pure update :class:`~polygrad.optim.optimizer.Rule`
    (the built-in ones), whose new values are written with ``Tensor.update_`` -- so references to the
    arrays from before a step are that step's undo (:class:`_StepUndo`)."""
    cls = type(optimizer)
    return cls._update is Optimizer._update and cls._rule is not Optimizer._rule and _own_step_machinery(optimizer)


#: the methods an optimizer step runs besides its update (``_update`` / ``_rule``), see
#: polygrad.optim.optimizer.Optimizer.step
_STEP_MACHINERY = ("step", "_apply_rule", "_update_together", "_advance_state", "_init_state", "_materialize")


def _own_step_machinery(optimizer: Optimizer) -> bool:
    """Whether everything ``optimizer.step()`` runs besides its update is polygrad's own code: a
    subclass that overrides the rest (say ``_advance_state`` writing into a state array) may do
    host work a pure replay would skip, so fit's pure mode then runs its step eagerly."""
    cls = type(optimizer)
    return all(getattr(getattr(cls, name), "__module__", "").startswith("polygrad.optim")
               for name in _STEP_MACHINERY)


class _StepUndo:
    """What an optimizer's step changes, held by reference just before it runs: each parameter's
    array, the per-parameter state (arrays and counters) and the step count.  ``restore()`` puts
    them back and returns the undo of that (a redo).  Valid for optimizers that replace arrays
    (:func:`_replaces_arrays`); fit's pure mode uses it to run the step inside the compiled call and
    still snapshot and roll back exactly as the eager loop, which steps after its decision."""
    __slots__ = ("optimizer", "storage", "state", "step_count")

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        # taken every epoch in pure mode: a plain Tensor (never sparse) skips is_sparse
        leaves = [p if type(p) is Tensor else (p.values if is_sparse(p) else p)
                  for g in optimizer.param_groups for p in g["params"]]
        self.storage = [(leaf, leaf._data) for leaf in leaves]
        self.state = {k: dict(v) for k, v in optimizer.state.items()}
        self.step_count = optimizer.step_count

    def restore(self) -> "_StepUndo":
        redo = _StepUndo(self.optimizer)
        for leaf, data in self.storage:
            leaf._data = data
        state = self.optimizer.state
        state.clear()
        state.update({k: dict(v) for k, v in self.state.items()})
        self.optimizer.step_count = self.step_count
        return redo


def _compiled_update(optimizer: Optimizer) -> Compiled:
    """``optimizer.step()`` as a step of its own under ``pg.compile(pure=True)`` (for fit's pure
    mode): the step stays after the rollback decision and the snapshot, as in the eager loop, and
    its replay runs the recorded update rules without the optimizer's per-parameter Python (on
    Cora's GCN: 4 parameters, 2 groups).  Pure by construction: ``step()`` only issues the updates;
    what it cannot record (a custom optimizer) it replays as one host call, and a changed
    hyper-parameter (the rollback's learning-rate decay) re-captures."""
    def update() -> None:
        optimizer.step()

    return pg.compile(update, pure=True)


def _steps_ahead(optimizer: Optimizer) -> bool:
    """Whether fit runs ``optimizer``'s step before reading the loss, undone where the eager loop
    would not have stepped: on a lazy backend (``Backend.lazy``), for an optimizer that replaces
    its arrays (:func:`_replaces_arrays`, so :class:`_StepUndo` is its undo)."""
    return _replaces_arrays(optimizer) and any(
        _leaf_of(p)._be.lazy for p in optimizer._params())


def _step_ahead(optimizer: Optimizer, loss: Tensor) -> _StepUndo:
    """On a lazy backend, the optimizer's step built on the gradients' task graph, and the loss,
    the gradients and the new parameters and state materialised together: one submission (one
    scheduler round trip) per epoch where reading the loss, then stepping, made four.  The step
    is taken before fit knows the loss, so it returns the step's undo: fit restores it (the
    parameters and state from before the step, still held, bit for bit) where the eager loop
    would not have stepped.  A failed materialisation restores it too, then raises."""
    return _submit_step(optimizer, loss, {}, wait=True).undo


class _Submitted:
    """One epoch's step on a lazy backend, taken before its loss is read and handed to the backend
    without waiting (``pg.materialize(wait=False)``): the loss and metrics, the learning rate the
    step used, the step's undo, the tensors the join waits for (the loss, the gradients, the new
    parameters and state) and, for a step built ahead of the previous epoch's decision, the state
    from before it was built (:class:`_Before`), which discarding it puts back."""
    __slots__ = ("loss", "metrics", "lr", "undo", "results", "before")

    def __init__(self, loss: Tensor, metrics: dict[str, Any], lr: float, undo: _StepUndo, results: list) -> None:
        self.loss, self.metrics, self.lr, self.undo, self.results = loss, metrics, lr, undo, results
        self.before: _Before | None = None

    def take_back(self) -> "_Before":
        """Put back the state from before this step was built ahead; returns its redo."""
        assert self.before is not None, "only a step built ahead (_speculate) is taken back"
        return self.before.restore()


def _submit_step(optimizer: Optimizer, loss: Tensor, metrics: dict[str, Any], wait: bool) -> _Submitted:
    """The optimizer's step on the gradients' task graph, materialised with the loss and the
    gradients as one graph; with ``wait=False`` submitted without waiting (:func:`_join` waits).
    A failure restores the step's undo, then raises."""
    lr = optimizer.current_lr()
    undo = _StepUndo(optimizer)
    grads = [p.grad for p in optimizer._params()]
    try:
        with optimizer.deferred_materialize() as pending:
            optimizer.step()
        results = [loss, *grads, *pending]
        pg.materialize(*results, wait=wait)
    except BaseException:
        undo.restore()
        raise
    # the join waits for these very arrays: ``pending`` holds the parameters, whose storage the next
    # step (built before the join) replaces, so the tensors would name the next step's arrays
    held = [] if wait else [_leaf_of(t).detach() for t in results if isinstance(t, Tensor)]
    return _Submitted(loss, metrics, lr, undo, held)


def _join(submitted: _Submitted, ahead: _Submitted | None = None) -> None:
    """Wait for a submitted step; where it failed, put back the state from before it -- and before
    ``ahead``, the next epoch's step built on it -- then raise the backend's error."""
    if not submitted.results:  # materialised when it was taken
        return
    try:
        pg.materialize(*submitted.results)
    except BaseException:
        if ahead is not None:
            ahead.take_back()
        submitted.undo.restore()
        raise
    submitted.results = []  # the join is done: hold nothing beyond what the tensors hold


class _Before:
    """The state that building a step changes, held by reference: what its :class:`_StepUndo`
    holds, the gradients of the optimizer's and the model's parameters (``zero_grad`` and backward
    replace or add to them), the model's buffers (a forward
    in training mode moves batch-norm statistics) and polygrad's random generator (dropout).
    ``restore()`` puts them back and returns the :class:`_Before` of the state it replaced.  Valid
    where every buffer's arrays are immutable values (:func:`_buffers_immutable`): lazy backends'
    are, so their updates replace arrays, never write into them."""
    __slots__ = ("model", "optimizer", "undo", "grads", "buffers", "rng")

    def __init__(self, model: Module, optimizer: Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.undo = _StepUndo(optimizer)
        # the optimizer's parameters and the model's (one left out of the optimizer still gets a
        # gradient, which a second backward would add to)
        params = {id(p): p for p in (*optimizer._params(), *model.parameters())}.values()
        leaves = [q for p in params for q in ((p, p.values) if is_sparse(p) else (p,))]
        self.grads = [(leaf, leaf.grad) for leaf in leaves]
        self.buffers = [(b, b._data) for b in _buffer_leaves(model)]
        self.rng = pg.rng().bit_generator.state

    def restore(self) -> "_Before":
        redo = _Before(self.model, self.optimizer)
        self.undo.restore()
        for leaf, grad in self.grads:
            leaf.grad = grad
        for leaf, data in self.buffers:
            leaf._data = data
        pg.rng().bit_generator.state = self.rng
        return redo


def _submits(optimizer: Optimizer) -> bool:
    """Whether a parameter's backend starts work without waiting for it (overrides
    ``Backend.submit``): else building the next step ahead would wait for this one first."""
    return any(overrides(_leaf_of(p)._be, "submit") for p in optimizer._params())


def _buffer_leaves(model: Module) -> list[Tensor]:
    return [_leaf_of(b) for _, b in model.named_buffers()]


def _buffers_immutable(model: Module) -> bool:
    """Whether every buffer of ``model`` lives on a backend whose arrays are immutable values, so
    that holding a buffer's array is a snapshot of it (:class:`_Before`)."""
    return all(shares_arrays(b._be) for b in _buffer_leaves(model))


class _Raised:
    """What building the next step raised (an ``Exception`` from ``loss_fn``, backward or the
    step) and the state it left (a forward's statistics and random draws, gradients), with the
    state from before put back for this epoch's decision: raised where the eager loop would call
    ``loss_fn`` -- at the next epoch, from the state it left -- unless this epoch rolls back (then
    ``loss_fn`` runs again on the rolled-back state)."""
    __slots__ = ("error", "left")

    def __init__(self, error: Exception, left: _Before) -> None:
        self.error, self.left = error, left

    def reraise(self) -> NoReturn:
        self.left.restore()
        raise self.error


def _speculate(model: Module, optimizer: Optimizer, loss_fn: Callable[[], Any]) -> _Submitted | _Raised | None:
    """The next epoch's step -- ``loss_fn()``, backward and the optimizer's step -- built on this
    epoch's submitted parameters and submitted too, before fit reads this epoch's loss: the
    backend's workers go on from this step to the next without waiting for the client to read a
    loss, then build and hand over a graph.  Its :attr:`_Submitted.before` discards it where the
    eager loop would not have taken it (a rollback, a non-finite loss).  Where building it raised,
    the state is put back and the error kept (:class:`_Raised`); None, with the state put back,
    where ``loss_fn`` gave a loss on an eager backend (the next epoch runs as the eager loop does)."""
    before = _Before(model, optimizer)
    try:
        loss, metrics = _split(loss_fn())
        _check_loss(loss)
        if not loss._be.lazy:
            before.restore()
            return None
        optimizer.zero_grad()
        loss.backward()
        submitted = _submit_step(optimizer, loss, metrics, wait=False)
    except Exception as exc:  # noqa: BLE001 - raised at the next epoch, where the eager loop raises it
        return _Raised(exc, before.restore())
    except BaseException:
        before.restore()
        raise
    submitted.before = before
    return submitted


def fit(model: Module, optimizer: Optimizer, loss_fn: Callable[[], Any], epochs: int, *,
        rollback_threshold: float | None = 0.05, lr_decay: float = 0.5, max_rollbacks: int = 10,
        checkpoint_every: int = 1, checkpoint_path: Any = None,
        callback: Callable[[EpochRecord], Any] | None = None, compile: bool | str = False,
        pipeline: bool = True) -> History:
    """Train ``model`` for ``epochs`` full-batch steps of ``optimizer`` on ``loss_fn()``.

    ``loss_fn()`` returns the scalar loss tensor, or ``(loss, metrics)`` with a dict of extra
    figures (accuracy...) that end up in each :class:`EpochRecord`.  ``callback(record)`` is
    called after every epoch (progress bars, logging); returning ``True`` stops training.

    Rollback: see the module docstring.  ``rollback_threshold=None`` turns it off.  After
    ``max_rollbacks`` rollbacks training stops (``History.stop_reason`` says why).  A NaN/Inf
    loss before any good checkpoint exists raises :class:`~polygrad.errors.NonFiniteError`.

    ``compile=True`` (or ``"default"``) runs zero_grad, ``loss_fn()`` and backward as one
    :func:`polygrad.compile` step in its default mode (``loss_fn``'s Python runs every epoch, so
    any ``loss_fn`` gives eager's numbers).  ``compile="pure"`` compiles it with ``pure=True``:
    replayed kernels after the first epochs, for a ``loss_fn`` whose Python does nothing but
    issue ops (see the README's pg.compile section); its metrics must be tensors, since
    ``loss_fn`` is not re-run on replay; the optimizer's step replays too: inside the same
    compiled call for optimizers defined by a pure update rule (the built-in ones), undone where
    the eager loop would not have stepped (a rollback) and for the snapshot, which is of the state
    before the step; as a pure step of its own after the rollback decision for any other whose
    step machinery is polygrad's (a subclass overriding only ``_update`` or ``_rule``); eagerly for
    a subclass that overrides the rest (``step``, ``_advance_state``, ...).  Either
    way the backward runs before the rollback decision, whose rolled-back epochs discard the
    gradients.
    ``History.compile_mode`` says which mode ran.

    On a lazy backend (dask) with ``compile=False`` and no ``callback``, each epoch's step (the
    loss, backward and the optimizer's step as one task graph) is handed to the backend without
    waiting, and the next epoch's step is built on its parameters and handed over too before the
    loss is read: the workers go from one step to the next without waiting for the client.  The
    numbers are the eager loop's, bit for bit; where the eager loop would not take the next step
    as built (a rollback, a non-finite loss, a failed step) it is discarded -- parameters, optimizer
    state, gradients, buffers and polygrad's random generator put back -- and built again, so a
    ``loss_fn`` with side effects of its own (a counter, gradients of tensors outside the model)
    sees that extra call.  An error raised while building it is raised at the epoch
    where the eager loop raises it.  ``History.steps_ahead`` counts the epochs run this way;
    ``pipeline=False`` turns it off (each epoch's step is then built after the last loss is read).
    """
    if epochs < 0:
        raise ValueError(f"fit: epochs must be >= 0, got {epochs}")
    if rollback_threshold is not None and not rollback_threshold >= 0:
        raise ValueError(f"fit: rollback_threshold must be >= 0 or None, got {rollback_threshold}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"fit: lr_decay must be in (0, 1], got {lr_decay}")
    if checkpoint_every < 1:
        raise ValueError(f"fit: checkpoint_every must be >= 1, got {checkpoint_every}")

    mode = _compile_mode(compile)
    keep_heap_top()  # each epoch frees its intermediates: keep the heap's pages (runtime/heap.py)
    history = History(compile_mode=mode)
    # pure mode with an optimizer that replaces its arrays: the step runs inside the compiled call
    # (one replay), undone where the eager loop would not have stepped; else a replay of its own
    inside = mode == "pure" and _replaces_arrays(optimizer)
    step = None if mode == "eager" else _compiled_step(model, optimizer, loss_fn, mode == "pure", inside)
    # an optimizer whose step machinery is its author's own runs eagerly: its Python is not proven pure
    pure_update = mode == "pure" and not inside and _own_step_machinery(optimizer)
    update = _compiled_update(optimizer) if pure_update else optimizer.step
    undo: _StepUndo | None = None
    good: _Snapshot | _HeldSnapshot | None = None
    # pure mode keeps its checkpoints by reference where the undo holds all they would copy
    hold = inside and checkpoint_path is None and _only_parameters(model, optimizer)
    # a lazy backend's eager loop with no callback builds and submits the next epoch's step before it
    # reads this epoch's loss (_speculate): nothing runs between the epochs that could change it
    pipeline = (pipeline and mode == "eager" and callback is None and _steps_ahead(optimizer)
                and _submits(optimizer) and _buffers_immutable(model))
    # the next epoch's step, submitted (or what building it raised); discarded where eager would not take it
    ahead: _Submitted | _Raised | None = None
    model.train()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        undo = None  # this epoch's step's undo, where the step runs before the loss is read
        submitted: _Submitted | None = None  # this epoch's step, submitted before its loss is read
        if isinstance(ahead, _Raised):  # loss_fn (or backward) raised for this epoch, on this state
            ahead.reraise()
        if ahead is not None:  # built and submitted during the last epoch
            submitted, ahead = ahead, None
            history.steps_ahead += 1
        elif step is not None:
            if inside:  # what the eager loop reads before its step, and the step's undo
                lr = optimizer.current_lr()
                undo = _StepUndo(optimizer)
            loss, metrics = step()  # zero_grad + forward + backward (+ the step, inside), compiled
            backward_done = True
        else:
            loss, metrics = _split(loss_fn())
            _check_loss(loss)
            backward_done = False
        if submitted is None and loss._be.lazy:
            # a lazy backend computes what is read: run backward first, so the loss and the
            # gradients are materialised together and the forward pass runs once, not twice
            if not backward_done:
                optimizer.zero_grad()
                loss.backward()
                backward_done = True
            if not inside and _steps_ahead(optimizer):  # the step joins the loss's graph: one submission
                submitted = _submit_step(optimizer, loss, metrics, wait=not pipeline)
            else:
                pg.materialize(loss, *(p.grad for p in optimizer._params()))
        if submitted is not None:
            loss, metrics, lr, undo = submitted.loss, submitted.metrics, submitted.lr, submitted.undo
            backward_done = True
            if pipeline and epoch + 1 < epochs:
                try:
                    ahead = _speculate(model, optimizer, loss_fn)
                except BaseException:  # an interrupt while the step ran: as the waiting loop's, undone
                    undo.restore()
                    raise
            _join(submitted, ahead if isinstance(ahead, _Submitted) else None)
        value = float(loss.item())
        if not inside and undo is None:
            lr = optimizer.current_lr()
        rise_too_big = (good is not None and rollback_threshold is not None
                        and value - good.loss > rollback_threshold * abs(good.loss) and value - good.loss > 1e-12)
        if ahead is not None and (not math.isfinite(value) or rise_too_big):
            if isinstance(ahead, _Submitted):
                ahead.take_back()  # the eager loop would build the next step on other parameters
            ahead = None
        if not math.isfinite(value) and good is None:
            if undo is not None:
                undo.restore()  # the eager loop raises before its step
            raise NonFiniteError(f"fit: the loss is {value} at epoch {epoch}, before any good checkpoint")
        if good is not None and (not math.isfinite(value) or rise_too_big):
            if undo is not None:
                undo.restore()  # the eager loop does not step this epoch
            if history.rollbacks >= max_rollbacks:
                history.stopped_early = True
                history.stop_reason = f"{max_rollbacks} rollbacks; the loss keeps rising (last {value:.4g})"
                history.records.append(EpochRecord(epoch, epochs, value, lr, False,
                                                   time.perf_counter() - t0, metrics))
                break
            if isinstance(good, _HeldSnapshot):
                good = good.resolve(model, optimizer)
            base_lrs = [g["lr"] for g in optimizer.param_groups]
            model.load_state_dict(good.model)
            optimizer.load_state_dict(good.optimizer)
            for g, base in zip(optimizer.param_groups, base_lrs):
                g["lr"] = base * lr_decay
            history.rollbacks += 1
            record = EpochRecord(epoch, epochs, value, lr, True, time.perf_counter() - t0, metrics)
        else:
            if good is None or (value <= good.loss and epoch - good.epoch >= checkpoint_every):
                if hold and undo is not None and _holdable(undo, optimizer):
                    good = _HeldSnapshot(epoch, value, undo, optimizer)
                elif undo is not None:  # the state before this epoch's step, as the eager loop snapshots it
                    # the next step, built already, is taken back first (its forward moved the
                    # buffers the snapshot holds) and put back after
                    retracted = ahead.take_back() if isinstance(ahead, _Submitted) else None
                    redo = undo.restore()
                    good = _snapshot(epoch, value, model, optimizer)
                    # saved before the step is redone: a failing save leaves the state from before
                    # the step, as the eager loop (which saves, then steps) does
                    _save_checkpoint(good, checkpoint_path)
                    redo.restore()
                    if retracted is not None:
                        retracted.restore()
                else:
                    good = _snapshot(epoch, value, model, optimizer)
                    _save_checkpoint(good, checkpoint_path)
            if value < history.best_loss:
                history.best_loss, history.best_epoch = value, epoch
            if not backward_done:
                optimizer.zero_grad()
                loss.backward()
            if not inside and undo is None:
                update()
            record = EpochRecord(epoch, epochs, value, lr, False, time.perf_counter() - t0, metrics)
        history.records.append(record)
        if callback is not None and callback(record) is True:
            history.stopped_early = True
            history.stop_reason = f"callback stopped training after epoch {epoch}"
            break
    if step is not None:
        history.replays = step.stats["replays"]
    return history
