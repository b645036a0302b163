"""The demos behind ``polygrad demo moons`` and ``polygrad demo gcn`` (also usable from Python).

* :func:`run_moons` -- micrograd's demo: a 2 -> 16 -> 16 -> 1 ReLU MLP on 100 two-moons samples,
  max-margin loss + 1e-4 L2, SGD with the learning rate decaying 1.0 -> 0.1, 100 steps.
* :func:`run_gcn` -- Kipf & Welling's GCN (hidden 16, dropout 0.5, Adam lr 0.01, weight decay
  5e-4 on the first layer, 200 epochs, row-normalised features) on Cora / CiteSeer / PubMed
  from a Planetoid folder, or on the embedded synthetic graph (a stochastic block model) when
  no folder is given, so it runs on a fresh machine.

Both return a flat dict of results (what ``--json`` prints).  Progress goes to stderr through
tqdm when it is installed (the ``viz`` extra) and as plain text lines otherwise; plots need
matplotlib (also ``viz``) and are checked for before training starts.
"""
from __future__ import annotations

import os
import statistics
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

import numpy as np

import polygrad as pg
from polygrad import data as pdata
from polygrad import nn, optim
from polygrad.tensor.draw import save_graph
from polygrad.ir.errors import PolygradError
from polygrad.apps.train import EpochRecord, History, fit

__all__ = ["run_moons", "run_gcn", "MissingExtraError", "require_matplotlib", "peak_rss_mb", "Progress"]

VIZ_HINT = "pip install 'polygrad-core[viz]'"


class MissingExtraError(PolygradError, ImportError):
    """An optional dependency (an extra such as ``viz``) is needed for what was asked."""


def require_matplotlib() -> Any:
    """The matplotlib module, or MissingExtraError saying how to install it."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - missing or broken install: same advice
        raise MissingExtraError(f"--plot needs matplotlib, which is not installed ({type(exc).__name__}: "
                                f"{exc}); install the viz extra: {VIZ_HINT}") from None
    return matplotlib


# ----------------------------------------------------------------------------------------------
# progress and memory
# ----------------------------------------------------------------------------------------------

def rss_mb() -> float:
    """Current resident set size of this process in MiB (psutil)."""
    import psutil
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (getrusage; psutil where absent)."""
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux
    except (ImportError, OSError):
        return rss_mb()


class Progress:
    """A progress bar: tqdm when available, plain text lines (about ten per run) otherwise.

    Never fails because tqdm is missing or broken: the plain fallback always works.
    """

    def __init__(self, total: int, desc: str, enabled: bool = True, stream: TextIO | None = None,
                 force_plain: bool = False):
        self.total, self.desc, self.enabled = total, desc, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.bar = None
        if enabled and not force_plain:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, file=self.stream, dynamic_ncols=True, leave=True)
            except Exception:  # noqa: BLE001 - no tqdm (or a broken one): plain text
                self.bar = None
        self.every = max(1, total // 10)

    def update(self, **postfix: Any) -> None:
        self.count += 1
        if not self.enabled:
            return
        text = {k: (f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in postfix.items()}
        if self.bar is not None:
            self.bar.set_postfix(text, refresh=False)
            self.bar.update(1)
        elif self.count % self.every == 0 or self.count == self.total or self.count == 1:
            fields = " ".join(f"{k}={v}" for k, v in text.items())
            print(f"{self.desc} {self.count}/{self.total} {fields}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _median_ms(history: History, skip_first: bool = True) -> float:
    secs = [r.seconds for r in history.records if not r.rolled_back]
    if skip_first and len(secs) > 1:
        secs = secs[1:]  # the first epoch pays one-off costs (caches, normalisation)
    return statistics.median(secs) * 1e3 if secs else float("nan")


# ----------------------------------------------------------------------------------------------
# moons
# ----------------------------------------------------------------------------------------------

@contextmanager
def monitored(enabled: bool, stream: TextIO | None = None) -> Iterator[Any]:
    """``pg.monitor()`` around a training run when ``enabled`` (its summary printed at the end)."""
    if not enabled:
        yield None
        return
    import logging
    logging.basicConfig(level=logging.WARNING)  # the monitor warns (NaN grads, memory) via logging
    with pg.monitor() as m:
        yield m
    print(m.summary(), file=stream or sys.stderr, flush=True)


def report_epoch(m: Any, rec: EpochRecord, stream: TextIO | None = None) -> None:
    """Close the monitor's step for this epoch and print its one-line report."""
    if m is not None:
        print(f"epoch {rec.epoch + 1}: {m.step(epoch=rec.epoch, loss=rec.loss)}", file=stream or sys.stderr,
              flush=True)


def drawing_first_graph(loss_fn: Callable[[], Any], path: str | None) -> Callable[[], Any]:
    """``loss_fn`` that writes its first loss's autodiff graph to ``path`` (before backward frees it)."""
    if not path:
        return loss_fn
    drawn: list[Any] = []

    def wrapped():
        loss, metrics = loss_fn()
        if not drawn:
            drawn.append(save_graph(loss, path))
        return loss, metrics
    return wrapped


def run_moons(steps: int = 100, n_samples: int = 100, noise: float = 0.1, seed: int = 1337,
              backend: str | None = None, plot: str | None = None, progress: bool = True,
              rollback: float | None = None, stream: TextIO | None = None, monitor: bool = False,
              graph: str | None = None, compile: bool = True) -> dict[str, Any]:
    """Train micrograd's moons MLP; return accuracy, loss, timing and memory figures.

    The L2 term ``1e-4 * sum(p**2)`` is applied as SGD weight decay 2e-4 (its exact gradient),
    which keeps the training graph small; the reported loss includes it.  ``rollback`` enables
    :func:`polygrad.apps.train.fit`'s rollback with that threshold (off by default: micrograd's
    recipe has loss spikes at lr 1.0 that it recovers from by itself).  ``compile``: train with
    ``pg.compile(pure=True)``'d steps: the step's Python only issues ops (the model and the loss;
    the accuracy is computed outside it), so the pure replay gives eager's numbers -- which
    ``tests/unit/test_compile_modes.py`` checks bit for bit.
    """
    if plot:
        require_matplotlib()
    if steps < 1:
        raise ValueError(f"moons demo: steps must be >= 1, got {steps}")
    backend = backend or pg.get_backend()
    with pg.use_backend(backend):
        pg.manual_seed(seed)
        X_np, y01 = pdata.make_moons(n_samples, noise, seed=seed)
        y_pm = (y01 * 2 - 1).astype(np.float64)
        X = pg.tensor(X_np, dtype=pg.float64)
        model = nn.MLP(2, [16, 16, 1], init="micrograd", dtype=pg.float64)
        opt = optim.SGD(model.parameters(), lr=1.0, weight_decay=2e-4,
                        lr_schedule=lambda k: 1.0 - 0.9 * k / steps)
        bar = Progress(steps, "moons", enabled=progress, stream=stream)

        def loss_fn():
            scores = model(X)
            loss = nn.max_margin(scores, y_pm)
            return loss, {"scores": scores}

        def on_epoch(rec: EpochRecord) -> None:
            scores = rec.metrics.pop("scores")
            reg = 1e-4 * sum(float((p.numpy().astype(np.float64) ** 2).sum()) for p in model.parameters())
            rec.loss = rec.loss + reg
            rec.metrics["accuracy"] = nn.accuracy(scores, y_pm)
            bar.update(loss=rec.loss, acc=rec.metrics["accuracy"], mem_mb=round(rss_mb(), 1))
            report_epoch(m, rec, stream)

        with monitored(monitor, stream) as m:
            try:
                history = fit(model, opt, drawing_first_graph(loss_fn, graph), steps,
                              rollback_threshold=rollback, callback=on_epoch, compile="pure" if compile else False)
            finally:
                bar.close()
        model.eval()
        with pg.no_grad():
            scores = model(X)
        accuracy = nn.accuracy(scores, y_pm)
        loss = float(nn.max_margin(scores, y_pm).item()) + 1e-4 * sum(
            float((p.numpy().astype(np.float64) ** 2).sum()) for p in model.parameters())
        result = {"demo": "moons", "accuracy": accuracy, "test_accuracy": accuracy, "loss": loss,
                  "steps": steps, "epochs": steps, "step_time_ms": _median_ms(history),
                  "epoch_time_ms": _median_ms(history), "rollbacks": history.rollbacks,
                  "peak_rss_mb": peak_rss_mb(), "backend": backend,
                  "compiled": history.replays > 0,  # what happened: a backend may opt out of replay
                  "compile_mode": history.compile_mode}
        if plot:
            plot_moons(model, X_np, y01, plot, accuracy)
            result["plot"] = os.fspath(plot)
    return result


def plot_moons(model: nn.Module, X: np.ndarray, y01: np.ndarray, path: str, accuracy: float) -> None:
    """Decision boundary of ``model`` over the moons data, saved as an image at ``path``."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pad = 0.5
    xs = np.linspace(X[:, 0].min() - pad, X[:, 0].max() + pad, 200)
    ys = np.linspace(X[:, 1].min() - pad, X[:, 1].max() + pad, 200)
    gx, gy = np.meshgrid(xs, ys)
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    with pg.no_grad():
        z = model(pg.tensor(grid, dtype=model.parameters()[0].dtype)).numpy().reshape(gx.shape)
    fig = Figure(figsize=(6, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.contourf(gx, gy, z > 0, levels=[-0.5, 0.5, 1.5], colors=["#f4c7a1", "#a9c9ee"], alpha=0.8)
    ax.contour(gx, gy, z, levels=[0.0], colors="k", linewidths=1.0)
    ax.scatter(X[:, 0], X[:, 1], c=np.where(y01 > 0, "#1f5fbf", "#d9661f"), s=22, edgecolors="k",
               linewidths=0.5)
    ax.set_title(f"polygrad: moons MLP decision boundary (accuracy {accuracy:.0%})")
    ax.set_xlabel("x1")
    ax.set_ylabel("x2")
    fig.tight_layout()
    fig.savefig(os.fspath(path))


# ----------------------------------------------------------------------------------------------
# GCN
# ----------------------------------------------------------------------------------------------

def load_graph(data: str | None = None, dataset: str = "cora", download: bool = False) -> pdata.GraphDataset:
    """A Planetoid dataset from ``data`` (a folder) or, with ``download``, from polygrad's cache
    (fetched on first use); otherwise the embedded synthetic graph."""
    if data is not None:
        return pdata.load_planetoid(data, dataset)
    if download:
        return pdata.load_planetoid(None, dataset, download=True)
    return pdata.stochastic_block_model(seed=0)


def graph_tensors(ds: pdata.GraphDataset, backend: str | None = None) -> tuple[Any, np.ndarray, np.ndarray]:
    """(row-normalised sparse features, labels, edge_index) for a GCN on ``ds``."""
    x = nn.csr_to_tensor(pdata.row_normalize(ds.x, dtype=np.float32), backend=backend)
    return x, ds.y, ds.edge_index


def build_gcn(ds: pdata.GraphDataset, hidden: int = 16, dropout: float = 0.5, lr: float = 0.01,
              weight_decay: float = 5e-4) -> tuple[nn.GCN, optim.Adam]:
    """Kipf & Welling's model and optimizer (weight decay on the first layer only)."""
    model = nn.GCN(ds.num_features, hidden, 2, ds.num_classes, dropout=dropout)
    opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": weight_decay},
                      {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=lr)
    return model, opt


def train_gcn(ds: pdata.GraphDataset, seed: int = 0, epochs: int = 200, hidden: int = 16,
              dropout: float = 0.5, lr: float = 0.01, weight_decay: float = 5e-4,
              tensors: tuple | None = None, track_val: bool = False,
              on_epoch: Callable[[EpochRecord], Any] | None = None, graph: str | None = None,
              compile: bool = True) -> dict[str, Any]:
    """One seeded GCN run on ``ds``; returns test/val accuracy, history and per-epoch curves."""
    pg.manual_seed(seed)
    x, y, edge_index = tensors if tensors is not None else graph_tensors(ds)
    model, opt = build_gcn(ds, hidden, dropout, lr, weight_decay)
    curves: dict[str, list[float]] = {"loss": [], "train_acc": [], "val_acc": []}

    train_rows = np.flatnonzero(ds.train_mask)  # what cross_entropy(mask=train_mask) gathers
    train_y = y[train_rows]

    def loss_fn():
        # the training rows, gathered once: the loss and the accuracy read only them, so a pure
        # replay computes just those rows of the last layer (compile/rewrite.py's row gather) and
        # the first layer over their 2-hop neighbourhood only (compile/two_hop.py), which a step
        # returning every node's logits would forbid; the same ops as
        # cross_entropy(logits, y, mask=train_mask), so the same bits
        logits = model(x, edge_index)[train_rows]
        loss = nn.cross_entropy(logits, train_y)
        return loss, {"train_logits": logits}  # a tensor: a compiled step replays it (a float it could not)

    def callback(rec: EpochRecord) -> Any:
        rec.metrics["train_acc"] = nn.accuracy(rec.metrics.pop("train_logits"), train_y)
        curves["loss"].append(rec.loss)
        curves["train_acc"].append(rec.metrics["train_acc"])
        if track_val:
            model.eval()
            with pg.no_grad():
                logits = model(x, edge_index)
            model.train()
            rec.metrics["val_acc"] = nn.accuracy(logits, y, ds.val_mask)
            curves["val_acc"].append(rec.metrics["val_acc"])
        return on_epoch(rec) if on_epoch is not None else None

    # pure: loss_fn only issues ops (metrics stay tensors); tests/unit/test_compile_modes.py checks
    # that the replayed epochs give eager's numbers bit for bit
    history = fit(model, opt, drawing_first_graph(loss_fn, graph), epochs, rollback_threshold=None,
                  callback=callback, compile="pure" if compile else False)
    model.eval()
    with pg.no_grad():
        logits = model(x, edge_index)
    return {"test_accuracy": nn.accuracy(logits, y, ds.test_mask),
            "val_accuracy": nn.accuracy(logits, y, ds.val_mask),
            "train_accuracy": nn.accuracy(logits, y, ds.train_mask),
            "epoch_time_ms": _median_ms(history), "history": history, "curves": curves}


def run_gcn(data: str | None = None, dataset: str = "cora", backend: str | None = None, epochs: int = 200,
            seed: int = 0, runs: int = 1, hidden: int = 16, dropout: float = 0.5, lr: float = 0.01,
            weight_decay: float = 5e-4, plot: str | None = None, progress: bool = True,
            stream: TextIO | None = None, download: bool = False, monitor: bool = False,
            graph: str | None = None, compile: bool = True) -> dict[str, Any]:
    """Train the reference GCN ``runs`` times (seeds ``seed, seed+1, ...``); return mean figures.

    ``data``: a folder with the Planetoid files; ``download=True`` without it fetches ``dataset``
    into polygrad's cache; neither: the embedded synthetic graph.
    """
    if plot:
        require_matplotlib()
    if epochs < 1 or runs < 1:
        raise ValueError(f"gcn demo: epochs and runs must be >= 1, got {epochs} and {runs}")
    backend = backend or pg.get_backend()
    ds = load_graph(data, dataset, download)
    name = "sbm (synthetic)" if ds.name == "sbm" else ds.name
    with pg.use_backend(backend):
        tensors = graph_tensors(ds)
        accs, vals, times, last = [], [], [], None
        replayed = compile  # whether every run's steps were replayed (a backend may opt out)
        for r in range(runs):
            desc = f"gcn {ds.name}" + (f" seed {seed + r}" if runs > 1 else "")
            bar = Progress(epochs, desc, enabled=progress, stream=stream)

            with monitored(monitor, stream) as m:
                def on_epoch(rec: EpochRecord, bar: Progress = bar, m: Any = m) -> None:
                    bar.update(loss=rec.loss, acc=rec.metrics["train_acc"], mem_mb=round(rss_mb(), 1))
                    report_epoch(m, rec, stream)

                try:
                    last = train_gcn(ds, seed + r, epochs, hidden, dropout, lr, weight_decay, tensors,
                                     track_val=bool(plot) and r == runs - 1, on_epoch=on_epoch,
                                     graph=graph if r == 0 else None, compile=compile)
                finally:
                    bar.close()
            accs.append(last["test_accuracy"])
            vals.append(last["val_accuracy"])
            times.append(last["epoch_time_ms"])
            replayed = replayed and last["history"].replays > 0
    result = {"demo": "gcn", "dataset": name, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
              "test_accuracy": float(np.mean(accs)), "test_accuracy_std": float(np.std(accs)),
              "val_accuracy": float(np.mean(vals)), "runs": runs, "seeds": [seed + r for r in range(runs)],
              "test_accuracies": accs, "epochs": epochs, "epoch_time_ms": float(np.median(times)),
              "peak_rss_mb": peak_rss_mb(), "backend": backend, "compiled": replayed,
              "compile_mode": "pure" if compile else "eager"}
    if plot and last is not None:
        plot_gcn_curves(last["curves"], plot, f"{name}: GCN, seed {seed + runs - 1}")
        result["plot"] = os.fspath(plot)
    return result


def plot_gcn_curves(curves: dict[str, list[float]], path: str, title: str) -> None:
    """Training loss and train/validation accuracy per epoch, saved as an image at ``path``."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax1 = fig.add_subplot(1, 2, 1)
    ax1.plot(curves["loss"], color="#1f5fbf")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss (cross-entropy)")
    ax1.set_title("loss")
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.plot(curves["train_acc"], label="train", color="#d9661f")
    if curves.get("val_acc"):
        ax2.plot(curves["val_acc"], label="validation", color="#2b8a3e")
    ax2.set_ylim(0, 1.02)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy")
    ax2.set_title("accuracy")
    ax2.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
