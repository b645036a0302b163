"""``pg.compile``: make a training or inference step cheaper without changing its numbers.

Two modes, one promise -- eager's numbers, bit for bit, or a refusal you are told about:

**Default mode** (``pg.compile(fn)``): the step's Python runs on every call, so every branch,
host read (``loss.item()``, ``float()``, ``.numpy()``) and side effect happens exactly as eagerly:
``clip_grad_norm_`` inside the step keeps clipping, ``if not math.isfinite(loss.item())`` keeps
firing, a learning-rate warm-up computed in the step keeps warming up, ``losses.append(loss)``
appends every call, and parameters frozen, groups added, ``model.eval()``, a numpy mask edited in
place or a coefficient or graph swapped between calls all take effect.  What it saves is the
per-op work polygrad repeats from call to call: each op the Python issues is matched against the
*forward plan* -- the ops the last call issued, with what ``apply`` decided for each (inference,
kernel, which inputs the graph node keeps) -- and an equal one (op, attributes, operand shapes,
dtypes, backends, ``requires_grad``, grad mode) runs its kernel with those decisions; the first op
that differs runs, with the rest of the call, the full eager way and the plan is re-recorded
(:mod:`polygrad.compile.forward_plan`).  Each backward pass through a graph whose *structure* was
seen before runs as a plan -- the kernels eager ran for that structure, as one generated function
over this call's arrays (:mod:`polygrad.compile.backward_plan`) -- and when the whole forward
walked its plan with the same identities (each input from the same earlier op or leaf) the graph
is not even ordered again: a recipe recorded with the plan finds its tensors.  Correct by
construction: the kernels, arguments and order are eager's, a plan is used only for what it was
recorded for, and anything it cannot reproduce runs eagerly.

**Pure mode** (``pg.compile(fn, pure=True)``): the step's Python does not run at all once it is
captured; its kernels are replayed.  Much faster, for steps whose author promises -- as with
``jax.jit`` or tinygrad's ``TinyJit`` -- that the Python does nothing but issue ops.  What pure mode
can detect breaking that promise it refuses (the step then runs eagerly, with one
``RuntimeWarning``; ``compiled.reason`` says why) or re-captures, never silently replays:

* host reads of values the step computed (``loss.item()``, ``float(x)``, ``bool(x)``,
  ``x.numpy()``; ``nn.utils.clip_grad_norm_`` reads the norm) -- refused;
* a hyper-parameter written in Python (``g["lr"] = ...`` inside the step) -- refused (a scheduler's
  ``step()`` is replayed: use one);
* a list or dict the function reaches through its closure or globals changed by the step
  (``losses.append(loss)``, a counter), a closure or global name rebound or a numpy array there
  edited in place by the step -- refused;
* a tensor that requires grad made inside the step (saliency, FGSM, gradient penalty) -- refused;
* between calls: ``requires_grad`` of every tensor the step read, the train/eval mode of every
  module that ran (``Module.__call__`` reports it, however the step reached the module), each
  optimizer's parameter lists (``add_param_group``), numpy arrays read as data or indices (by
  content), the function's closure cells and globals (rebound; arrays by content) -- re-captured;
* at the replay's optimizer step: an update rule that changed shape (momentum turned on), and a
  change in which parameters eager updates as one concatenation (two groups' learning rates
  become equal, e.g. ``ReduceLROnPlateau`` at ``min_lr``; NaN bits depend on it) -- the call runs
  eagerly and is re-captured.  Parameters captured as one concatenation whose numbers part are
  updated as eager then updates them, without a fault.  One case is not checked: where a host
  call that cannot be repeated (a scheduler stepped inside the step) runs before the optimizer's
  step, rates becoming equal keep the captured separate updates -- eager's finite values, but NaN
  payload and sign bits may differ from eager's.

What pure mode cannot see stays the author's contract: attributes of objects reached through
``self`` or closures (``self.coef = 2.0``), Python values computed from state it does not guard.
When in doubt use the default mode; the demos and ``fit(compile="pure")`` use pure mode where a
test proves it gives eager's numbers.

Arguments (both modes): tensors, Python scalars, None, strings, tuples, lists and dicts of them,
modules and other hashable objects; a numpy array, a set or an unhashable object is a
:class:`CompileError` naming the argument.

The rest of this docstring describes the pure mode's capture and replay.

Pure mode: capture a step's kernel sequence once, then replay the kernels directly.

Eager polygrad pays, per op, for inference, validation, graph recording and Python dispatch:
about 2 us against well under 1 us for the numpy call itself, which is most of a small model's
step.  A compiled step pays it only while it is captured::

    @pg.compile(pure=True)
    def train_step(x, y):
        opt.zero_grad()
        loss = nn.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

The first call for a given guard key runs eagerly (a warm-up: optimizer state and layer caches
get built); the next two run eagerly too, each with a recorder that notes every kernel dispatch
runs (forward, VJP rules, fused backward kernels), the optimizer calls, the random draws and where
gradients and results end up.  The two recordings must agree (same kernels, attributes and
constants: a learning rate computed in Python and multiplied in as a number would differ, and is
refused rather than frozen); later calls run the *program*, generated as one Python function: the
kernel calls in order over local buffers, with no inference, validation, Node or Tensor between
them (an interpreter of the same program serves validation mode and event listeners).

What a replay reads afresh, every call: the tensors passed as arguments, the current storage of
every other tensor the step reads (parameters, optimizer-written values), the kernels themselves
(looked up in the registry's table, so ``inject_fault`` reaches them), the random generator
(dropout masks are drawn anew, in eager order, from ``pg.manual_seed``'s generator, or by the
backend from a key drawn there: ``Backend.random_mask``), and the optimizer: ``zero_grad()`` runs
as it is, and ``step()`` -- recorded as the ``Call`` s of its update rule eager runs (SGD, Adam: one
per large parameter, in eager's blocks, and one per group of small parameters sharing a rule, over
their concatenation, so NaN bits match eager's too) whose learning rate, bias corrections and
state are read afresh, then a host call advancing its
counters, or as one host call for optimizers without rules -- keeps schedules and Adam's step
counter right.  What is frozen at capture: Python control flow, Python numbers
and host (numpy) data the step turns into tensors itself -- pass data that changes as arguments.
The tensors a replay returns carry no autodiff graph: call ``backward()`` inside the step.

Rewrites: a capture's program may be changed where the result is bit for bit the same.  Rows
gathered from an SpMM's output (``logits[train_mask]`` after ``A @ (H W) + b``) are computed
alone, forward and in the fused backward (:func:`_push_row_gathers`: on Cora 140 of 2708 rows); a
two-layer GCN step's first layer then runs its feature SpMM and weight gradient over those rows'
2-hop neighbourhood and its first propagation over their 1-hop rows (``two_hop.py``: Cora 1664 and
644 rows), under a per-replay check whose failure runs the call eagerly (after repeated failures,
eagerly for a growing number of calls before capturing again); a fused kernel that declares the
primitive steps it runs over dispatch's kernels (``polygrad_steps``: the numpy backend's
cross-entropy and its backward) is replayed as those steps, the backward reading the forward's
instead of recomputing them (``inline_steps.py``); and a kernel that declares a small-output
variant (``polygrad_small``) is called through it at call sites whose output is small.

Guards (any change captures again, a bounded LRU cache of captures per function): argument
structure, shapes, dtypes, layouts, sparsity patterns (by identity), backends and
``requires_grad`` flags; Python scalars among the arguments (by value); grad mode; the default
backend; ``pg.config`` (fallback policy and chain, validation, layout policy); the train/eval
mode of the modules the function reaches; which event hooks are implemented; and whether each
gradient the step accumulates into was set.

Memory budget (``pg.config.memory_fraction``): a replay skips dispatch, so its kernels are not
checked one by one; it is budgeted once, at capture, where dispatch checked every output a replay
will allocate -- shapes, dtypes and the fraction are guards, so a replay allocates exactly the
sizes the capture approved.  Memory that becomes short between calls is not re-measured per replay
(that per-kernel check is part of the overhead a replay removes); a kernel that then fails (a
``MemoryError``) is a replay fault like any other: the call re-runs eagerly, where dispatch's check
refuses the op with a clear ``MemoryBudgetError``.  Learning-rate schedulers: an optimizer reads
its groups' ``lr`` when it steps, so a scheduler stepped between calls is seen by the next replay;
``LRScheduler.step()`` inside the compiled function is a host call every replay repeats, and
``ReduceLROnPlateau.step(metric)`` there (a host value) makes the capture refuse.

Safety: a kernel that raises (or returns a shape the capture did not see) during a replay drops
the capture and the call re-runs eagerly, through the usual fallback.  Once ``optimizer.step()``
has run in that replay a re-run would step twice, so a failing forward kernel after it is
recomputed in place through the fallback chain instead (a failing fused backward kernel there,
which no step written as zero_grad/forward/backward/step has, raises its error).  Errors raised by
the optimizer itself (a bad learning-rate schedule) are the user's and propagate unchanged.  A
step that falls back while being captured is never replayed.  ``POLYGRAD_VALIDATE=1`` shadow-checks every replayed
kernel against the scalar reference, and ``polygrad_op_executed`` / ``polygrad_backward_finished``
fire for replayed kernels and backward passes as they would eagerly (``polygrad_layout_chosen``
does not: layouts are part of the capture).  A backend opts out with ``supports_replay = False``.
"""
from __future__ import annotations

from .api import Compiled, compile  # noqa: A004 - pg.compile, like torch.compile
from .program import (Arg, AssertFinite, Backward, Call, Capture, CompileError, Entry, Fresh, Fused, Grad, Host,
                      Kernel, Load, SetData, SetGrad, SetState, StaleCapture, State)
from .recorder import fresh, host_call, keyed_call

__all__ = ["compile", "Compiled", "CompileError", "fresh", "host_call", "keyed_call", "Capture", "Entry", "Load",
           "Arg", "Grad", "Kernel", "Fused", "Fresh", "Host", "SetGrad", "SetData", "Backward", "AssertFinite",
           "Call", "State", "SetState", "StaleCapture"]
