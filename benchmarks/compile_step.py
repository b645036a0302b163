"""Section of the "value" benchmark: the moons MLP training step eager, compiled (``pg.compile``)
and in PyTorch eager, side by side in one run (target: compiled <= 0.5x PyTorch eager).

All three run the same step: a 2 -> 16 -> 16 -> 1 ReLU MLP on 100 two-moons points (float64),
loss = mean max-margin ``relu(1 - y * score)`` + 1e-4 * sum of squared parameters, zero_grad,
backward, SGD with micrograd's schedule ``lr = 1 - 0.9 * k / 100`` (PyTorch: ``LambdaLR``).
polygrad uses ``polygrad.optim.SGD`` (its ``lr_schedule``), so the compiled step is the eager one
replayed; the benchmark asserts that compiled and eager losses are identical.  Timing: best CPU
seconds per step over rounds that alternate the engines (the machines are shared and noisy);
PyTorch runs on one thread.
"""
from __future__ import annotations

import gc
import time
from typing import Any, Callable

import numpy as np

from benchmarks._harness import optional_import, skipped_row
from benchmarks.tensor_step import moons_mlp_loss

TARGET_COMPILED_OVER_TORCH = 0.5
SIZES = [2, 16, 16, 1]


def _data() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    from polygrad.data import make_moons
    X, y01 = make_moons(100, 0.1, seed=1)
    rng = np.random.default_rng(0)
    init = []
    for i in range(3):
        init.append(rng.uniform(-1, 1, (SIZES[i], SIZES[i + 1])))
        init.append(np.zeros(SIZES[i + 1]))
    return X, (y01 * 2 - 1)[:, None].astype(np.float64), init


def _polygrad_step(X: np.ndarray, y: np.ndarray, init: list[np.ndarray], compiled: bool) -> Callable[[], Any]:
    import polygrad as pg
    from polygrad import optim

    Xt, yt = pg.tensor(X, dtype=pg.float64), pg.tensor(y)
    params = [pg.tensor(a.copy(), requires_grad=True) for a in init]
    opt = optim.SGD(params, lr=1.0, lr_schedule=lambda k: 1.0 - 0.9 * (k % 100) / 100)

    def step():
        opt.zero_grad()
        loss = moons_mlp_loss(Xt, yt, params)
        loss.backward()
        opt.step()
        return loss

    return pg.compile(step) if compiled else step


def _torch_step(torch: Any, X: np.ndarray, y: np.ndarray, init: list[np.ndarray]) -> Callable[[], Any]:
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    params = [torch.tensor(a, requires_grad=True) for a in init]
    opt = torch.optim.SGD(params, lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - 0.9 * (k % 100) / 100)

    def step():
        opt.zero_grad()
        loss = moons_mlp_loss(Xt, yt, params)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    return step


def _best_cpu(fns: dict[str, Callable[[], Any]], rounds: int, inner: int) -> dict[str, float]:
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.process_time()
            for _ in range(inner):
                fn()
            best[name] = min(best[name], (time.process_time() - t) / inner)
    return best


def moons_compiled_section(quick: bool) -> dict:
    gc.collect()
    X, y, init = _data()
    eager, compiled = _polygrad_step(X, y, init, False), _polygrad_step(X, y, init, True)
    for k in range(20):  # warm-up, capture; and the replayed numbers are the eager ones
        a, b = eager().item(), compiled().item()
        if a != b:
            raise AssertionError(f"compiled moons step {k}: loss {b!r} != eager {a!r}")
    fns: dict[str, Callable[[], Any]] = {"eager": eager, "compiled": compiled}
    torch = optional_import("torch")
    if torch is not None:
        torch.set_num_threads(1)
        fns["torch"] = _torch_step(torch, X, y, init)
        for _ in range(20):
            fns["torch"]()
    best = _best_cpu(fns, 3 if quick else 7, 20 if quick else 100)
    rows = [{"section": "moons step: compiled vs eager", "engine": f"polygrad {name} (numpy)",
             "s/step (median)": best[name]} for name in ("eager", "compiled")]
    summary: dict[str, Any] = {"moons_eager_ms": best["eager"] * 1e3, "moons_compiled_ms": best["compiled"] * 1e3,
                               "moons_compiled_over_eager": best["compiled"] / best["eager"],
                               "moons_compiled_replays": compiled.stats["replays"]}
    if "torch" in best:
        rows.append({"section": "moons step: compiled vs eager", "engine": f"PyTorch {torch.__version__} eager",
                     "s/step (median)": best["torch"]})
        for row in rows:
            row["ratio vs torch"] = row["s/step (median)"] / best["torch"]
        summary.update({"moons_torch_ms": best["torch"] * 1e3,
                        "moons_eager_over_torch": best["eager"] / best["torch"],
                        "moons_compiled_over_torch": best["compiled"] / best["torch"],
                        "moons_compiled_target": TARGET_COMPILED_OVER_TORCH,
                        "moons_compiled_meets": best["compiled"] / best["torch"] <= TARGET_COMPILED_OVER_TORCH})
    else:
        rows.append(skipped_row("torch", section="moons step: compiled vs eager"))
    return {"rows": rows, "summary": summary}
