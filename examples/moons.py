"""micrograd's moons demo, on polygrad tensors.

A 2 -> 16 -> 16 -> 1 ReLU MLP learns to separate two interleaving half circles, trained exactly
as in micrograd's demo.ipynb: max-margin loss + 1e-4 L2, SGD with the learning rate decaying
from 1.0 to 0.1 over 100 steps.  Run:  python examples/moons.py
"""
import polygrad as pg
from polygrad import nn, optim
from polygrad.data import make_moons

X, y = make_moons(n_samples=100, noise=0.1, seed=1337)
y = y * 2 - 1                                   # labels in {-1, +1}, as micrograd uses
X = pg.tensor(X, dtype=pg.float64)

pg.manual_seed(1337)
model = nn.MLP(2, [16, 16, 1], init="micrograd", dtype=pg.float64)   # micrograd's MLP(2, [16, 16, 1])
opt = optim.SGD(model.parameters(), lr=1.0, lr_schedule=lambda k: 1.0 - 0.9 * k / 100)

for k in range(100):
    scores = model(X)                                        # all 100 points at once: [100, 1]
    loss = nn.max_margin(scores, y) + 1e-4 * nn.l2_penalty(model.parameters())
    opt.zero_grad()
    loss.backward()
    opt.step()
    if k % 10 == 0 or k == 99:
        print(f"step {k:3d}  loss {loss.item():.4f}  accuracy {nn.accuracy(scores, y):.0%}")

with pg.no_grad():
    print(f"final accuracy {nn.accuracy(model(X), y):.0%}")
