"""Benchmark "gin": one epoch of batched GIN graph classification, polygrad (numpy) vs PyTorch
Geometric, one thread.

Both sides train the ``polygrad demo gin`` model on the *same* 400 generated graphs
(:func:`polygrad.data.random_graph_families`, 12-30 nodes each, 300 for training): 3 GINConv
layers (each ``Linear -> ReLU -> Linear -> ReLU``, hidden 32, learnable eps), every layer's node
states sum-pooled per graph and concatenated, a linear readout, cross-entropy, gradient norm
clipped at 1, Adam lr 0.005; batches of 32 graphs, reshuffled every epoch.

* PyG: ``torch_geometric.loader.DataLoader`` over ``Data`` objects (its collate is part of the
  epoch, as in PyG's examples), ``GINConv`` and ``global_add_pool``.
* polygrad: :class:`polygrad.data.DataLoader` (collate per batch: ``Batch.from_graphs``),
  ``nn.GIN``.

One *epoch* = 10 batches of collate + forward + backward + clip + step.  Epochs alternate
between the libraries in rounds after warm-up, medians compared: ``ratio = polygrad / PyG``
(target <= 0.8).  Without torch / torch_geometric the PyG row says so.
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy  # noqa: E402,F401 - imported after the thread variables are set, so BLAS reads them

from benchmarks._harness import optional_import, register, skipped_row  # noqa: E402
from benchmarks.gcn_bench import _Threads, _time_rounds  # noqa: E402

TARGET_RATIO = 0.8
NUM_GRAPHS, BATCH_SIZE, HIDDEN, LAYERS = 400, 32, 32, 3


def _graphs():
    from polygrad.data import random_graph_families

    graphs = random_graph_families(NUM_GRAPHS, seed=0)
    return graphs[:int(0.75 * len(graphs))]


def polygrad_epoch(graphs) -> Callable[[], float]:
    import polygrad as pg
    from polygrad import nn, optim
    from polygrad.data import DataLoader

    pg.manual_seed(0)
    model = nn.GIN(1, HIDDEN, LAYERS, 2)
    opt = optim.Adam(model.parameters(), lr=0.005)
    loader = DataLoader(graphs, batch_size=BATCH_SIZE, shuffle=True, seed=0)

    def epoch() -> float:
        total = 0.0
        for b in loader:
            loss = nn.cross_entropy(model(pg.tensor(b.x), b.edge_index, b.batch, b.num_graphs), b.y)
            opt.zero_grad()
            loss.backward()
            nn.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total += float(loss.item())
        return total

    return epoch


def pyg_epoch(graphs, torch, pyg_nn) -> Callable[[], float]:
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

    torch.manual_seed(0)
    data = [Data(x=torch.from_numpy(g.x), edge_index=torch.from_numpy(g.edge_index), y=torch.tensor([g.y]))
            for g in graphs]

    def mlp(a: int, b: int):
        return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, b), torch.nn.ReLU())

    class GIN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            sizes = [1] + [HIDDEN] * LAYERS
            self.convs = torch.nn.ModuleList(pyg_nn.GINConv(mlp(a, b), train_eps=True)
                                             for a, b in zip(sizes, sizes[1:]))
            self.readout = torch.nn.Linear(HIDDEN * LAYERS, 2)

        def forward(self, x, edge_index, batch, num_graphs):
            pooled = []
            for conv in self.convs:
                x = conv(x, edge_index)
                pooled.append(pyg_nn.global_add_pool(x, batch, num_graphs))
            return self.readout(torch.cat(pooled, dim=1))

    model = GIN()
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    loader = DataLoader(data, batch_size=BATCH_SIZE, shuffle=True, generator=torch.Generator().manual_seed(0))

    def epoch() -> float:
        total = 0.0
        for b in loader:
            loss = F.cross_entropy(model(b.x, b.edge_index, b.batch, b.num_graphs), b.y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total += float(loss.item())
        return total

    return epoch


@register("gin", "GIN epoch, 300 of 400 small graphs in batches of 32 (collate+fwd+bwd+clip+Adam, 1 thread): "
                 "polygrad numpy vs PyG")
def run(quick: bool) -> dict:
    import polygrad as pg

    graphs = _graphs()
    rounds, per_round, warmup = (2, 3, 2) if quick else (4, 8, 3)
    rows: list[dict] = []
    summary: dict[str, Any] = {"graphs": len(graphs), "batch_size": BATCH_SIZE, "target_ratio": TARGET_RATIO}
    torch = optional_import("torch")
    pyg_nn = optional_import("torch_geometric.nn")
    with _Threads() as threads:
        fns: dict[str, Callable[[], float]] = {}
        with pg.use_backend("numpy"):
            fns["polygrad"] = polygrad_epoch(graphs)
            if torch is not None and pyg_nn is not None:
                torch.set_num_threads(1)
                fns["pyg"] = pyg_epoch(graphs, torch, pyg_nn)
            times = _time_rounds(fns, rounds, per_round, warmup)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rows.append({"section": "epoch", "impl": "polygrad numpy nn.GIN + data.DataLoader", "ms_per_epoch": med["polygrad"],
                 "ratio_vs_pyg": med["polygrad"] / med["pyg"] if "pyg" in med else "n/a"})
    summary["polygrad_ms_per_epoch"] = med["polygrad"]
    if "pyg" in med:
        rows.append({"section": "epoch", "impl": f"PyG {optional_import('torch_geometric').__version__} "
                                                 f"(torch {torch.__version__}) GINConv + loader.DataLoader",
                     "ms_per_epoch": med["pyg"], "ratio_vs_pyg": 1.0})
        summary["pyg_ms_per_epoch"] = med["pyg"]
        summary["ratio_polygrad_over_pyg"] = med["polygrad"] / med["pyg"]
        summary["meets_target_ratio"] = summary["ratio_polygrad_over_pyg"] <= TARGET_RATIO
    else:
        missing = "torch" if torch is None else "torch_geometric"
        rows.append(skipped_row(missing, section="epoch",
                                reason=f"skipped: the PyG baseline needs torch and torch_geometric; {missing} is not "
                                       "installed; polygrad's figure above stands alone"))
        summary["ratio_polygrad_over_pyg"] = None
    summary["threads"] = threads.how
    rows.append({"section": "setup", "impl": threads.how, "ms_per_epoch": "", "ratio_vs_pyg": ""})
    return {"rows": rows, "summary": summary}
