"""Cora GCN epochs on numpy, jax eager, jax compiled (``pg.compile`` + the polygrad-jax plugin's
``jax.jit`` of the step's kernels) and a hand-written ``jax.jit`` GCN, measured in one run.

    POLYGRAD_PLANETOID_DIR=... python -m benchmarks.jax_gcn_bench [--epochs 200] [--rounds 30]

The model everywhere: GCN 1433 -> 16 -> 7, ReLU, dropout 0.5 on the input features and the hidden
layer, Adam (lr 0.01, weight decay 5e-4 on the first layer), float32, full-batch on Cora's 140
training nodes; sparse features and adjacency.

**The hand-written baseline (the anchor)** is what a JAX user writes for that model, with the same
work as polygrad's step wherever the two can be the same:

* the same layers and parameters (weight and bias per layer, glorot weights, zero biases), the
  symmetric-normalised adjacency with self loops computed once before training (``nn.GCN`` caches
  it too), both sparse products as a gather of rows times the values and a *sorted* segment sum
  (the polygrad-jax kernels' formulation);
* the same dropout: on the input features' stored values (sparse dropout) and on the hidden layer,
  p = 0.5, ``2x`` where kept; the keys split on device from a key carried across steps;
* the same loss (mean negative log-likelihood over the training nodes) and the same Adam
  (PyTorch's, with L2 weight decay added to the first layer's weight and bias gradients);
* the same loop: one jitted call per epoch that returns the new parameters and state, and the
  loss read on the host every epoch (``float(loss)``, like polygrad's ``.item()``: one sync each).

Two rows differ in one thing each, so each difference has its own figure:

* ``hand-written jax.jit`` (the anchor) draws its masks the way JAX users do,
  ``jax.random.bernoulli`` (a uniform float per entry: one threefry evaluation per entry);
* ``hand-written, 16-bit draws`` draws them as polygrad-jax does (16-bit draws cut from 64-bit
  threefry words, four per evaluation; kept where the draw is >= 32768).

What polygrad's step does that no row copies: it computes the output layer only for the 140
training rows (``pg.compile``'s row-gather rewrite), and draws its dropout keys on the host
(polygrad's seeded generator) and passes them in, with the optimizer's numbers, as arguments.

Timing: ``--rounds`` rounds, each running every engine for ``--per-round`` epochs (3 for jax
eager), in alternating order; per engine the best and the median ms per epoch (wall clock) and
the median process CPU time per epoch (all threads: less sensitive to other processes on a shared
machine than the wall clock); and the headline, **jax compiled / anchor per round** (the two
timed back to back in the same round, so load changes between rounds cancel): its median, and in
how many rounds it was <= 1.0.  The load average is printed before and after.  Then the test
accuracy after ``--epochs`` epochs, the mean over ``--seeds`` seeds (numpy vs jax compiled: the
done-when asks within 0.01; the jax backend draws dropout from its own keyed stream, so single
seeds differ by the seed-to-seed spread, printed too).  Needs jax and polygrad-jax installed; says
so otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any, Callable, NamedTuple

import numpy as np


class Engine(NamedTuple):
    epoch: Callable[[], float]            # one training epoch; returns the loss (read on the host)
    accuracy: Callable[[], float]         # test accuracy now
    backend: str | None                   # polygrad's backend, entered once around a run of epochs


def _cora() -> Any:
    from polygrad import data as pdata
    root = pdata.find_planetoid_dir(os.environ.get("POLYGRAD_PLANETOID_DIR"))
    if root is None:
        raise SystemExit("set POLYGRAD_PLANETOID_DIR to a directory with Cora")
    return pdata.load_planetoid(root, "cora")


def polygrad_gcn(ds: Any, backend: str, compiled: bool, seed: int = 0) -> Engine:
    """polygrad's GCN on ``backend`` (``pg.compile(pure=True)`` of the step when ``compiled``)."""
    import polygrad as pg
    from polygrad import data as pdata
    from polygrad import nn, optim

    with pg.use_backend(backend):
        pg.manual_seed(seed)
        x = nn.csr_to_tensor(pdata.row_normalize(ds.x, dtype=np.float32))
        model = nn.GCN(ds.num_features, 16, 2, ds.num_classes, dropout=0.5)
        opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                          {"params": model.conv2.parameters()}], lr=0.01)

    def step() -> Any:
        opt.zero_grad()
        loss = nn.cross_entropy(model(x, ds.edge_index), ds.y, mask=ds.train_mask)
        loss.backward()
        opt.step()
        return loss

    run = pg.compile(step, pure=True) if compiled else step

    def epoch() -> float:
        return run().item()

    def test_accuracy() -> float:
        with pg.use_backend(backend), pg.no_grad():
            model.eval()
            acc = nn.accuracy(model(x, ds.edge_index), ds.y, mask=ds.test_mask)
            model.train()
        return float(acc)

    return Engine(epoch, test_accuracy, backend)


def hand_written_jax_gcn(ds: Any, seed: int = 0, draws: str = "bernoulli") -> Engine:
    """The same GCN written directly in JAX: one ``jax.jit`` per epoch (forward, backward, Adam and
    the dropout draws on device).  ``draws``: ``"bernoulli"`` (``jax.random.bernoulli``, what JAX
    users write) or ``"16-bit"`` (polygrad-jax's ``draw_uint16``)."""
    import jax
    import jax.numpy as jnp
    import scipy.sparse as sp

    from polygrad import data as pdata

    if draws not in ("bernoulli", "16-bit"):
        raise ValueError(f"draws must be 'bernoulli' or '16-bit', got {draws!r}")
    n = ds.num_nodes
    xn = pdata.row_normalize(ds.x, dtype=np.float32)
    feats = sp.csr_matrix((xn.data, xn.indices, xn.indptr), shape=xn.shape).tocoo()
    ei = np.asarray(ds.edge_index)
    a = sp.coo_matrix((np.ones(ei.shape[1], np.float32), (ei[1], ei[0])), shape=(n, n)).tocsr()
    a = (a + sp.eye(n, dtype=np.float32)).tocsr()
    a.data[:] = 1.0
    deg = np.asarray(a.sum(axis=1)).ravel()
    d = 1.0 / np.sqrt(deg)
    a = sp.diags(d) @ a @ sp.diags(d)
    a = a.tocoo()
    x_rows, x_cols, x_vals = (jnp.asarray(v) for v in (feats.row, feats.col, feats.data.astype(np.float32)))
    a_rows, a_cols, a_vals = (jnp.asarray(v) for v in (a.row, a.col, a.data.astype(np.float32)))
    y = jnp.asarray(np.asarray(ds.y))
    train = jnp.asarray(np.asarray(ds.train_mask, dtype=bool))
    test = np.asarray(ds.test_mask, dtype=bool)

    def glorot(key: Any, shape: tuple) -> Any:
        lim = np.sqrt(6.0 / (shape[0] + shape[1]))
        return jax.random.uniform(key, shape, jnp.float32, -lim, lim)

    key = jax.random.PRNGKey(seed)
    k1, k2, key = jax.random.split(key, 3)
    params = {"w1": glorot(k1, (ds.num_features, 16)), "b1": jnp.zeros(16, jnp.float32),
              "w2": glorot(k2, (16, ds.num_classes)), "b2": jnp.zeros(ds.num_classes, jnp.float32)}
    state = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in params.items()}

    def spmm(rows: Any, cols: Any, vals: Any, h: Any) -> Any:
        return jax.ops.segment_sum(vals[:, None] * h[cols], rows, num_segments=n, indices_are_sorted=True)

    def keep(key: Any, shape: tuple) -> Any:
        if draws == "bernoulli":
            return jax.random.bernoulli(key, 0.5, shape)
        from polygrad_jax.backend import draw_uint16
        return draw_uint16(key, shape) >= 32768

    def forward(p: Any, key: Any, training: bool) -> Any:
        k1, k2 = jax.random.split(key)
        vals = x_vals
        if training:  # dropout on the sparse input features' values, then on the hidden layer
            vals = jnp.where(keep(k1, vals.shape), vals * 2.0, 0.0)
        h = spmm(x_rows, x_cols, vals, p["w1"])
        h = jax.nn.relu(spmm(a_rows, a_cols, a_vals, h) + p["b1"])
        if training:
            h = jnp.where(keep(k2, h.shape), h * 2.0, 0.0)
        return spmm(a_rows, a_cols, a_vals, h @ p["w2"]) + p["b2"]

    def loss_fn(p: Any, key: Any) -> Any:
        logp = jax.nn.log_softmax(forward(p, key, True))
        nll = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return jnp.sum(jnp.where(train, nll, 0.0)) / jnp.sum(train)

    @jax.jit
    def train_step(p: Any, s: Any, t: Any, key: Any) -> Any:
        key, sub = jax.random.split(key)
        loss, g = jax.value_and_grad(loss_fn)(p, sub)
        t = t + 1
        new_p, new_s = {}, {}
        for name in p:
            grad = g[name] + (5e-4 * p[name] if name in ("w1", "b1") else 0.0)
            m, v = s[name]
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            mhat, vhat = m / (1 - 0.9 ** t), v / (1 - 0.999 ** t)
            new_p[name] = p[name] - 0.01 * mhat / (jnp.sqrt(vhat) + 1e-8)
            new_s[name] = (m, v)
        return new_p, new_s, t, key, loss

    box = {"p": params, "s": state, "t": jnp.float32(0), "key": key}

    def epoch() -> float:
        box["p"], box["s"], box["t"], box["key"], loss = train_step(box["p"], box["s"], box["t"], box["key"])
        return float(loss)

    def test_accuracy() -> float:
        pred = np.asarray(jnp.argmax(forward(box["p"], box["key"], False), axis=1))
        return float((pred[test] == np.asarray(ds.y)[test]).mean())

    return Engine(epoch, test_accuracy, None)


def run_epochs(engine: Engine, n: int) -> None:
    """``n`` epochs, as a training loop runs them (inside one ``pg.use_backend``)."""
    import polygrad as pg
    with pg.use_backend(engine.backend) if engine.backend else contextlib.nullcontext():
        for _ in range(n):
            engine.epoch()


ANCHOR, TARGET = "hand-written jax.jit", "jax compiled"


def measure(engines: dict[str, Engine], rounds: int, per_round: int) -> dict[str, dict[str, list[float]]]:
    """Per engine, ms per epoch of each round: ``wall`` and ``cpu`` (process CPU time, all threads)."""
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in engines}
    names = list(engines)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):   # alternating order: no engine always first
            n = 3 if name == "jax eager" else per_round
            wall, cpu = time.perf_counter(), time.process_time()
            run_epochs(engines[name], n)
            times[name]["cpu"].append((time.process_time() - cpu) * 1000 / n)
            times[name]["wall"].append((time.perf_counter() - wall) * 1000 / n)
    return times


def report(times: dict[str, dict[str, list[float]]], rounds: int, per_round: int, load: tuple) -> dict[str, float]:
    anchor = times[ANCHOR]
    print(f"Cora GCN, ms per epoch: {rounds} alternating rounds of {per_round} epochs (jax eager: 3); "
          f"load average {load[0]} before, {load[1]} after (a shared machine: noisy)")
    print(f"  {'engine':28s} {'best':>8s} {'median':>8s} {'CPU':>8s}   median per-round ratio to {ANCHOR} (wall, CPU)")
    for name, t in times.items():
        ratio = statistics.median(w / a for w, a in zip(t["wall"], anchor["wall"]))
        cpu_ratio = statistics.median(c / a for c, a in zip(t["cpu"], anchor["cpu"]))
        print(f"  {name:28s} {min(t['wall']):8.2f} {statistics.median(t['wall']):8.2f} "
              f"{statistics.median(t['cpu']):8.2f}   {ratio:5.2f}x, {cpu_ratio:5.2f}x")
    target = times[TARGET]
    ratios = [w / a for w, a in zip(target["wall"], anchor["wall"])]
    cpu = [c / a for c, a in zip(target["cpu"], anchor["cpu"])]
    summary = {"wall": statistics.median(ratios), "cpu": statistics.median(cpu),
               "best": min(target["wall"]) / min(anchor["wall"]), "rounds_at_most_1": sum(r <= 1.0 for r in ratios)}
    print(f"{TARGET} / {ANCHOR}: median per-round ratio {summary['wall']:.2f}x wall, {summary['cpu']:.2f}x CPU; "
          f"best / best {summary['best']:.2f}x; <= 1.0x in {summary['rounds_at_most_1']} of {rounds} rounds "
          f"(target <= 1.0x)")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200, help="training epochs before the accuracy")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=10, help="epochs per engine per round")
    parser.add_argument("--seeds", type=int, default=5, help="seeds the test accuracy is averaged over")
    args = parser.parse_args(argv)
    try:
        import jax  # noqa: F401

        from polygrad.runtime.registry import resolve
        resolve("jax")                  # raises when polygrad-jax is not installed
    except Exception as exc:  # noqa: BLE001 - report and stop
        print(f"skipped: jax or polygrad-jax not available ({exc})")
        return 0
    ds = _cora()
    engines = {"numpy": polygrad_gcn(ds, "numpy", False), "numpy compiled": polygrad_gcn(ds, "numpy", True),
               "jax eager": polygrad_gcn(ds, "jax", False), TARGET: polygrad_gcn(ds, "jax", True),
               ANCHOR: hand_written_jax_gcn(ds), "hand-written, 16-bit draws": hand_written_jax_gcn(ds, draws="16-bit")}
    for engine in engines.values():   # warm-up: captures, XLA compilation
        run_epochs(engine, 4)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    times = measure(engines, args.rounds, args.per_round)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    summary = report(times, args.rounds, args.per_round, (round(load_before, 2), round(load_after, 2)))
    accuracy: dict[str, list[float]] = {"numpy": [], TARGET: [], ANCHOR: []}
    for seed in range(args.seeds):
        for name in accuracy:
            engine = (hand_written_jax_gcn(ds, seed) if name == ANCHOR
                      else polygrad_gcn(ds, "numpy" if name == "numpy" else "jax", name != "numpy", seed))
            run_epochs(engine, args.epochs)
            accuracy[name].append(engine.accuracy())
    mean = {name: float(np.mean(runs)) for name, runs in accuracy.items()}
    print(f"test accuracy after {args.epochs} epochs, mean of {args.seeds} seeds (min-max): " + ", ".join(
        f"{k} {mean[k]:.4f} ({min(v):.3f}-{max(v):.3f})" for k, v in accuracy.items()))
    print(f"|numpy - jax compiled| = {abs(mean['numpy'] - mean[TARGET]):.4f} (target <= 0.01); "
          f"{TARGET} / {ANCHOR} = {summary['wall']:.2f}x (target <= 1.0x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
