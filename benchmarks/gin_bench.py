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
from typing import Any, Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy  # noqa: E402,F401 - imported after the thread variables are set, so BLAS reads them

from benchmarks._harness import register  # noqa: E402
from benchmarks.gcn_bench import _epoch_vs_pyg  # noqa: E402

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
    graphs = _graphs()
    timing = (2, 3, 2) if quick else (4, 8, 3)
    rows: list[dict] = []
    summary: dict[str, Any] = {"graphs": len(graphs), "batch_size": BATCH_SIZE, "target_ratio": TARGET_RATIO}
    threads = _epoch_vs_pyg(lambda: polygrad_epoch(graphs), lambda torch, pyg_nn: pyg_epoch(graphs, torch, pyg_nn),
                            ("polygrad numpy nn.GIN + data.DataLoader", "GINConv + loader.DataLoader"),
                            timing, TARGET_RATIO, rows, summary)
    rows.append({"section": "setup", "impl": threads, "ms_per_epoch": "", "ratio_vs_pyg": ""})
    return {"rows": rows, "summary": summary}
