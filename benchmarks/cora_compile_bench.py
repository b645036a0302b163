"""Benchmark "cora_compile": the Cora GCN demo compiled against its ``--no-compile`` epoch (issue 20's
done-when: compiled <= 0.6x, same accuracy), measured so that a ratio can be trusted on a noisy VM.

Each *pair* is two fresh processes of the done-when's own command run back to back, ``python -m
polygrad demo gcn --data DIR --json --no-progress --compile`` and the same with ``--no-compile``
(the demo's ``epoch_time_ms``: the median over its 200 epochs, the first left out); the pair's
ratio is compiled / eager and the headline is the median of the pairs' ratios.  The order
alternates from pair to pair (compiled first, then eager first), so a drift of the machine's speed
during a pair does not favour one side.  Each row also gives the process's minor page faults (in
thousands, the whole process: loading included), its CPU time, the CPU it ended on and how often
it was preempted.

Why fresh processes: the figure of the done-when is the command's, and its epoch differed from
process to process -- partly the VM, partly polygrad: in some processes glibc gave the heap's top
back after every compiled epoch and faulted it in again (110-191 faults per epoch, 1.7-3.2 ms
against 1.2-1.4 ms; fixed by ``polygrad.runtime.heap``), which a single long process would have
shown for both sides or for neither.  The fault count tells such a process (~+30 thousand over 200
epochs) from a slow machine.

``--in-process`` instead alternates compiled and eager training runs (each the demo's
``train_gcn``, a fresh model) inside this one process, with each epoch's thread CPU time and page
faults: what the per-process state does to both sides cancels in each pair, which separates a
change's effect from the draw of a process.

``--baseline DIR`` adds a second checkout (its ``polygrad`` and ``backends`` imported from DIR
through ``PYTHONPATH``, its processes run in DIR: ``python -m`` puts the working folder ahead of
``PYTHONPATH``), interleaved in the same rounds: a change's eager epoch is compared with
the baseline's eager epoch measured in the same minutes (an eager slow-down would flatter the ratio).

``python -m benchmarks cora_compile [--pairs 6] [--epochs 200] [--data DIR] [--baseline DIR] [--in-process]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

from benchmarks._harness import planetoid_dir, register

TARGET_RATIO = 0.6

_DATASET: dict[str, Any] = {}


def train(data: str, compiled: bool, epochs: int) -> dict[str, Any]:
    """One run of the demo's GCN training on Cora in this process (``--in-process``): the demo's
    ``epoch_time_ms``, the median thread CPU time and minor page faults of an epoch (epoch end to
    epoch end, from the second epoch on, as the demo's median), the accuracy."""
    import time

    from polygrad import data as pdata
    from polygrad.apps import demos

    if data not in _DATASET:
        _DATASET[data] = pdata.load_planetoid(data, "cora")
    marks: list[float] = []
    faults: list[int] = []

    def mark(rec: Any) -> None:
        marks.append(time.thread_time())
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0)

    r = demos.train_gcn(_DATASET[data], seed=0, epochs=epochs, compile=compiled, on_epoch=mark)
    cpu = [b - a for a, b in zip(marks[1:], marks[2:])]
    faulted = [b - a for a, b in zip(faults[1:], faults[2:])]
    return {"epoch_time_ms": r["epoch_time_ms"], "test_accuracy": r["test_accuracy"],
            "compiled": r["history"].replays > 0,
            "cpu_ms": statistics.median(cpu) * 1e3 if cpu else float("nan"),
            "faults": statistics.median(faulted) if faulted else float("nan")}


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=6, help="compiled/eager pairs (default 6)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--data", default=None, help="Planetoid folder (default: the shared copy)")
    parser.add_argument("--baseline", default=None,
                        help="another checkout to interleave (its tree first on PYTHONPATH)")
    parser.add_argument("--cwd", default=None,
                        help="run the demo processes in this folder (their environment, and so where their "
                             "heap starts, differs: the heap-trim fault mode appeared from /tmp, not from a checkout)")
    parser.add_argument("--in-process", action="store_true",
                        help="alternate compiled and eager runs inside this process instead")


def demo_process(tree: str | None, cwd: str | None) -> tuple[dict[str, str], str | None]:
    """(environment, working folder) of a demo process that imports ``polygrad`` from ``tree``
    (None: the one this interpreter finds).  ``python -m`` puts its working folder first on
    ``sys.path``, ahead of ``PYTHONPATH``: run from a checkout, the baseline's process imported
    that checkout's polygrad, so both sides measured one tree.  A baseline process therefore runs
    in its own tree unless ``cwd`` is given, and a ``cwd`` holding another polygrad is refused."""
    env = dict(os.environ)
    if tree is None:
        return env, cwd
    env["PYTHONPATH"] = os.pathsep.join([p for p in (tree, env.get("PYTHONPATH")) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the other checkout as it is
    if cwd is None:
        return env, tree
    shadow = os.path.join(cwd, "polygrad")
    if os.path.isdir(shadow) and os.path.realpath(shadow) != os.path.realpath(os.path.join(tree, "polygrad")):
        raise SystemExit(f"cora_compile: --cwd {cwd} holds its own polygrad, which the baseline's "
                         f"process would import instead of {tree}'s")
    return env, cwd


def run_demo(data: str, compiled: bool, epochs: int, tree: str | None = None, cwd: str | None = None) -> dict[str, Any]:
    """One fresh process of ``python -m polygrad demo gcn ... --json``: its JSON result, with the
    process's minor page faults (thousands), CPU seconds, last CPU and involuntary switches."""
    env, cwd = demo_process(tree, cwd)
    argv = [sys.executable, "-m", "polygrad", "demo", "gcn", "--data", data, "--json", "--no-progress",
            "--epochs", str(epochs), "--compile" if compiled else "--no-compile"]
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    status, usage = proc.returncode, _last_child_usage()
    if status:
        raise RuntimeError(f"cora_compile: the demo failed ({status}): {err.strip()[-500:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(usage)
    return result


_CHILDREN = [resource.getrusage(resource.RUSAGE_CHILDREN)] if resource is not None else []


def _last_child_usage() -> dict[str, Any]:
    """The resources of the children that ended since the last call (here: the one demo process)."""
    if resource is None:
        return {}
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, _CHILDREN[0] = _CHILDREN[0], now
    return {"faults_k": round((now.ru_minflt - before.ru_minflt) / 1e3, 1),
            "cpu_s": round(now.ru_utime + now.ru_stime - before.ru_utime - before.ru_stime, 2),
            "preempted": now.ru_nivcsw - before.ru_nivcsw}


#: per-run figures shown beside the epoch time when the run reports them (fresh process / in-process)
_DETAILS = ("compiled", "faults_k", "cpu_s", "preempted", "cpu_ms", "faults")


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


@register("cora_compile", "Cora GCN demo: compiled / --no-compile epoch, interleaved fresh-process pairs",
          options=_options)
def run(quick: bool, pairs: int = 6, epochs: int = 200, data: str | None = None,
        baseline: str | None = None, in_process: bool = False, cwd: str | None = None) -> dict:
    data = os.path.abspath(data or os.fspath(planetoid_dir()))  # the processes may run elsewhere (--cwd)
    baseline = os.path.abspath(baseline) if baseline else None
    if quick:
        pairs, epochs = min(pairs, 2), min(epochs, 30)
    if in_process and baseline:
        raise SystemExit("cora_compile: --in-process runs this tree only (no --baseline)")
    trees: list[tuple[str, str | None]] = [("this", None)] + ([("baseline", baseline)] if baseline else [])
    rows: list[dict] = []
    ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
    eager: dict[str, list[float]] = {name: [] for name, _ in trees}
    compiled: dict[str, list[float]] = {name: [] for name, _ in trees}
    accuracies: set[float] = set()
    load_before = _load()
    for p in range(pairs):
        order = [True, False] if p % 2 == 0 else [False, True]
        # trees alternate too: this tree's pair first in even rounds, the baseline's first in odd ones
        for name, tree in (trees if p % 2 == 0 else trees[::-1]):
            ms: dict[bool, float] = {}
            for comp in order:
                r = train(data, comp, epochs) if in_process else run_demo(data, comp, epochs, tree, cwd)
                ms[comp] = r["epoch_time_ms"]
                accuracies.add(round(r["test_accuracy"], 6))
                rows.append({"pair": p, "tree": name, "mode": "compiled" if comp else "eager",
                             "epoch_ms": r["epoch_time_ms"], "test_acc": r["test_accuracy"],
                             **{k: r[k] for k in _DETAILS if k in r}, "load": round(_load(), 2)})
            ratios[name].append(ms[True] / ms[False])
            compiled[name].append(ms[True])
            eager[name].append(ms[False])
            rows[-1]["ratio"] = round(ratios[name][-1], 3)
    summary: dict[str, Any] = {"pairs": pairs, "epochs": epochs, "in_process": in_process, "target_ratio": TARGET_RATIO,
                               "load_before": round(load_before, 2), "load_after": round(_load(), 2),
                               "same_accuracy": len(accuracies) == 1,
                               "test_accuracy": sorted(accuracies)}
    for name, _ in trees:
        prefix = "" if name == "this" else f"{name}_"
        summary[f"{prefix}ratios"] = [round(r, 3) for r in ratios[name]]
        summary[f"{prefix}median_ratio"] = round(statistics.median(ratios[name]), 3)
        summary[f"{prefix}compiled_ms_median"] = round(statistics.median(compiled[name]), 3)
        summary[f"{prefix}eager_ms_median"] = round(statistics.median(eager[name]), 3)
    if baseline:
        # per round, this tree's eager epoch over the baseline's (measured minutes apart at most)
        per_round = [a / b for a, b in zip(eager["this"], eager["baseline"])]
        summary["eager_vs_baseline_median"] = round(statistics.median(per_round), 3)
        per_round = [a / b for a, b in zip(compiled["this"], compiled["baseline"])]
        summary["compiled_vs_baseline_median"] = round(statistics.median(per_round), 3)
    summary["meets_target"] = summary["median_ratio"] <= TARGET_RATIO and summary["same_accuracy"]
    return {"rows": rows, "summary": summary}
