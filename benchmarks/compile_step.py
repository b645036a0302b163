"""Section of the "value" benchmark: the moons MLP training step eager, compiled (``pg.compile`` in
its default mode, which runs the step's Python every call, and with ``pure=True``, which replays
the kernels without it) and in PyTorch eager, side by side in one run (targets: default <= 0.8x
PyTorch eager, pure <= 0.4x).

All three run the same step: a 2 -> 16 -> 16 -> 1 ReLU MLP on 100 two-moons points (float64),
loss = mean max-margin ``relu(1 - y * score)`` + 1e-4 * sum of squared parameters, zero_grad,
backward, SGD with micrograd's schedule ``lr = 1 - 0.9 * k / 100`` (PyTorch: ``LambdaLR``).
polygrad uses ``polygrad.optim.SGD`` (its ``lr_schedule``), so the compiled steps are the eager
one; the benchmark asserts that both compiled losses and the eager ones are identical.  Timing: best CPU
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

TARGET_DEFAULT_OVER_TORCH = 0.8
TARGET_PURE_OVER_TORCH = 0.4
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


def _polygrad_step(X: np.ndarray, y: np.ndarray, init: list[np.ndarray], compiled: bool | str) -> Callable[[], Any]:
    """The moons step; ``compiled``: False (eager), True or "default" (pg.compile), "pure"."""
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

    if not compiled:
        return step
    return pg.compile(step, pure=compiled == "pure")


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
    fns: dict[str, Callable[[], Any]] = {"eager": _polygrad_step(X, y, init, False),
                                         "default": _polygrad_step(X, y, init, "default"),
                                         "pure": _polygrad_step(X, y, init, "pure")}
    for k in range(20):  # warm-up, capture; and the compiled numbers are the eager ones
        a, b, c = (fns[name]().item() for name in ("eager", "default", "pure"))
        if not a == b == c:
            raise AssertionError(f"compiled moons step {k}: losses {b!r} (default), {c!r} (pure) != eager {a!r}")
    torch = optional_import("torch")
    if torch is not None:
        torch.set_num_threads(1)
        fns["torch"] = _torch_step(torch, X, y, init)
        for _ in range(20):
            fns["torch"]()
    best = _best_cpu(fns, 3 if quick else 7, 20 if quick else 100)
    label = {"eager": "polygrad eager (numpy)", "default": "polygrad pg.compile (default mode, numpy)",
             "pure": "polygrad pg.compile(pure=True) (numpy)"}
    rows = [{"section": "moons step: compiled vs eager", "engine": label[name], "s/step (median)": best[name]}
            for name in ("eager", "default", "pure")]
    summary: dict[str, Any] = {"moons_eager_ms": best["eager"] * 1e3, "moons_default_ms": best["default"] * 1e3,
                               "moons_pure_ms": best["pure"] * 1e3,
                               "moons_default_over_eager": best["default"] / best["eager"],
                               "moons_pure_over_eager": best["pure"] / best["eager"],
                               "moons_pure_replays": fns["pure"].stats["replays"],  # type: ignore[attr-defined]
                               "moons_default_planned_backwards":
                                   fns["default"].plans.stats["planned"]}  # type: ignore[attr-defined]
    if "torch" in best:
        rows.append({"section": "moons step: compiled vs eager", "engine": f"PyTorch {torch.__version__} eager",
                     "s/step (median)": best["torch"]})
        for row in rows:
            row["ratio vs torch"] = row["s/step (median)"] / best["torch"]
        d, p = best["default"] / best["torch"], best["pure"] / best["torch"]
        summary.update({"moons_torch_ms": best["torch"] * 1e3,
                        "moons_eager_over_torch": best["eager"] / best["torch"],
                        "moons_default_over_torch": d, "moons_pure_over_torch": p,
                        "moons_default_target": TARGET_DEFAULT_OVER_TORCH, "moons_pure_target": TARGET_PURE_OVER_TORCH,
                        "moons_default_meets": d <= TARGET_DEFAULT_OVER_TORCH,
                        "moons_pure_meets": p <= TARGET_PURE_OVER_TORCH})
    else:
        rows.append(skipped_row("torch", section="moons step: compiled vs eager"))
    return {"rows": rows, "summary": summary}
