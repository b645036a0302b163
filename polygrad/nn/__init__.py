"""polygrad.nn: modules, layers, the GCN, losses and gradient utilities.

    import polygrad as pg
    from polygrad import nn

    model = nn.MLP(2, [16, 16, 1])                  # micrograd's signature, on tensors
    loss = nn.max_margin(model(X), y) + 1e-4 * nn.l2_penalty(model.parameters())

    gcn = nn.GCN(dataset.num_features, 16, 2, dataset.num_classes)
    logits = gcn(features, edge_index)              # edge_index [2, E] or a sparse adjacency
    loss = nn.cross_entropy(logits, labels, mask=train_mask)
"""
from __future__ import annotations

from . import init, utils
from .gcn import GCN, GCNConv, csr_to_tensor
from .layers import MLP, Dropout, Identity, Linear, ReLU, Sequential, Sigmoid, Tanh, dropout
from .losses import (accuracy, binary_cross_entropy_with_logits, cross_entropy, hinge, l2_penalty, max_margin, mse,
                     nll_loss, roc_auc_score)
from .module import Module
from .message_passing import MessagePassing
from .convs import GATConv, GINConv, SAGEConv
from .pool import global_add_pool, global_max_pool, global_mean_pool
from .gnn_models import GAT, GIN, GraphSAGE
from .utils import clip_grad_norm_, grad_norm
# -- PyG parity, round 2: layers, norms, PyG's MLP, HeteroConv, torch state dicts --
from .edge_convs import GINEConv, GraphConv, NNConv
from .propagation import APPNP, ChebConv, SGConv
from .norm import BatchNorm, BatchNorm1d, LayerNorm
from .hetero import HeteroConv
from .mlp import MLP  # type: ignore[assignment]  # noqa: F811 - PyG's MLP(channel_list, ...), also micrograd's
from .torch_state import load_torch_state_dict, torch_names, torch_state_dict

__all__ = [
    "Module", "Linear", "MLP", "Dropout", "ReLU", "Tanh", "Sigmoid", "Identity", "Sequential",
    "GCNConv", "GCN", "csr_to_tensor", "dropout",
    "cross_entropy", "mse", "max_margin", "hinge", "l2_penalty", "accuracy",
    "binary_cross_entropy_with_logits", "nll_loss", "roc_auc_score",
    "clip_grad_norm_", "grad_norm", "init", "utils",
    "MessagePassing", "GATConv", "SAGEConv", "GINConv", "global_add_pool", "global_mean_pool", "global_max_pool",
    "GAT", "GraphSAGE", "GIN",
    # PyG parity, round 2
    "GraphConv", "GINEConv", "NNConv", "SGConv", "APPNP", "ChebConv",
    "BatchNorm", "BatchNorm1d", "LayerNorm", "HeteroConv",
    "load_torch_state_dict", "torch_state_dict", "torch_names",
]
