"""Benchmark "gat": one GAT training epoch on Cora, polygrad (numpy) vs PyTorch Geometric, one thread.

Both sides run PyG's ``examples/gat.py`` recipe on the *same* arrays (Cora's row-normalised
features, edge_index, training mask; a Cora-sized synthetic graph when the Planetoid files are
absent): GATConv(1433 -> 8, heads=8, dropout 0.6) -> ELU -> GATConv(64 -> 7, heads=1,
concat=False, dropout 0.6), dropout 0.6 on the input and hidden features, cross-entropy on the
140 training nodes, Adam lr 0.005, weight decay 5e-4.

* PyG: ``torch_geometric.nn.GATConv`` on the dense ``data.x`` (as its example).
* polygrad: ``nn.GAT`` (``nn.GATConv``: all heads on the head-expanded pattern, one segment
  softmax and one SpMM per layer) with the features as sparse CSR (1.3% dense), so ``x @ W``
  is an SpMM.

One *epoch* = forward + backward + optimizer step.  Timed epochs alternate between the two
libraries in rounds after warm-up epochs, and the medians are compared:
``ratio = polygrad / PyG`` (target <= 0.5).  One thread: ``torch.set_num_threads(1)`` and the
BLAS limited with threadpoolctl when installed (else ``*_NUM_THREADS`` set at import).  Without
torch / torch_geometric the PyG row says so and polygrad's figures stand alone.
"""
from __future__ import annotations

import os
from typing import Any, Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from benchmarks._harness import register  # noqa: E402
from benchmarks.gcn_bench import _dataset, _epoch_vs_pyg, pyg_full_batch_epoch  # noqa: E402

TARGET_RATIO = 0.5


def _polygrad_epoch(ds) -> Callable[[], float]:
    import polygrad as pg
    from polygrad import nn, optim
    from polygrad.data import row_normalize

    pg.manual_seed(0)
    x = nn.csr_to_tensor(row_normalize(ds.x, dtype=np.float32))
    model = nn.GAT(ds.num_features, 8 * 8, 2, ds.num_classes, dropout=0.6, heads=8)
    opt = optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    y, mask, ei = ds.y, ds.train_mask, ds.edge_index

    def epoch() -> float:
        model.train()
        loss = nn.cross_entropy(model(x, ei), y, mask=mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    return epoch


def _pyg_epoch(ds, torch, pyg_nn) -> Callable[[], float]:
    import torch.nn.functional as F

    torch.manual_seed(0)

    class GAT(torch.nn.Module):  # PyG examples/gat.py
        def __init__(self, in_channels: int, hidden: int, out_channels: int, heads: int):
            super().__init__()
            self.conv1 = pyg_nn.GATConv(in_channels, hidden, heads, dropout=0.6)
            self.conv2 = pyg_nn.GATConv(hidden * heads, out_channels, heads=1, concat=False, dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.6, training=self.training)
            x = F.elu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.6, training=self.training)
            return self.conv2(x, edge_index)

    model = GAT(ds.num_features, 8, ds.num_classes, 8)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    return pyg_full_batch_epoch(ds, torch, model, opt)


@register("gat", "GAT epoch on Cora (8 heads x 8 hidden, fwd+bwd+Adam, 1 thread): polygrad numpy vs PyG GATConv")
def run(quick: bool) -> dict:
    ds, data_desc = _dataset()
    timing = (2, 4, 2) if quick else (4, 10, 5)
    rows: list[dict] = []
    summary: dict[str, Any] = {"dataset": data_desc, "target_ratio": TARGET_RATIO}
    threads = _epoch_vs_pyg(lambda: _polygrad_epoch(ds), lambda torch, pyg_nn: _pyg_epoch(ds, torch, pyg_nn),
                            ("polygrad numpy nn.GAT (sparse CSR features)", "GATConv, examples/gat.py"),
                            timing, TARGET_RATIO, rows, summary)
    rows.append({"section": "setup", "impl": f"{data_desc}: {ds.num_nodes} nodes, {ds.num_edges} edges",
                 "ms_per_epoch": "", "ratio_vs_pyg": ""})
    rows.append({"section": "setup", "impl": threads, "ms_per_epoch": "", "ratio_vs_pyg": ""})
    return {"rows": rows, "summary": summary}
