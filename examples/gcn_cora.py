"""Kipf & Welling's two-layer GCN on Cora (semi-supervised node classification).

Reference settings: hidden 16, dropout 0.5 (on the sparse input features too), Adam lr 0.01,
weight decay 5e-4 on the first layer only, 200 epochs, row-normalised features; Kipf & Welling
report 81.5% test accuracy.  The 2708 x 1433 feature matrix is 1.3% nonzero, so it stays sparse
and ``x @ W`` runs as a sparse-dense product.

Run:  python examples/gcn_cora.py [FOLDER_WITH_ind.cora.*]
(without the Planetoid files it falls back to polygrad's synthetic stochastic-block-model graph)
"""
import sys
from pathlib import Path

import polygrad as pg
from polygrad import nn, optim
from polygrad.data import load_planetoid, row_normalize, stochastic_block_model

root = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/planetoid")
if (root / "ind.cora.graph").is_file():
    data = load_planetoid(root, "cora")
else:
    print(f"no Cora files in {root}: using the synthetic graph instead")
    data = stochastic_block_model(seed=0)

x = nn.csr_to_tensor(row_normalize(data.x))   # sparse CSR features
edge_index = data.edge_index                   # [2, E]; GCNConv normalises and caches it

pg.manual_seed(0)
model = nn.GCN(data.num_features, 16, 2, data.num_classes, dropout=0.5)
opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                  {"params": model.conv2.parameters()}], lr=0.01)

for epoch in range(200):
    model.train()
    logits = model(x, edge_index)
    loss = nn.cross_entropy(logits, data.y, mask=data.train_mask)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if epoch % 20 == 0 or epoch == 199:
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}  "
              f"train accuracy {nn.accuracy(logits, data.y, data.train_mask):.1%}")

model.eval()
with pg.no_grad():
    logits = model(x, edge_index)
print(f"test accuracy {nn.accuracy(logits, data.y, data.test_mask):.1%}")
