"""Benchmark "value": polygrad.Value vs micrograd on micrograd's own moons MLP training step.

The workload is micrograd's ``demo.ipynb``: a 2 -> 16 -> 16 -> 1 ReLU MLP on 100 two-moons samples,
loss = mean max-margin (``relu(1 - y * score)``) + 1e-4 * sum of squared parameters, plain SGD
with ``lr = 1 - 0.9 * k / 100``.  One *step* = build the loss graph, zero_grad, backward, update.

* micrograd runs with its own ``micrograd.nn.MLP`` (the PyPI package).
* polygrad runs the *same code* (an MLP class written here, line for line micrograd's ``nn``,
  over ``polygrad.Value`` -- the real ``polygrad.nn`` is not used) with the same initial weights,
  so both compute the same losses; the benchmark asserts they agree to 1e-9 at every step.
* "polygrad + sum_of" is the same model written with ``Value.sum_of`` (one n-ary add per neuron
  instead of a chain of binary adds): identical numbers, a shallower graph.  Informational; the
  targets apply to the drop-in row.

Two regimes are measured side by side in one run:

(a) *as shipped*: the garbage collector enabled, as users run it.  micrograd's ``_backward``
    closures put every node in a reference cycle, so its graphs are only freed by the cyclic GC;
    polygrad's graphs have no cycles and are freed by reference counting.
(b) *GC off*: ``gc.disable()`` around the timed steps (a ``gc.collect()`` between steps, untimed,
    keeps micrograd's uncollectable-until-then garbage from piling up).  This isolates the cost of
    the engines themselves.

Targets: polygrad / micrograd <= 0.15 as shipped and <= 0.8 with GC off.

A section from ``benchmarks/compile_step.py`` times the moons step eager, under ``pg.compile``
(default mode, target <= 0.8x PyTorch eager), under ``pg.compile(pure=True)`` (target <= 0.4x) and
in PyTorch eager, in the same run.  Two more sections come from ``benchmarks/tensor_step.py``: the
same step on Tensors (numpy backend, target <= 1 ms) and the per-op dispatch overhead.  Extension
hook: append a ``section(quick: bool) -> {"rows": [...], "summary": {...}}`` function to
:data:`EXTRA_SECTIONS` (from this module or one imported here); its rows are appended to the table
and its summary merged into the summary (keys should be prefixed with the section name).
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any, Callable

import numpy as np

from benchmarks._harness import optional_import, register, skipped_row

#: Extra sections appended to this benchmark: ``fn(quick) -> {"rows": [...], "summary": {...}}``.
EXTRA_SECTIONS: list[Callable[[bool], dict]] = []


def _tensor_sections(quick: bool) -> dict:
    from benchmarks.tensor_step import dispatch_overhead, moons_tensor_step
    out = moons_tensor_step(quick)
    extra = dispatch_overhead(quick)
    return {"rows": out["rows"] + extra["rows"], "summary": {**out["summary"], **extra["summary"]}}


EXTRA_SECTIONS.append(_tensor_sections)


def _compiled_section(quick: bool) -> dict:
    from benchmarks.compile_step import moons_compiled_section
    return moons_compiled_section(quick)


EXTRA_SECTIONS.append(_compiled_section)

TARGET_AS_SHIPPED = 0.15
TARGET_GC_OFF = 0.8
LOSS_RTOL = 1e-9


# ---------------------------------------------------------------------------------------------
# data: sklearn.datasets.make_moons(n_samples=100, noise=0.1), inline with numpy
# ---------------------------------------------------------------------------------------------
def make_moons(n: int = 100, noise: float = 0.1, seed: int = 1) -> tuple[list[list[float]], list[int]]:
    """Two interleaving half circles; labels in {-1, +1} (micrograd's demo: ``y*2 - 1``)."""
    rng = np.random.default_rng(seed)
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, np.pi, n_out)
    t_in = np.linspace(0.0, np.pi, n_in)
    X = np.concatenate([
        np.stack([np.cos(t_out), np.sin(t_out)], axis=1),
        np.stack([1.0 - np.cos(t_in), 1.0 - np.sin(t_in) - 0.5], axis=1),
    ])
    y = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    perm = rng.permutation(n)
    X = X[perm] + rng.normal(scale=noise, size=(n, 2))
    y = y[perm] * 2 - 1
    return [[float(a), float(b)] for a, b in X], [int(v) for v in y]


# ---------------------------------------------------------------------------------------------
# models over polygrad.Value: micrograd's nn.py, line for line (plus a sum_of variant)
# ---------------------------------------------------------------------------------------------
def _make_mlp_classes(Value: Any, use_sum_of: bool) -> Any:
    class Module:
        def zero_grad(self) -> None:
            for p in self.parameters():
                p.grad = 0

        def parameters(self) -> list:
            return []

    class Neuron(Module):
        def __init__(self, nin: int, nonlin: bool = True) -> None:
            self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
            self.b = Value(0)
            self.nonlin = nonlin

        if use_sum_of:
            def __call__(self, x: list) -> Any:
                act = Value.sum_of([self.b, *(wi * xi for wi, xi in zip(self.w, x))])
                return act.relu() if self.nonlin else act
        else:
            def __call__(self, x: list) -> Any:
                act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
                return act.relu() if self.nonlin else act

        def parameters(self) -> list:
            return self.w + [self.b]

    class Layer(Module):
        def __init__(self, nin: int, nout: int, **kwargs: Any) -> None:
            self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

        def __call__(self, x: list) -> Any:
            out = [n(x) for n in self.neurons]
            return out[0] if len(out) == 1 else out

        def parameters(self) -> list:
            return [p for n in self.neurons for p in n.parameters()]

    class MLP(Module):
        def __init__(self, nin: int, nouts: list[int]) -> None:
            sz = [nin] + nouts
            self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1) for i in range(len(nouts))]

        def __call__(self, x: list) -> Any:
            for layer in self.layers:
                x = layer(x)
            return x

        def parameters(self) -> list:
            return [p for layer in self.layers for p in layer.parameters()]

    return MLP


def _loss(Value: Any, model: Any, X: list, y: list, use_sum_of: bool = False) -> tuple[Any, float]:
    """micrograd demo.ipynb's ``loss()`` (full batch)."""
    inputs = [list(map(Value, xrow)) for xrow in X]
    scores = list(map(model, inputs))
    losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(y, scores)]
    if use_sum_of:
        data_loss = Value.sum_of(losses) * (1.0 / len(losses))
        reg_loss = 1e-4 * Value.sum_of([p * p for p in model.parameters()])
    else:
        data_loss = sum(losses) * (1.0 / len(losses))
        reg_loss = 1e-4 * sum((p * p for p in model.parameters()))
    total_loss = data_loss + reg_loss
    accuracy = [(yi > 0) == (scorei.data > 0) for yi, scorei in zip(y, scores)]
    return total_loss, sum(accuracy) / len(accuracy)


class _Engine:
    """One engine under test: its Value class, its model, and the (shared) data."""

    def __init__(self, label: str, Value: Any, model: Any, use_sum_of: bool, X: list, y: list) -> None:
        self.label, self.Value, self.model, self.use_sum_of = label, Value, model, use_sum_of
        self._X, self._y = X, y

    def set_params(self, values: list) -> None:
        params = self.model.parameters()
        assert len(params) == len(values)
        for p, v in zip(params, values):
            p.data = v
            p.grad = 0

    def step(self, k: int) -> float:
        total_loss, _acc = _loss(self.Value, self.model, self._X, self._y, self.use_sum_of)
        self.model.zero_grad()
        total_loss.backward()
        learning_rate = 1.0 - 0.9 * k / 100
        for p in self.model.parameters():
            p.data -= learning_rate * p.grad
        return float(total_loss.data)


def _time_steps(engine: _Engine, init: list, steps: int, gc_on: bool) -> tuple[list[float], list[float]]:
    """Reset weights, run 1 warm-up step, then ``steps`` timed steps.  Returns (times, losses)."""
    engine.set_params(init)
    was_enabled = gc.isenabled()
    gc.collect()
    times: list[float] = []
    losses: list[float] = []
    try:
        if gc_on:
            gc.enable()
        else:
            gc.disable()
        losses.append(engine.step(0))  # warm-up, untimed (its loss is still checked)
        for k in range(1, steps + 1):
            if not gc_on:
                gc.collect()  # untimed: keeps micrograd's cyclic garbage from accumulating
            t0 = time.perf_counter()
            loss = engine.step(k)
            times.append(time.perf_counter() - t0)
            losses.append(loss)
    finally:
        if was_enabled:
            gc.enable()
        else:
            gc.disable()
        gc.collect()
    return times, losses


def _check_losses(ref_label: str, ref: list[float], label: str, got: list[float]) -> float:
    worst = 0.0
    for k, (a, b) in enumerate(zip(ref, got)):
        err = abs(a - b) / max(1.0, abs(a))
        worst = max(worst, err)
        if not err <= LOSS_RTOL:
            raise AssertionError(
                f"value bench: loss mismatch at step {k}: {ref_label}={a!r} vs {label}={b!r} "
                f"(rel err {err:.3e} > {LOSS_RTOL})"
            )
    return worst


@register("value", "polygrad.Value vs micrograd: moons MLP (2-16-16-1) training step, GC on and off")
def run(quick: bool) -> dict:
    from polygrad.engine.value import Value as PValue

    steps = 2 if quick else 8
    X, y = make_moons(100, noise=0.1, seed=1)

    random.seed(1337)
    mg = optional_import("micrograd.nn")
    engines: list[_Engine] = []
    if mg is not None:
        from micrograd.engine import Value as MValue

        mg_model = mg.MLP(2, [16, 16, 1])
        init = [p.data for p in mg_model.parameters()]
        engines.append(_Engine("micrograd", MValue, mg_model, False, X, y))
    else:
        init = None
    pg_model = _make_mlp_classes(PValue, False)(2, [16, 16, 1])
    pgs_model = _make_mlp_classes(PValue, True)(2, [16, 16, 1])
    if init is None:
        init = [p.data for p in pg_model.parameters()]
    engines.append(_Engine("polygrad", PValue, pg_model, False, X, y))
    engines.append(_Engine("polygrad + sum_of", PValue, pgs_model, True, X, y))

    rows: list[dict] = []
    summary: dict[str, Any] = {"steps_timed": steps, "n_params": len(init), "n_samples": len(X)}
    if mg is None:
        rows.append(skipped_row("micrograd", section="moons MLP step: micrograd"))

    per: dict[tuple[str, str], float] = {}
    worst_err = 0.0
    for regime, gc_on in (("as shipped (GC on)", True), ("GC off", False)):
        ref_losses = None
        for e in engines:
            times, losses = _time_steps(e, init, steps, gc_on)
            med = statistics.median(times)
            per[(regime, e.label)] = med
            if ref_losses is None:
                ref_label, ref_losses = e.label, losses
            else:
                worst_err = max(worst_err, _check_losses(ref_label, ref_losses, e.label, losses))
            rows.append({
                "section": "moons MLP step",
                "regime": regime,
                "engine": e.label,
                "s/step (median)": med,
                "s/step (min)": min(times),
                "final loss": losses[-1],
            })
        if mg is not None:
            base = per[(regime, "micrograd")]
            for e in engines[1:]:
                for r in rows:
                    if r.get("regime") == regime and r.get("engine") == e.label:
                        r["ratio vs micrograd"] = per[(regime, e.label)] / base

    key = {"as shipped (GC on)": "gc_on", "GC off": "gc_off"}
    for (regime, label), med in per.items():
        summary[f"{label.replace(' + ', '_').replace(' ', '_')}_s_per_step_{key[regime]}"] = med
    summary["loss_max_rel_err"] = worst_err
    if mg is not None:
        r_on = per[("as shipped (GC on)", "polygrad")] / per[("as shipped (GC on)", "micrograd")]
        r_off = per[("GC off", "polygrad")] / per[("GC off", "micrograd")]
        summary.update({
            "ratio_as_shipped": r_on,
            "ratio_gc_off": r_off,
            "ratio_sum_of_as_shipped": per[("as shipped (GC on)", "polygrad + sum_of")]
            / per[("as shipped (GC on)", "micrograd")],
            "ratio_sum_of_gc_off": per[("GC off", "polygrad + sum_of")] / per[("GC off", "micrograd")],
            "target_as_shipped": TARGET_AS_SHIPPED,
            "target_gc_off": TARGET_GC_OFF,
            "meets_as_shipped": r_on <= TARGET_AS_SHIPPED,
            "meets_gc_off": r_off <= TARGET_GC_OFF,
            "micrograd_gc_share": 1.0 - per[("GC off", "micrograd")] / per[("as shipped (GC on)", "micrograd")],
        })
    else:
        summary.update({"ratio_as_shipped": None, "ratio_gc_off": None,
                        "skipped": "micrograd not installed (pip install polygrad-core[bench])"})

    for section in EXTRA_SECTIONS:
        extra = section(quick)
        rows.extend(extra.get("rows", []))
        summary.update(extra.get("summary", {}))
    return {"rows": rows, "summary": summary}
