"""Datasets for polygrad, as plain numpy arrays.

* :func:`make_moons` — micrograd's two-moons toy problem (``X`` float64 ``[n, 2]``, ``y`` int64).
* :func:`load_planetoid` — Cora / CiteSeer / PubMed in the standard Planetoid split, assembled
  exactly as PyTorch Geometric does, read with a restricted unpickler (no scipy needed).
* :func:`stochastic_block_model` — a small synthetic labelled graph with the same interface,
  the embedded default for the GCN demo; :func:`random_graph` — large random ``edge_index``
  for benchmarks.
* :class:`Batch` / :func:`collate` — small graphs merged block-diagonally with a ``batch`` vector;
  :func:`random_graph_families` — a generated graph-classification dataset;
  :class:`NeighborSampler` — seeded, vectorised GraphSAGE fan-out sampling of sub-graphs;
  :class:`DataLoader` — batches of graphs reshuffled every epoch.
* PyG-shaped: :class:`Data` / :class:`HeteroData`; :mod:`.utils` (``to_undirected``, ``degree``,
  ``add_self_loops``, ``subgraph``, ``k_hop_subgraph`` ... with PyG's outputs); :mod:`.transforms`
  (``Compose``, ``NormalizeFeatures``, ``ToUndirected``, ``RandomNodeSplit``, ``RandomLinkSplit``);
  :func:`negative_sampling`, :class:`LinkNeighborLoader`.
* :func:`load_tudataset` (TUDataset folders) and :func:`load_ogb_node` (OGB node-property
  folders), read from local files as PyG / OGB do, with ``download=True`` when online.
* helpers: :class:`CSRMatrix` (features), :class:`GraphDataset`, :func:`row_normalize`,
  :func:`normalized_adjacency`, :func:`standardize`, :func:`train_test_split`, ...

This package depends only on numpy and :mod:`polygrad.errors`; turning its arrays into polygrad
tensors is left to the caller.
"""
from __future__ import annotations

from .moons import make_moons
from .planetoid import (
    PLANETOID_NAMES,
    PLANETOID_URL,
    PlanetoidDataset,
    RestrictedUnpickler,
    default_cache_dir,
    download_planetoid,
    find_planetoid_dir,
    load_planetoid,
    read_planetoid_file,
)
from .csr import CSRMatrix
from .graph_dataset import GraphDataset
from .edge_index import coalesce_edge_index, edge_index_to_csr, index_to_mask, remove_self_loops, to_undirected
from .normalize import normalized_adjacency, row_normalize
from .tabular import standardize, train_test_split
from .synthetic import random_graph, stochastic_block_model
from .data import Data, HeteroData
from .batch import Batch, DataLoader, Graph, collate, iterate_batches, random_graph_families
from .sampler import NeighborSampler, SampledGraph
from .link import LinkNeighborLoader, negative_sampling
from .tudataset import download_tudataset, load_tudataset
from .ogb import download_ogb_node, load_ogb_node
from . import transforms, utils

__all__ = [
    # toy data
    "make_moons",
    "standardize",
    "train_test_split",
    # Planetoid
    "load_planetoid",
    "download_planetoid", "find_planetoid_dir",
    "read_planetoid_file",
    "PlanetoidDataset",
    "RestrictedUnpickler",
    "PLANETOID_NAMES",
    "PLANETOID_URL",
    "default_cache_dir",
    # synthetic graphs
    "stochastic_block_model",
    "random_graph",
    # containers and preprocessing
    "CSRMatrix",
    "GraphDataset",
    "row_normalize",
    "normalized_adjacency",
    "index_to_mask",
    "remove_self_loops",
    "coalesce_edge_index",
    "to_undirected",
    "edge_index_to_csr",
    # many graphs, big graphs
    "Graph", "Batch", "collate", "iterate_batches", "random_graph_families",
    "NeighborSampler", "SampledGraph",
    # PyG-shaped containers, loaders, link prediction (utils: PyG's edge_index helpers; transforms)
    "Data", "HeteroData", "DataLoader", "LinkNeighborLoader", "negative_sampling", "transforms", "utils",
    # dataset folders: TUDataset (graph classification), OGB node property prediction
    "load_tudataset", "download_tudataset", "load_ogb_node", "download_ogb_node",
]
