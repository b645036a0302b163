"""The demos behind ``polygrad demo gat``, ``polygrad demo sage [--sampled]`` and ``polygrad demo gin``.

* :func:`run_gat` -- Veličković et al.'s GAT with PyG's ``examples/gat.py`` recipe (8 heads x 8
  hidden, ELU, dropout 0.6 on inputs and attention, Adam lr 0.005, weight decay 5e-4, 200 epochs).
* :func:`run_sage` -- a two-layer GraphSAGE (mean aggregation, hidden 16, dropout 0.5, Adam lr
  0.01, weight decay 5e-4, 200 epochs); ``sampled=True`` trains on mini-batches from the
  neighbour sampler (fan-outs 25, 10; 256 seeds per batch) instead of the full graph.
* :func:`run_gin` -- GIN graph classification on a generated dataset (Erdős–Rényi against small
  worlds, :func:`polygrad.data.random_graph_families`): batching and pooling; chance is 50%.

Same flags and ``--json`` fields as the GCN demo (:mod:`polygrad.apps.demos`): Cora / CiteSeer from a
Planetoid folder or the embedded synthetic graph; ``runs`` seeds averaged.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, TextIO

import numpy as np

import polygrad as pg
from polygrad import data as pdata
from polygrad import nn, optim
from polygrad.apps.demos import (Progress, _median_ms, drawing_first_graph, graph_tensors, load_graph, monitored,
                            peak_rss_mb, plot_gcn_curves, report_epoch, require_matplotlib, rss_mb)
from polygrad.apps.train import EpochRecord, fit

__all__ = ["run_gat", "run_sage", "run_gin", "run_link", "train_node_model", "train_sampled_sage", "build_gat",
           "train_link", "LinkGCN"]


def build_gat(ds: pdata.GraphDataset, hidden: int = 8, heads: int = 8, dropout: float = 0.6, lr: float = 0.005,
              weight_decay: float = 5e-4) -> tuple[nn.GAT, optim.Adam]:
    """PyG's examples/gat.py model and optimizer."""
    model = nn.GAT(ds.num_features, hidden * heads, 2, ds.num_classes, dropout=dropout, heads=heads)
    return model, optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


def build_sage(ds: pdata.GraphDataset, hidden: int = 16, dropout: float = 0.5, lr: float = 0.01,
               weight_decay: float = 5e-4, aggr: str = "mean") -> tuple[nn.GraphSAGE, optim.Adam]:
    model = nn.GraphSAGE(ds.num_features, hidden, 2, ds.num_classes, dropout=dropout, aggr=aggr)
    return model, optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


def _evaluate(model: nn.Module, x: Any, ds: pdata.GraphDataset) -> dict[str, float]:
    model.eval()
    with pg.no_grad():
        logits = model(x, ds.edge_index)
    model.train()
    return {"test_accuracy": nn.accuracy(logits, ds.y, ds.test_mask),
            "val_accuracy": nn.accuracy(logits, ds.y, ds.val_mask),
            "train_accuracy": nn.accuracy(logits, ds.y, ds.train_mask)}


def train_node_model(build: Callable[[], tuple[nn.Module, Any]], ds: pdata.GraphDataset, x: Any, seed: int,
                     epochs: int, track_val: bool = False, on_epoch: Callable[[EpochRecord], Any] | None = None,
                     graph: str | None = None, compile: bool | str = "default") -> dict[str, Any]:
    """One seeded full-batch run of a node classifier; returns accuracies, epoch time and curves.
    ``compile``: :func:`polygrad.apps.train.fit`'s (the default ``pg.compile`` mode, see below)."""
    pg.manual_seed(seed)
    model, opt = build()
    curves: dict[str, list[float]] = {"loss": [], "train_acc": [], "val_acc": []}

    def loss_fn():
        logits = model(x, ds.edge_index)
        loss = nn.cross_entropy(logits, ds.y, mask=ds.train_mask)
        return loss, {"train_acc": nn.accuracy(logits, ds.y, ds.train_mask)}

    def callback(rec: EpochRecord) -> Any:
        curves["loss"].append(rec.loss)
        curves["train_acc"].append(rec.metrics["train_acc"])
        if track_val:
            rec.metrics["val_acc"] = _evaluate(model, x, ds)["val_accuracy"]
            curves["val_acc"].append(rec.metrics["val_acc"])
        return on_epoch(rec) if on_epoch is not None else None

    # the default pg.compile mode: loss_fn reads its accuracy on the host (a float), which pure mode
    # would refuse; the default mode runs it every epoch and gives eager's numbers by construction
    history = fit(model, opt, drawing_first_graph(loss_fn, graph), epochs, rollback_threshold=None, callback=callback,
                  compile=compile)
    return {**_evaluate(model, x, ds), "epoch_time_ms": _median_ms(history), "curves": curves,
            "compile_mode": history.compile_mode}


def train_sampled_sage(ds: pdata.GraphDataset, x: Any, seed: int, epochs: int, fanouts: tuple[int, ...] = (25, 10),
                       batch_size: int = 256, hidden: int = 16, on_epoch: Callable[[EpochRecord], Any] | None = None,
                       evaluate: bool = True) -> dict[str, Any]:
    """GraphSAGE trained on neighbour-sampled mini-batches of the training nodes (one optimizer
    step per batch); the loss of an epoch is the mean over its batches.  ``x``: numpy features
    (dense or CSRMatrix rows are gathered per batch)."""
    pg.manual_seed(seed)
    model, opt = build_sage(ds, hidden=hidden)
    sampler = pdata.NeighborSampler(ds.edge_index, ds.num_nodes, fanouts, batch_size=batch_size,
                                    input_nodes=ds.train_mask, seed=seed)
    curves: dict[str, list[float]] = {"loss": [], "train_acc": [], "val_acc": []}
    times = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        losses, correct, seen = [], 0, 0
        model.train()
        for sub in sampler:
            xb = _rows(x, sub.n_id)
            logits = model(xb, sub.edge_index)
            seeds = np.arange(sub.batch_size)
            yb = ds.y[sub.n_id[:sub.batch_size]]
            loss = nn.cross_entropy(logits[seeds], yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
            correct += int((logits.numpy()[:sub.batch_size].argmax(1) == yb).sum())
            seen += sub.batch_size
        times.append(time.perf_counter() - t0)
        rec = EpochRecord(epoch=epoch, epochs=epochs, loss=float(np.mean(losses)), lr=opt.current_lr(),
                          rolled_back=False, seconds=times[-1],
                          metrics={"train_acc": correct / max(seen, 1)})
        curves["loss"].append(rec.loss)
        curves["train_acc"].append(rec.metrics["train_acc"])
        if on_epoch is not None:
            on_epoch(rec)
    result: dict[str, Any] = {"epoch_time_ms": float(np.median(times[1:] or times) * 1e3), "curves": curves,
                              "batches_per_epoch": len(sampler), "fanouts": list(fanouts), "batch_size": batch_size}
    if evaluate:  # full-neighbourhood inference over the whole graph
        full = x if not isinstance(x, (np.ndarray, pdata.CSRMatrix)) else _rows(x, np.arange(ds.num_nodes))
        result.update(_evaluate(model, full, ds))
    return result


def _rows(x: Any, ids: np.ndarray) -> Any:
    """Feature rows ``ids`` of a CSRMatrix / numpy array as a polygrad tensor (sparse CSR for a CSRMatrix)."""
    if isinstance(x, pdata.CSRMatrix):
        starts, ends = x.indptr[ids], x.indptr[ids + 1]
        lengths = ends - starts
        indptr = np.zeros(ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        take = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        return pg.sparse_csr(indptr, x.indices[take], x.data[take], (ids.shape[0], x.shape[1]))
    return pg.tensor(np.asarray(x)[ids])


def _node_demo(kind: str, data: str | None, dataset: str, backend: str | None, epochs: int, seed: int, runs: int,
               plot: str | None, progress: bool, stream: TextIO | None, download: bool, monitor: bool,
               graph: str | None, sampled: bool = False) -> dict[str, Any]:
    if plot:
        require_matplotlib()
    if epochs < 1 or runs < 1:
        raise ValueError(f"{kind} demo: epochs and runs must be >= 1, got {epochs} and {runs}")
    if sampled and (monitor or graph):
        raise ValueError(f"{kind} demo: --monitor and --graph follow full-batch training; drop them with --sampled")
    backend = backend or pg.get_backend()
    ds = load_graph(data, dataset, download)
    name = "sbm (synthetic)" if ds.name == "sbm" else ds.name
    with pg.use_backend(backend):
        x = graph_tensors(ds)[0]
        if sampled:
            x = pdata.row_normalize(ds.x, dtype=np.float32)
        accs, vals, times, last = [], [], [], None
        for r in range(runs):
            bar = Progress(epochs, f"{kind} {ds.name}" + (f" seed {seed + r}" if runs > 1 else ""),
                           enabled=progress, stream=stream)
            with monitored(monitor, stream) as m:
                def on_epoch(rec: EpochRecord, bar: Progress = bar, m: Any = m) -> None:
                    bar.update(loss=rec.loss, acc=rec.metrics["train_acc"], mem_mb=round(rss_mb(), 1))
                    report_epoch(m, rec, stream)
                try:
                    if sampled:
                        last = train_sampled_sage(ds, x, seed + r, epochs, on_epoch=on_epoch)
                    else:
                        build = (lambda: build_gat(ds)) if kind == "gat" else (lambda: build_sage(ds))
                        last = train_node_model(build, ds, x, seed + r, epochs, track_val=bool(plot) and r == runs - 1,
                                                on_epoch=on_epoch, graph=graph if r == 0 else None)
                finally:
                    bar.close()
            accs.append(last["test_accuracy"])
            vals.append(last["val_accuracy"])
            times.append(last["epoch_time_ms"])
    result = {"demo": kind, "dataset": name, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
              "test_accuracy": float(np.mean(accs)), "test_accuracy_std": float(np.std(accs)),
              "val_accuracy": float(np.mean(vals)), "runs": runs, "seeds": [seed + r for r in range(runs)],
              "test_accuracies": accs, "epochs": epochs, "epoch_time_ms": float(np.median(times)),
              "peak_rss_mb": peak_rss_mb(), "backend": backend,
              "compile_mode": "eager" if sampled or last is None else last["compile_mode"]}
    if sampled and last is not None:
        result.update(sampled=True, fanouts=last["fanouts"], batch_size=last["batch_size"],
                      batches_per_epoch=last["batches_per_epoch"])
    if plot and last is not None:
        label = {"gat": "GAT", "sage": "GraphSAGE" + (" (sampled)" if sampled else "")}[kind]
        plot_gcn_curves(last["curves"], plot, f"{name}: {label}, seed {seed + runs - 1}")
        result["plot"] = os.fspath(plot)
    return result


def run_gat(data: str | None = None, dataset: str = "cora", backend: str | None = None, epochs: int = 200,
            seed: int = 0, runs: int = 1, plot: str | None = None, progress: bool = True,
            stream: TextIO | None = None, download: bool = False, monitor: bool = False,
            graph: str | None = None) -> dict[str, Any]:
    """Train PyG's GAT recipe ``runs`` times (seeds ``seed, seed+1, ...``); mean figures."""
    return _node_demo("gat", data, dataset, backend, epochs, seed, runs, plot, progress, stream, download,
                      monitor, graph)


def run_sage(data: str | None = None, dataset: str = "cora", backend: str | None = None, epochs: int = 200,
             seed: int = 0, runs: int = 1, plot: str | None = None, progress: bool = True,
             stream: TextIO | None = None, download: bool = False, monitor: bool = False,
             graph: str | None = None, sampled: bool = False) -> dict[str, Any]:
    """Train GraphSAGE (mean) ``runs`` times, full-batch or (``sampled``) on neighbour-sampled mini-batches."""
    return _node_demo("sage", data, dataset, backend, epochs, seed, runs, plot, progress, stream, download,
                      monitor, graph, sampled=sampled)


def run_gin(backend: str | None = None, epochs: int = 50, seed: int = 0, runs: int = 1, num_graphs: int = 400,
            batch_size: int = 32, plot: str | None = None, progress: bool = True, stream: TextIO | None = None,
            monitor: bool = False, graph: str | None = None, data: str | None = None) -> dict[str, Any]:
    """GIN (3 layers, hidden 32, learnable eps, sum pooling) telling Erdős–Rényi graphs from small
    worlds: 75% of ``num_graphs`` to train, 25% to test; Adam lr 0.005, gradient norm clipped at 1;
    chance is 50%.  ``data``: a TUDataset folder (MUTAG, PROTEINS, ...) to classify instead,
    shuffled by ``seed`` and split 75/25 the same way."""
    if plot:
        require_matplotlib()
    if epochs < 1 or runs < 1:
        raise ValueError(f"gin demo: epochs and runs must be >= 1, got {epochs} and {runs}")
    backend = backend or pg.get_backend()
    graphs: list[Any] = (pdata.random_graph_families(num_graphs, seed=seed) if data is None
                         else _tu_graphs(data, seed))
    in_channels, num_classes, chance, dataset = _gin_task(graphs, data)
    cut = int(0.75 * len(graphs))
    train, test = graphs[:cut], graphs[cut:]
    test_batch = pdata.collate(test)
    accs, times, last_curves = [], [], None
    with pg.use_backend(backend):
        for r in range(runs):
            pg.manual_seed(seed + r)
            model = nn.GIN(in_channels, 32, 3, num_classes)
            opt = optim.Adam(model.parameters(), lr=0.005)
            curves: dict[str, list[float]] = {"loss": [], "train_acc": [], "val_acc": []}
            bar = Progress(epochs, "gin" + (f" seed {seed + r}" if runs > 1 else ""), enabled=progress, stream=stream)
            epoch_times = []
            with monitored(monitor, stream) as m:
                try:
                    for epoch in range(epochs):
                        t0 = time.perf_counter()
                        losses, correct = [], 0
                        for k, b in enumerate(pdata.iterate_batches(train, batch_size, shuffle=True,
                                                                    seed=(seed + r) * 100_003 + epoch)):
                            logits = model(pg.tensor(b.x), b.edge_index, b.batch, b.num_graphs)
                            loss = nn.cross_entropy(logits, b.y)
                            if graph and r == 0 and epoch == 0 and k == 0:
                                from polygrad.tensor.draw import save_graph
                                save_graph(loss, graph)
                            opt.zero_grad()
                            loss.backward()
                            nn.clip_grad_norm_(model.parameters(), 1.0)  # sum aggregation + sum pooling
                            opt.step()                                   # make rare large steps: clip them
                            losses.append(float(loss.item()))
                            correct += int((logits.numpy().argmax(1) == b.y).sum())
                        epoch_times.append(time.perf_counter() - t0)
                        rec = EpochRecord(epoch=epoch, epochs=epochs, loss=float(np.mean(losses)), lr=opt.current_lr(),
                                          rolled_back=False, seconds=epoch_times[-1],
                                          metrics={"train_acc": correct / len(train)})
                        curves["loss"].append(rec.loss)
                        curves["train_acc"].append(rec.metrics["train_acc"])
                        bar.update(loss=rec.loss, acc=rec.metrics["train_acc"], mem_mb=round(rss_mb(), 1))
                        report_epoch(m, rec, stream)
                finally:
                    bar.close()
            model.eval()
            with pg.no_grad():
                logits = model(pg.tensor(test_batch.x), test_batch.edge_index, test_batch.batch, test_batch.num_graphs)
            accs.append(nn.accuracy(logits, test_batch.y))
            times.append(float(np.median(epoch_times[1:] or epoch_times) * 1e3))
            last_curves = curves
    result = {"demo": "gin", "dataset": dataset,
              "num_graphs": len(graphs), "num_train_graphs": len(train), "num_test_graphs": len(test),
              "chance_accuracy": chance, "test_accuracy": float(np.mean(accs)),
              "test_accuracy_std": float(np.std(accs)),
              "runs": runs, "seeds": [seed + r for r in range(runs)], "test_accuracies": accs, "epochs": epochs,
              "epoch_time_ms": float(np.median(times)), "peak_rss_mb": peak_rss_mb(), "backend": backend}
    if plot and last_curves is not None:
        plot_gcn_curves(last_curves, plot, f"GIN on {dataset}, seed {seed + runs - 1}")
        result["plot"] = os.fspath(plot)
    return result


def _tu_graphs(folder: str, seed: int) -> list[pdata.Data]:
    """A TUDataset folder's graphs in an order shuffled by ``seed`` (PyG's ``dataset.shuffle()``)."""
    graphs = pdata.load_tudataset(folder)
    order = np.random.default_rng(seed).permutation(len(graphs))
    return [graphs[i] for i in order]


def _gin_task(graphs: list[Any], data: str | None) -> tuple[int, int, float, str]:
    """(feature width, classes, majority-class accuracy, description) of a graph list."""
    if data is None:
        return 1, 2, 0.5, "graph families (Erdős–Rényi vs small world, generated)"
    if len(graphs) < 4:
        raise ValueError(f"gin demo: {data} holds {len(graphs)} graphs; at least 4 are needed to train and test")
    labels = np.concatenate([np.asarray(g.y).reshape(-1) for g in graphs])
    if labels.dtype.kind not in "iu":
        raise ValueError(f"gin demo: {data} holds graph attributes (regression), not class labels")
    counts = np.bincount(labels)
    return int(graphs[0].x.shape[1]), int(counts.shape[0]), float(counts.max() / counts.sum()), \
        f"TUDataset {os.path.basename(os.path.normpath(data))}"


# -- link prediction (PyG's examples/link_pred.py) ------------------------------------------------

class LinkGCN(nn.Module):
    """PyG's link_pred.py ``Net``: a two-layer GCN encoder and a dot-product decoder."""

    def __init__(self, in_channels: int, hidden_channels: int = 128, out_channels: int = 64):
        self.conv1 = nn.GCNConv(in_channels, hidden_channels)
        self.conv2 = nn.GCNConv(hidden_channels, out_channels)

    def encode(self, x: Any, edge_index: np.ndarray) -> Any:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    @staticmethod
    def decode(z: Any, edge_label_index: np.ndarray) -> Any:
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(-1)

    def forward(self, x: Any, edge_index: np.ndarray, edge_label_index: np.ndarray) -> Any:
        return self.decode(self.encode(x, edge_index), edge_label_index)


def link_splits(ds: pdata.GraphDataset, seed: int) -> tuple[pdata.Data, pdata.Data, pdata.Data]:
    """PyG's link_pred.py transform: NormalizeFeatures, then RandomLinkSplit(num_val=0.05,
    num_test=0.1, is_undirected=True, add_negative_train_samples=False)."""
    transform = pdata.transforms.Compose([
        pdata.transforms.NormalizeFeatures(),
        pdata.transforms.RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
                                         add_negative_train_samples=False, seed=seed)])
    return transform(pdata.Data.from_dataset(ds))


def train_link(ds: pdata.GraphDataset, seed: int = 0, epochs: int = 100, hidden: int = 128, out: int = 64,
               lr: float = 0.01, on_epoch: Callable[[EpochRecord], Any] | None = None) -> dict[str, Any]:
    """One seeded run of PyG's link-prediction recipe: fresh negatives every epoch, BCE with
    logits, the test AUC at the epoch of the best validation AUC."""
    pg.manual_seed(seed)
    train_data, val_data, test_data = link_splits(ds, seed)
    x = nn.csr_to_tensor(train_data.x)
    model = LinkGCN(ds.num_features, hidden, out)
    opt = optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    pos = train_data.edge_label_index
    ones = train_data.edge_label

    def auc(split: pdata.Data) -> float:
        model.eval()
        with pg.no_grad():
            scores = model(x, split.edge_index, split.edge_label_index).sigmoid()
        model.train()
        return nn.roc_auc_score(split.edge_label, scores)

    best_val, final_test, times, losses = 0.0, 0.0, [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        neg = pdata.negative_sampling(train_data.edge_index, train_data.num_nodes, num_neg_samples=pos.shape[1],
                                      seed=rng)
        label_index = np.concatenate([pos, neg], axis=1)
        label = np.concatenate([ones, np.zeros(neg.shape[1], dtype=ones.dtype)])
        loss = nn.binary_cross_entropy_with_logits(model(x, train_data.edge_index, label_index), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
        val_auc, test_auc = auc(val_data), auc(test_data)
        if val_auc > best_val:
            best_val, final_test = val_auc, test_auc
        if on_epoch is not None:
            on_epoch(EpochRecord(epoch=epoch, epochs=epochs, loss=losses[-1], lr=opt.current_lr(), rolled_back=False,
                                 seconds=times[-1], metrics={"train_acc": val_auc}))
    return {"test_auc": final_test, "val_auc": best_val, "epoch_time_ms": float(np.median(times[1:] or times) * 1e3),
            "curves": {"loss": losses}, "num_train_edges": int(pos.shape[1]),
            "num_val_pairs": int(val_data.edge_label.shape[0]), "num_test_pairs": int(test_data.edge_label.shape[0])}


def run_link(data: str | None = None, dataset: str = "cora", backend: str | None = None, epochs: int = 100,
             seed: int = 0, runs: int = 1, progress: bool = True, stream: TextIO | None = None,
             download: bool = False, monitor: bool = False) -> dict[str, Any]:
    """PyG's link_pred.py on Cora (``data`` folder) or the embedded synthetic graph, ``runs`` seeds;
    mean test AUC."""
    if epochs < 1 or runs < 1:
        raise ValueError(f"link demo: epochs and runs must be >= 1, got {epochs} and {runs}")
    backend = backend or pg.get_backend()
    ds = load_graph(data, dataset, download)
    name = "sbm (synthetic)" if ds.name == "sbm" else ds.name
    aucs, vals, times = [], [], []
    with pg.use_backend(backend):
        for r in range(runs):
            bar = Progress(epochs, f"link {ds.name}" + (f" seed {seed + r}" if runs > 1 else ""),
                           enabled=progress, stream=stream)
            with monitored(monitor, stream) as m:
                def on_epoch(rec: EpochRecord, bar: Progress = bar, m: Any = m) -> None:
                    bar.update(loss=rec.loss, val_auc=round(rec.metrics["train_acc"], 4), mem_mb=round(rss_mb(), 1))
                    report_epoch(m, rec, stream)
                try:
                    last = train_link(ds, seed + r, epochs, on_epoch=on_epoch)
                finally:
                    bar.close()
            aucs.append(last["test_auc"])
            vals.append(last["val_auc"])
            times.append(last["epoch_time_ms"])
    return {"demo": "link", "dataset": name, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
            "test_auc": float(np.mean(aucs)), "test_auc_std": float(np.std(aucs)), "test_aucs": aucs,
            "val_auc": float(np.mean(vals)), "runs": runs, "seeds": [seed + r for r in range(runs)],
            "epochs": epochs, "epoch_time_ms": float(np.median(times)), "peak_rss_mb": peak_rss_mb(),
            "backend": backend}
