"""polygrad.optim: SGD (momentum, weight decay), Adam / AdamW, parameter groups, lr schedules.

    opt = optim.Adam([{"params": gcn.conv1.parameters(), "weight_decay": 5e-4},
                      {"params": gcn.conv2.parameters()}], lr=0.01)
    opt = optim.SGD(model.parameters(), lr=1.0, lr_schedule=lambda k: 1.0 - 0.9 * k / 100)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)   # PyTorch's schedulers

Optimizers work on every backend and with dense and sparse gradients (see ``optimizer.py``).
"""
from __future__ import annotations

from . import lr_scheduler
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
