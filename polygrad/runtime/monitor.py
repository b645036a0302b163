"""The built-in monitor: a pluggy plugin on polygrad's event hooks.

::

    with pg.monitor() as m:
        for epoch in range(epochs):
            loss = train_step()
            print(m.step(loss=float(loss)))     # one printable line per step / epoch
    print(m.summary())                          # table, one row per step
    report = m.to_dict()                        # the same, JSON-serialisable

Per step it records: the ops executed, the nnz ratio (density) of each sparse op, the global
gradient norm of each backward pass, memory (psutil RSS; device memory as the backends in use
report it through ``Backend.memory_used``), the layout decisions of the automatic layout policy
and every fallback.  It warns through ``logging`` (logger ``polygrad.runtime.monitor``) on NaN/Inf
gradients, an op whose output has a NaN although its inputs have none (a NaN-producing kernel,
or 0/0, inf-inf in the user's math), an exploding gradient norm and memory above the budget.

A monitor records the ops of the thread that started it (``all_threads=True``: of every thread),
so two threads, each with its own monitor, never see each other's work.

Cost: the event hooks are called only while some plugin implements them, and the monitor is
registered only while it is enabled (inside ``with``, or between ``start()`` and ``stop()``;
``pause()``/``resume()`` in between).  A created but disabled monitor is not registered at all,
so dispatch pays exactly what it pays with no monitor (measured by ``python -m benchmarks
dispatch``).
"""
from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..ir.ops import SPARSE
from .config import config
from .hookspecs import hookimpl
from .registry import registry

log = logging.getLogger("polygrad.runtime.monitor")

_MIB = 1 << 20
_SPARSE_OPS = frozenset(op.value for op in SPARSE)


def _rss() -> int | None:
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - psutil missing or the platform refuses: no memory figure
        return None


def _device_bytes(backends: set) -> int | None:
    """Bytes the given backends hold on their devices (``Backend.memory_used``); None when every
    one of them keeps its arrays in host memory (the RSS figure already counts those)."""
    total = None
    for name in sorted(backends):
        try:
            used = registry.get(name).memory_used()
        except Exception:  # noqa: BLE001 - a backend that cannot report is left out of the figure
            used = None
        if used is not None:
            total = (total or 0) + int(used)
    return total


def _default_budget() -> int | None:
    """``pg.config.memory_fraction`` of the machine's total memory."""
    try:
        import psutil

        return int(config.memory_fraction * psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001
        return None


def _sum_squares(g: Any) -> float:
    """sum(g**2) in float64 on the gradient's own device (one host sync for cupy)."""
    data = g._data
    if hasattr(data, "astype") and hasattr(data, "sum"):
        return float((data.astype("float64") ** 2).sum())
    import numpy as np
    arr = np.asarray(g._be.to_numpy(data), dtype=np.float64)
    return float((arr * arr).sum())


def _has_nan(t: Any) -> bool:
    """Whether floating tensor ``t`` holds a NaN (on its own device; sparse: its values)."""
    if t.dtype.kind != "f":
        return False
    t = getattr(t, "_values", t)
    data = t._data
    if not hasattr(data, "any"):
        import numpy as np
        data = np.asarray(t._be.to_numpy(data))
    return bool((data != data).any())


def _density(op: str, inputs: tuple, output: Any) -> tuple[int, int | None, int | None]:
    """(nnz, rows, cols) of the sparse operand of a sparse op, from shapes (and the node's pattern)."""
    node = getattr(output, "_node", None)
    pattern = node.attrs.get("pattern") if node is not None else None
    if pattern is not None:
        return pattern.nnz, pattern.shape[0], pattern.shape[1]
    if op == "spmm":        # (values[nnz], x[m, F]) -> [n, F]
        return inputs[0].shape[0], output.shape[0], inputs[1].shape[0]
    if op == "sddmm":       # (p[n, F], q[m, F]) -> [nnz]
        return output.shape[0], inputs[0].shape[0], inputs[1].shape[0]
    return inputs[0].shape[0], output.shape[0], None  # segment ops: the column count is not visible


@dataclass
class SparseOpStats:
    calls: int = 0
    nnz: int = 0                     # of the last call
    shape: tuple | None = None       # (rows, cols) of the last call, cols None when unknown
    density_sum: float = 0.0
    density_calls: int = 0

    @property
    def density(self) -> float | None:
        return self.density_sum / self.density_calls if self.density_calls else None

    def to_dict(self) -> dict:
        return {"calls": self.calls, "nnz": self.nnz, "shape": list(self.shape) if self.shape else None,
                "density": self.density}


@dataclass
class StepRecord:
    """What happened between two ``Monitor.step()`` calls.  ``str(record)`` is a one-line report."""
    step: int
    metrics: dict = field(default_factory=dict)
    ops: Counter = field(default_factory=Counter)             # (op, backend, layout) -> calls
    sparse: dict = field(default_factory=dict)                # "op/layout RxC" -> SparseOpStats
    grad_norms: list = field(default_factory=list)            # one per backward pass
    backward_seconds: float = 0.0
    rss_bytes: int | None = None                              # at the end of the step
    peak_rss_bytes: int | None = None                         # largest sample during the step
    gpu_bytes: int | None = None
    layouts: Counter = field(default_factory=Counter)         # "op->layout" -> decisions
    layout_reasons: dict = field(default_factory=dict)        # "op->layout" -> last reason
    fallbacks: Counter = field(default_factory=Counter)       # "op/backend/layout: Error" -> times
    nan_ops: Counter = field(default_factory=Counter)         # "op/backend/layout" -> NaN from NaN-free inputs
    warnings: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def grad_norm(self) -> float | None:
        """Gradient norm of the last backward pass of the step."""
        return self.grad_norms[-1] if self.grad_norms else None

    def line(self) -> str:
        parts = [f"step {self.step}"]
        parts += [f"{k} {_fmt(v)}" for k, v in self.metrics.items()]
        parts.append(f"grad_norm {_fmt(self.grad_norm)}")
        if self.peak_rss_bytes is not None:
            parts.append(f"rss {self.peak_rss_bytes / _MIB:.1f} MiB")
        if self.gpu_bytes is not None:
            parts.append(f"gpu {self.gpu_bytes / _MIB:.1f} MiB")
        for key, s in self.sparse.items():
            dens = f" ({100 * s.density:.3g}%)" if s.density is not None else ""
            parts.append(f"{key} nnz {s.nnz}{dens} x{s.calls}")
        if self.layouts:
            parts.append("layouts " + ", ".join(f"{k}:{n}" for k, n in self.layouts.items()))
        parts.append(f"fallbacks {sum(self.fallbacks.values())}")
        if self.nan_ops:
            parts.append(f"nan-producing ops {sum(self.nan_ops.values())}")
        if self.warnings:
            parts.append(f"warnings {len(self.warnings)}")
        parts.append(f"{self.seconds:.3g} s")
        return " | ".join(parts)

    __str__ = line

    def to_dict(self) -> dict:
        return {
            "step": self.step, "metrics": dict(self.metrics), "ops": {"/".join(k): n for k, n in self.ops.items()},
            "ops_total": sum(self.ops.values()),
            "sparse": {k: s.to_dict() for k, s in self.sparse.items()},
            "grad_norm": self.grad_norm, "grad_norms": list(self.grad_norms),
            "backward_seconds": self.backward_seconds, "rss_bytes": self.rss_bytes,
            "peak_rss_bytes": self.peak_rss_bytes, "gpu_bytes": self.gpu_bytes,
            "layouts": dict(self.layouts), "layout_reasons": dict(self.layout_reasons),
            "fallbacks": dict(self.fallbacks), "nan_ops": dict(self.nan_ops), "warnings": list(self.warnings),
            "seconds": self.seconds,
        }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}" if 1e-3 <= abs(v) < 1e5 or v == 0 else f"{v:.3e}"
    return str(v)


class Monitor:
    """Collects per-step statistics from polygrad's event hooks (see the module docstring).

    Parameters
    ----------
    memory_budget:
        bytes of process RSS above which a warning is logged (default: ``pg.config.memory_fraction``
        of total memory).
    explode_factor:
        warn when a gradient norm exceeds this many times the median of the recent norms.
    max_grad_norm:
        warn when a gradient norm exceeds this absolute value (None: no absolute limit).
    warmup:
        backward passes seen before the relative explosion test starts.
    check_nan:
        check every op's output for NaN (one pass over it) and warn, once per op, when NaN-free
        inputs gave a NaN output.
    all_threads:
        record the ops of every thread, not only of the thread that called ``start()``.
    """

    def __init__(self, memory_budget: int | None = None, explode_factor: float = 10.0,
                 max_grad_norm: float | None = None, warmup: int = 3, logger: logging.Logger | None = None,
                 check_nan: bool = True, all_threads: bool = False):
        self.check_nan = check_nan
        self.all_threads = all_threads
        self._thread: int | None = None
        self.memory_budget = memory_budget if memory_budget is not None else _default_budget()
        self.explode_factor = explode_factor
        self.max_grad_norm = max_grad_norm
        self.warmup = warmup
        self.log = logger or log
        self.steps: list[StepRecord] = []
        self.enabled = False
        self._history: list[float] = []
        self._backends_seen: set[str] = set()
        self._current = StepRecord(0)
        self._t0 = time.perf_counter()
        self._memory_warned = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "Monitor":
        """Register the hooks (idempotent).  Until then the monitor costs nothing."""
        if not self.enabled:
            registry.load()
            self._thread = threading.get_ident()
            registry.register_plugin(self, f"polygrad-monitor-{id(self)}")
            self.enabled = True
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> "Monitor":
        """Unregister the hooks; the open step (if anything happened in it) is closed."""
        if self.enabled:
            registry.unregister_plugin(self)
            self.enabled = False
            if self._has_activity(self._current):
                self.step()
        return self

    def pause(self) -> None:
        """Stop listening without closing the step (dispatch is back to zero overhead)."""
        if self.enabled:
            registry.unregister_plugin(self)
            self.enabled = False

    def resume(self) -> None:
        if not self.enabled:
            if self._thread is None:
                self._thread = threading.get_ident()
            registry.register_plugin(self, f"polygrad-monitor-{id(self)}")
            self.enabled = True

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- event hooks ------------------------------------------------------------------------------
    @hookimpl
    def polygrad_op_executed(self, op: str, backend: str, layout: str, inputs: tuple, output: Any) -> None:
        if not self._mine():
            return
        cur = self._current
        if self.check_nan and _has_nan(output) and not any(_has_nan(t) for t in inputs):
            key = f"{op}/{backend}/{layout}"
            if key not in cur.nan_ops:
                self._warn(f"op '{op}' on backend {backend!r} ({layout}) produced NaN from NaN-free inputs")
            cur.nan_ops[key] += 1
        cur.ops[(op, backend, layout)] += 1  # a tuple key: formatting waits for the report
        self._backends_seen.add(backend)
        if op in _SPARSE_OPS:
            nnz, rows, cols = _density(op, inputs, output)
            # one entry per op and operand shape: A (n x n) and sparse features (n x F) stay apart
            key = f"{op}/{layout} {rows}x{'?' if cols is None else cols}"
            stats = cur.sparse.get(key)
            if stats is None:
                stats = cur.sparse[key] = SparseOpStats()
            stats.calls += 1
            stats.nnz = nnz
            stats.shape = (rows, cols)
            if rows and cols:
                stats.density_sum += nnz / (rows * cols)
                stats.density_calls += 1

    @hookimpl
    def polygrad_layout_chosen(self, op: str, shape: tuple, nnz: int, density: float, layout: str,
                               reason: str) -> None:
        if not self._mine():
            return
        key = f"{op}->{layout}"
        self._current.layouts[key] += 1
        self._current.layout_reasons[key] = f"{reason} (shape {tuple(shape)}, density {density:.3g})"

    @hookimpl
    def polygrad_fallback(self, op: str, backend: str, layout: str, exception: BaseException) -> None:
        if not self._mine():
            return
        key = f"{op}/{backend}/{layout}: {type(exception).__name__}"
        first = key not in self._current.fallbacks
        self._current.fallbacks[key] += 1
        if first:
            self.log.info("polygrad monitor: fallback for op '%s' on backend %r (%s): %s", op, backend, layout,
                          exception)

    @hookimpl
    def polygrad_backward_finished(self, num_nodes: int, seconds: float, grads: list) -> None:
        if not self._mine():
            return
        cur = self._current
        cur.backward_seconds += seconds
        total = 0.0
        bad = []
        for leaf, g in grads:
            if g is None or g.dtype.kind != "f":
                continue
            s = _sum_squares(g)
            if not math.isfinite(s):
                import numpy as np
                if not np.isfinite(np.asarray(g.numpy())).all():
                    bad.append(tuple(leaf.shape))
            total += s
        norm = math.sqrt(total) if math.isfinite(total) else total
        cur.grad_norms.append(norm)
        if bad:
            self._warn(f"non-finite (NaN/Inf) gradient in {len(bad)} tensor(s) of shape(s) {bad[:5]}")
        elif self.max_grad_norm is not None and norm > self.max_grad_norm:
            self._warn(f"gradient norm {norm:.4g} exceeds max_grad_norm {self.max_grad_norm:.4g}")
        elif len(self._history) >= self.warmup and math.isfinite(norm):
            typical = statistics.median(self._history[-20:])
            if typical > 0 and norm > self.explode_factor * typical:
                self._warn(f"exploding gradient: norm {norm:.4g} is {norm / typical:.3g}x the recent median "
                           f"{typical:.4g}")
        if math.isfinite(norm):
            self._history.append(norm)
        self._sample_memory()

    # -- steps ------------------------------------------------------------------------------------
    def step(self, **metrics: Any) -> StepRecord:
        """Close the current step (an iteration or an epoch) and return its record.

        Keyword arguments (e.g. ``loss=0.69, epoch=3``) are stored with the record and printed by
        its one-line report: ``print(m.step(loss=loss.item()))``.
        """
        cur = self._current
        cur.metrics.update({k: (float(v) if hasattr(v, "__float__") and not isinstance(v, (int, bool)) else v)
                            for k, v in metrics.items()})
        self._sample_memory()
        now = time.perf_counter()
        cur.seconds = now - self._t0
        self._t0 = now
        self.steps.append(cur)
        self._current = StepRecord(cur.step + 1)
        self._memory_warned = False
        return cur

    def epoch_report(self) -> str:
        """The one-line report of the last closed step ("" before the first)."""
        return self.steps[-1].line() if self.steps else ""

    @property
    def current(self) -> StepRecord:
        """The step being recorded (not closed yet)."""
        return self._current

    # -- reports ------------------------------------------------------------------------------------
    def summary(self) -> str:
        """A plain-text table, one row per closed step, then totals and warnings."""
        records = self.steps + ([self._current] if self._has_activity(self._current) else [])
        if not records:
            return "polygrad monitor: nothing recorded"
        metric_keys: list[str] = []
        for r in records:
            metric_keys += [k for k in r.metrics if k not in metric_keys]
        sparse_keys: list[str] = []
        for r in records:
            sparse_keys += [k for k in r.sparse if k not in sparse_keys]
        header = ["step", *metric_keys, "ops", "grad_norm", "rss_MiB"]
        if any(r.gpu_bytes is not None for r in records):
            header.append("gpu_MiB")
        header += [f"{k} nnz%" for k in sparse_keys] + ["layouts", "fallbacks", "warnings", "seconds"]
        rows = []
        for r in records:
            row = [str(r.step), *(_fmt(r.metrics.get(k)) for k in metric_keys), str(sum(r.ops.values())),
                   _fmt(r.grad_norm), "-" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / _MIB:.1f}"]
            if "gpu_MiB" in header:
                row.append("-" if r.gpu_bytes is None else f"{r.gpu_bytes / _MIB:.1f}")
            for k in sparse_keys:
                s = r.sparse.get(k)
                row.append("-" if s is None or s.density is None else f"{100 * s.density:.3g}")
            row += [",".join(f"{k}:{n}" for k, n in r.layouts.items()) or "-", str(sum(r.fallbacks.values())),
                    str(len(r.warnings)), f"{r.seconds:.3g}"]
            rows.append(row)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        fallbacks: Counter[str] = Counter()
        for r in records:
            fallbacks.update(r.fallbacks)
        if fallbacks:
            lines.append("fallbacks: " + ", ".join(f"{k} x{n}" for k, n in fallbacks.items()))
        warnings = [f"step {r.step}: {w}" for r in records for w in r.warnings]
        if warnings:
            lines.append("warnings:")
            lines += [f"  {w}" for w in warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Every closed step (and the open one, if anything happened in it), JSON-serialisable."""
        return {
            "steps": [r.to_dict() for r in self.steps],
            "current": self._current.to_dict() if self._has_activity(self._current) else None,
            "warnings": [f"step {r.step}: {w}" for r in self.steps + [self._current] for w in r.warnings],
            "settings": {"memory_budget": self.memory_budget, "explode_factor": self.explode_factor,
                         "max_grad_norm": self.max_grad_norm, "warmup": self.warmup},
        }

    # -- internals ----------------------------------------------------------------------------------
    def _mine(self) -> bool:
        """Whether the event comes from a thread this monitor records."""
        return self.all_threads or threading.get_ident() == self._thread

    @staticmethod
    def _has_activity(r: StepRecord) -> bool:
        return bool(r.ops or r.grad_norms or r.layouts or r.fallbacks or r.metrics or r.warnings or r.nan_ops)

    def _warn(self, message: str) -> None:
        self._current.warnings.append(message)
        self.log.warning("polygrad monitor (step %d): %s", self._current.step, message)

    def _sample_memory(self) -> None:
        cur = self._current
        rss = _rss()
        if rss is not None:
            cur.rss_bytes = rss
            cur.peak_rss_bytes = rss if cur.peak_rss_bytes is None else max(cur.peak_rss_bytes, rss)
            if self.memory_budget is not None and rss > self.memory_budget and not self._memory_warned:
                self._memory_warned = True
                self._warn(f"memory above the budget: RSS {rss / _MIB:.1f} MiB > {self.memory_budget / _MIB:.1f} MiB")
        if self._backends_seen:
            cur.gpu_bytes = _device_bytes(self._backends_seen)


def monitor(**kwargs: Any) -> Monitor:
    """``with pg.monitor() as m:`` -- a :class:`Monitor` (its hooks are registered on ``with``/``start()``)."""
    return Monitor(**kwargs)
