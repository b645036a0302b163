"""Message-passing layers against PyG itself: forward and every gradient (inputs, edge features,
each weight) in float64 to 1e-9, on Cora's graph and on a random graph with isolated nodes and
repeated edges (and self loops, some repeated).  PyG is a third-party baseline, never a
dependency: these tests skip where torch_geometric is not installed.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn
from polygrad.data import load_planetoid

torch = pytest.importorskip("torch", reason="PyTorch is the baseline's runtime; not a polygrad dependency")
tg = pytest.importorskip("torch_geometric", reason="PyG is the baseline these layers are checked against")
from torch_geometric import nn as gnn  # noqa: E402

from tests.conftest import planetoid_dir  # noqa: E402

TOL = dict(rtol=1e-9, atol=1e-9)
F_IN = 5


def _random_multigraph() -> tuple[np.ndarray, int]:
    """40 nodes, 0-9 isolated; every edge of the first 30 repeated once, a few self loops (one twice)."""
    rng = np.random.default_rng(7)
    n = 40
    src, dst = rng.integers(10, n, 120), rng.integers(10, n, 120)
    ei = np.stack([src, dst])
    ei = np.concatenate([ei, ei[:, :30], [[12, 12, 15], [12, 12, 15]]], axis=1)
    return ei[:, rng.permutation(ei.shape[1])], n


def _cora() -> tuple[np.ndarray, int]:
    root = planetoid_dir()
    if root is None:
        pytest.skip("Planetoid data not found (set POLYGRAD_PLANETOID_DIR or place ../shared/data/planetoid)")
    ds = load_planetoid(root, "cora")
    return np.asarray(ds.edge_index), ds.num_nodes


GRAPHS = {"multigraph": _random_multigraph, "cora": _cora}


def _t(a: np.ndarray, grad: bool = True) -> "torch.Tensor":
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def _lin(pg_lin: nn.Linear, torch_lin: "torch.nn.Module") -> list[tuple]:
    """Copy a torch Linear into a polygrad Linear; the (polygrad, torch, transposed) weight pairs."""
    pg_lin.weight.data = pg.tensor(torch_lin.weight.detach().numpy().T.copy(), dtype=pg.float64)
    pairs = [(pg_lin.weight, torch_lin.weight, True)]
    if torch_lin.bias is not None:
        pg_lin.bias.data = pg.tensor(torch_lin.bias.detach().numpy().copy(), dtype=pg.float64)
        pairs.append((pg_lin.bias, torch_lin.bias, False))
    return pairs


def _param(p: pg.Tensor, t: "torch.Tensor", transpose: bool = False, reshape: bool = False) -> tuple:
    value = t.detach().numpy()
    value = value.T if transpose else value
    p.data = pg.tensor(value.reshape(p.shape).copy(), dtype=pg.float64)
    return (p, t, transpose)


def _compare(pg_out, torch_out, pg_inputs, torch_inputs, pairs, seed=0, skip=None):
    """Forward equal, then gradients of one random linear functional of the output (``skip``:
    a mask of entries of the last input's gradient not compared)."""
    np.testing.assert_allclose(pg_out.numpy(), torch_out.detach().numpy(), **TOL)
    r = np.random.default_rng(seed).normal(size=pg_out.shape)
    (pg_out * pg.tensor(r, dtype=pg.float64)).sum().backward()
    (torch_out * torch.tensor(r)).sum().backward()
    for p, t in list(zip(pg_inputs, torch_inputs)) + [(p, t) for p, t, _ in pairs]:
        tr = next((tt for pp, _, tt in pairs if pp is p), False)
        got, want = p.grad.numpy(), (t.grad.numpy().T if tr else t.grad.numpy()).reshape(p.shape)
        if skip is not None and p is pg_inputs[-1]:
            got, want = got[~skip], want[~skip]
        np.testing.assert_allclose(got, want, **TOL)


def _inputs(n: int, e: int, edge_dim: int = 3):
    rng = np.random.default_rng(1)
    return rng.normal(size=(n, F_IN)), rng.uniform(0.5, 2.0, size=e), rng.normal(size=(e, edge_dim))


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("weighted", [False, True])
def test_gcnconv_matches_pyg(graph, weighted):
    ei, n = GRAPHS[graph]()
    x, w, _ = _inputs(n, ei.shape[1])
    torch.manual_seed(0)
    ref = gnn.GCNConv(F_IN, 4).double()
    torch.nn.init.normal_(ref.bias)
    conv = nn.GCNConv(F_IN, 4, dtype=pg.float64)
    pairs = [_param(conv.weight, ref.lin.weight, transpose=True), _param(conv.bias, ref.bias)]
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    pw, tw = pg.tensor(w, dtype=pg.float64, requires_grad=True), _t(w)
    out = conv(px, ei, edge_weight=pw if weighted else None)
    want = ref(tx, torch.tensor(ei), tw if weighted else None)
    # a self loop given twice: both PyG and polygrad use the last copy's weight, but PyG's
    # index_put backward also hands that loop's gradient to the unused earlier copies
    loop = ei[0] == ei[1]
    _, counts = np.unique(ei[0][loop], return_counts=True)
    earlier = np.zeros(ei.shape[1], dtype=bool)
    for node in np.unique(ei[0][loop])[counts > 1]:
        at = np.flatnonzero(loop & (ei[0] == node))
        earlier[at[:-1]] = True
    _compare(out, want, [px, pw] if weighted else [px], [tx, tw] if weighted else [tx], pairs,
             skip=earlier if weighted else None)
    if weighted and earlier.any():
        assert (pw.grad.numpy()[earlier] == 0).all()     # an unused weight has no gradient here


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("concat,edge_dim", [(True, None), (False, None), (True, 3)])
def test_gatconv_matches_pyg(graph, concat, edge_dim):
    ei, n = GRAPHS[graph]()
    x, _, ea = _inputs(n, ei.shape[1])
    torch.manual_seed(0)
    ref = gnn.GATConv(F_IN, 3, heads=2, concat=concat, edge_dim=edge_dim).double()
    torch.nn.init.normal_(ref.bias)
    conv = nn.GATConv(F_IN, 3, heads=2, concat=concat, edge_dim=edge_dim, dtype=pg.float64)
    pairs = [_param(conv.weight, ref.lin.weight, transpose=True), _param(conv.att_src, ref.att_src),
             _param(conv.att_dst, ref.att_dst), _param(conv.bias, ref.bias)]
    if edge_dim:
        pairs += [_param(conv.lin_edge.weight, ref.lin_edge.weight, transpose=True),
                  _param(conv.att_edge, ref.att_edge)]
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    pe, te = pg.tensor(ea, dtype=pg.float64, requires_grad=True), _t(ea)
    out, (edges, alpha) = conv(px, ei, edge_attr=pe if edge_dim else None, return_attention_weights=True)
    want, (t_edges, t_alpha) = ref(tx, torch.tensor(ei), te if edge_dim else None, return_attention_weights=True)
    np.testing.assert_array_equal(edges, t_edges.numpy())
    np.testing.assert_allclose(alpha.numpy(), t_alpha.detach().numpy(), **TOL)
    _compare(out, want, [px, pe] if edge_dim else [px], [tx, te] if edge_dim else [tx], pairs)


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("aggr", ["mean", "max", "sum"])
def test_sageconv_matches_pyg(graph, aggr):
    ei, n = GRAPHS[graph]()
    x, _, _ = _inputs(n, ei.shape[1])
    torch.manual_seed(0)
    out_channels = 4 if aggr != "sum" else 7  # 7 > F_IN: the aggregate-then-map order too
    ref = gnn.SAGEConv(F_IN, out_channels, aggr=aggr).double()
    conv = nn.SAGEConv(F_IN, out_channels, aggr=aggr, dtype=pg.float64)
    pairs = _lin(conv.lin_l, ref.lin_l) + _lin(conv.lin_r, ref.lin_r)
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    _compare(conv(px, ei), ref(tx, torch.tensor(ei)), [px], [tx], pairs)


@pytest.mark.parametrize("graph", list(GRAPHS))
def test_ginconv_matches_pyg(graph):
    ei, n = GRAPHS[graph]()
    x, _, _ = _inputs(n, ei.shape[1])
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(F_IN, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)).double()
    ref = gnn.GINConv(mlp, eps=0.3, train_eps=True).double()
    ours = nn.Sequential(nn.Linear(F_IN, 6, dtype=pg.float64), nn.ReLU(), nn.Linear(6, 4, dtype=pg.float64))
    conv = nn.GINConv(ours, eps=0.3, train_eps=True, dtype=pg.float64)
    # PyG's eps went through float32: copied like the weights
    pairs = _lin(ours.layers[0], mlp[0]) + _lin(ours.layers[2], mlp[2]) + [_param(conv.eps, ref.eps)]
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    _compare(conv(px, ei), ref(tx, torch.tensor(ei)), [px], [tx], pairs)


class _TorchTutorial(tg.nn.MessagePassing):
    """PyG's "Creating Message Passing Networks" GCN layer, verbatim."""

    def __init__(self, fin, fout):
        super().__init__(aggr="add")
        self.lin = torch.nn.Linear(fin, fout, bias=False)
        self.bias = torch.nn.Parameter(torch.empty(fout))
        torch.nn.init.normal_(self.bias)

    def forward(self, x, edge_index):
        edge_index, _ = tg.utils.add_self_loops(edge_index, num_nodes=x.size(0))
        x = self.lin(x)
        row, col = edge_index
        deg = tg.utils.degree(col, x.size(0), dtype=x.dtype)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0
        norm = deg_inv_sqrt[row] * deg_inv_sqrt[col]
        return self.propagate(edge_index, x=x, norm=norm) + self.bias

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


class _Tutorial(nn.MessagePassing):
    """The same layer on polygrad: its norm= is in edge_index order, as in PyG."""

    def __init__(self, fin, fout):
        super().__init__(aggr="add")
        self.lin = nn.Linear(fin, fout, bias=False, dtype=pg.float64)
        self.bias = pg.tensor(np.zeros(fout), dtype=pg.float64, requires_grad=True)

    def forward(self, x, edge_index):
        loops = np.arange(x.shape[0])
        edge_index = np.concatenate([edge_index, np.stack([loops, loops])], axis=1)
        x = self.lin(x)
        row, col = edge_index
        deg = np.bincount(col, minlength=x.shape[0]).astype(np.float64)
        norm = pg.tensor(np.where(deg[row] > 0, deg[row], 1) ** -0.5 * deg[col] ** -0.5, dtype=pg.float64)
        return self.propagate(edge_index, x=x, norm=norm) + self.bias

    def message(self, x_j, norm):
        return norm.reshape(-1, 1) * x_j


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_custom_message_passing_matches_pyg(graph, flow):
    ei, n = GRAPHS[graph]()
    x, _, _ = _inputs(n, ei.shape[1])
    torch.manual_seed(0)
    ref, ours = _TorchTutorial(F_IN, 3).double(), _Tutorial(F_IN, 3)
    ref.flow = ours.flow = flow
    pairs = _lin(ours.lin, ref.lin) + [_param(ours.bias, ref.bias)]
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    _compare(ours(px, ei), ref(tx, torch.tensor(ei)), [px], [tx], pairs)


def test_bipartite_sage_matches_pyg():
    ei, _ = _random_multigraph()
    ei = ei[:, ei[1] < 25]                                 # 40 sources -> 25 destinations
    rng = np.random.default_rng(3)
    xs, xd = rng.normal(size=(40, F_IN)), rng.normal(size=(25, F_IN))
    torch.manual_seed(0)
    ref = gnn.SAGEConv(F_IN, 4, aggr="mean").double()
    conv = nn.SAGEConv(F_IN, 4, dtype=pg.float64)
    pairs = _lin(conv.lin_l, ref.lin_l) + _lin(conv.lin_r, ref.lin_r)
    ps, pd = (pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in (xs, xd))
    ts, td = _t(xs), _t(xd)
    _compare(conv((ps, pd), ei), ref((ts, td), torch.tensor(ei)), [ps, pd], [ts, td], pairs)


def test_bipartite_gin_matches_pyg():
    ei, _ = _random_multigraph()
    ei = ei[:, ei[1] < 25]
    rng = np.random.default_rng(4)
    xs, xd = rng.normal(size=(40, F_IN)), rng.normal(size=(25, F_IN))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(F_IN, 4)).double()
    ref = gnn.GINConv(mlp, eps=0.25, train_eps=True).double()
    ours = nn.Sequential(nn.Linear(F_IN, 4, dtype=pg.float64))
    conv = nn.GINConv(ours, train_eps=True, dtype=pg.float64)
    pairs = _lin(ours.layers[0], mlp[0]) + [_param(conv.eps, ref.eps)]
    ps, pd = (pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in (xs, xd))
    ts, td = _t(xs), _t(xd)
    _compare(conv((ps, pd), ei), ref((ts, td), torch.tensor(ei)), [ps, pd], [ts, td], pairs)


@pytest.mark.parametrize("edge_dim", [None, 2])
def test_bipartite_gat_matches_pyg(edge_dim):
    ei, _ = _random_multigraph()
    ei = ei[:, ei[1] < 25]                                 # 40 sources -> 25 destinations
    rng = np.random.default_rng(5)
    xs, xd, ea = rng.normal(size=(40, F_IN)), rng.normal(size=(25, F_IN)), rng.normal(size=(ei.shape[1], 2))
    torch.manual_seed(0)
    ref = gnn.GATConv(F_IN, 3, heads=2, edge_dim=edge_dim).double()
    torch.nn.init.normal_(ref.bias)
    conv = nn.GATConv(F_IN, 3, heads=2, edge_dim=edge_dim, dtype=pg.float64)
    pairs = [_param(conv.weight, ref.lin.weight, transpose=True), _param(conv.att_src, ref.att_src),
             _param(conv.att_dst, ref.att_dst), _param(conv.bias, ref.bias)]
    if edge_dim:
        pairs += [_param(conv.lin_edge.weight, ref.lin_edge.weight, transpose=True),
                  _param(conv.att_edge, ref.att_edge)]
    ps, pd, pe = (pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in (xs, xd, ea))
    ts, td, te = _t(xs), _t(xd), _t(ea)
    out = conv((ps, pd), ei, edge_attr=pe if edge_dim else None)
    want = ref((ts, td), torch.tensor(ei), te if edge_dim else None)
    _compare(out, want, [ps, pd, pe] if edge_dim else [ps, pd], [ts, td, te] if edge_dim else [ts, td], pairs)


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("loops,edge_dim", [(True, None), (False, None), (True, 2)])
def test_gat_with_separate_source_and_destination_weights_matches_pyg(graph, loops, edge_dim):
    """``GATConv((F_src, F_dst), ...)``: PyG's ``lin_src`` / ``lin_dst``, each side its own width."""
    ei, n = GRAPHS[graph]()
    nd = n * 5 // 8
    ei = ei[:, ei[1] < nd]                                 # n sources -> nd destinations
    rng = np.random.default_rng(6)
    xs, xd, ea = rng.normal(size=(n, F_IN)), rng.normal(size=(nd, 4)), rng.normal(size=(ei.shape[1], 2))
    torch.manual_seed(0)
    ref = gnn.GATConv((F_IN, 4), 3, heads=2, add_self_loops=loops, edge_dim=edge_dim).double()
    torch.nn.init.normal_(ref.bias)
    conv = nn.GATConv((F_IN, 4), 3, heads=2, add_self_loops=loops, edge_dim=edge_dim, dtype=pg.float64)
    assert conv.weight is None and conv.in_channels == (F_IN, 4)
    pairs = [_param(conv.lin_src.weight, ref.lin_src.weight, transpose=True),
             _param(conv.lin_dst.weight, ref.lin_dst.weight, transpose=True), _param(conv.att_src, ref.att_src),
             _param(conv.att_dst, ref.att_dst), _param(conv.bias, ref.bias)]
    if edge_dim:
        pairs += [_param(conv.lin_edge.weight, ref.lin_edge.weight, transpose=True),
                  _param(conv.att_edge, ref.att_edge)]
    ps, pd, pe = (pg.tensor(a, dtype=pg.float64, requires_grad=True) for a in (xs, xd, ea))
    ts, td, te = _t(xs), _t(xd), _t(ea)
    out, (edges, alpha) = conv((ps, pd), ei, edge_attr=pe if edge_dim else None, return_attention_weights=True)
    want, (t_edges, t_alpha) = ref((ts, td), torch.tensor(ei), te if edge_dim else None,
                                   return_attention_weights=True)
    np.testing.assert_array_equal(edges, t_edges.numpy())
    np.testing.assert_allclose(alpha.numpy(), t_alpha.detach().numpy(), **TOL)
    _compare(out, want, [ps, pd, pe] if edge_dim else [ps, pd], [ts, td, te] if edge_dim else [ts, td], pairs)


def test_gat_with_a_weight_pair_maps_one_input_with_both_and_loads_pygs_state():
    ei, n = _random_multigraph()
    x = np.random.default_rng(8).normal(size=(n, F_IN))
    torch.manual_seed(1)
    ref = gnn.GATConv((F_IN, F_IN), 3, heads=2).double()
    torch.nn.init.normal_(ref.bias)
    conv = nn.GATConv((F_IN, F_IN), 3, heads=2, dtype=pg.float64)
    assert nn.torch_names(conv) == {"lin_src.weight": "lin_src.weight", "lin_dst.weight": "lin_dst.weight",
                                    "att_src": "att_src", "att_dst": "att_dst", "bias": "bias"}
    nn.load_torch_state_dict(conv, ref.state_dict())
    px, tx = pg.tensor(x, dtype=pg.float64, requires_grad=True), _t(x)
    pairs = [(conv.lin_src.weight, ref.lin_src.weight, True), (conv.lin_dst.weight, ref.lin_dst.weight, True),
             (conv.att_src, ref.att_src, False), (conv.att_dst, ref.att_dst, False), (conv.bias, ref.bias, False)]
    _compare(conv(px, ei), ref(tx, torch.tensor(ei)), [px], [tx], pairs)
    with pytest.raises(pg.errors.ShapeError, match=r"\[N, 4\]"):
        nn.GATConv((F_IN, 4), 3)(pg.tensor(x), ei)         # one input for two widths
    with pytest.raises(ValueError, match="pair"):
        nn.GATConv((F_IN, 4, 2), 3)
