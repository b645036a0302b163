"""Fusing a step's graph (``polygrad_dask.fusion``): the grouping rules on generated graphs (no
cluster), then fused against unfused submissions on two worker processes -- the same bits
(NaN payloads and signs, -0.0, inf, float32, Fortran order) and fewer tasks, and ``fit`` with
the same losses and parameters."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

try:
    import polygrad_dask  # noqa: E402
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import polygrad_dask  # noqa: E402

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.apps.train import fit  # noqa: E402
from polygrad_dask import backend as dask_backend  # noqa: E402
from polygrad_dask.fusion import fuse_groups  # noqa: E402

TIMEOUT = 120
W0 = {"workers": ["w0"], "allow_other_workers": True}
W1 = {"workers": ["w1"], "allow_other_workers": True}
ANY = {"workers": ["w0", "w1"], "allow_other_workers": True}


# -- the grouping rules (no cluster) -----------------------------------------------------------------

def test_a_chain_on_one_worker_is_one_task_under_its_last_key():
    deps = {"a": set(), "b": {"a"}, "c": {"b"}}
    assert fuse_groups(deps, {"c"}, {"a": W0, "b": W0, "c": W0}, set()) == {"c": ["a", "b", "c"]}


@pytest.mark.parametrize("why", ["shared", "elsewhere", "kept", "priority", "blocked", "unplaced-vs-placed", "loose"])
def test_what_is_not_fused(why):
    deps = {"a": set(), "b": {"a"}, "c": {"a"} if why == "shared" else set()}
    ann = {"a": dict(W0), "b": dict(W0), "c": dict(W0)}
    keep, blocked = {"b", "c"}, set()
    if why == "elsewhere":
        ann["b"] = dict(W1)
    elif why == "kept":
        keep.add("a")
    elif why == "priority":
        ann["a"]["priority"] = 1
        ann["b"]["priority"] = 1
    elif why == "blocked":
        blocked.add("a")
    elif why == "unplaced-vs-placed":
        ann["a"] = {}
    elif why == "loose":  # may run on either worker: the scheduler places it by its inputs
        ann["a"], ann["b"] = dict(ANY), dict(ANY)
    groups = fuse_groups(deps, keep, ann, blocked)
    assert groups["a"] == ["a"] and groups["b"] == ["b"]


@st.composite
def graphs(draw):
    """A random DAG (each key depends on some earlier ones), placements among w0, w1 and none,
    and the kept keys."""
    n = draw(st.integers(1, 25))
    deps = {}
    for k in range(n):
        deps[k] = set(draw(st.lists(st.integers(0, k - 1), max_size=3))) if k else set()
    places = [{}, W0, W1, ANY]
    ann = {k: places[draw(st.integers(0, 3))] for k in range(n)}
    keep = set(draw(st.lists(st.integers(0, n - 1), max_size=4)))
    return deps, ann, keep


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_groups_are_in_trees_of_one_placement_ending_at_their_root(case):
    deps, ann, keep = case
    groups = fuse_groups(deps, keep, ann, set())
    users = {k: [u for u, d in deps.items() if k in d] for k in deps}
    members = [k for g in groups.values() for k in g]
    assert sorted(members) == sorted(deps)  # every key in exactly one group
    for top, group in groups.items():
        assert group[-1] == top
        for i, k in enumerate(group):
            # producers first: a member's dependencies inside the group come before it
            assert all(group.index(d) < i for d in deps[k] if d in group)
            if k == top:
                continue
            assert k not in keep and len(users[k]) == 1 and users[k][0] in group
            assert ann[k] == ann[users[k][0]] and ann[k] is not ANY
    assert all(k in groups for k in keep)  # a kept key is a root (it keeps its future)


# -- on a cluster --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    """Two worker processes started by polygrad_dask.connect, 2 row blocks, small blocks allowed."""
    from polygrad.runtime.registry import registry
    from polygrad.testing.temporary import temporary_plugin

    registry.load()
    entry = registry.entries.get("dask")
    ctx = None
    if entry is None or entry.backend is None:
        ctx = temporary_plugin(polygrad_dask, "dask")
        ctx.__enter__()
    c = polygrad_dask.connect(workers=2, timeout=TIMEOUT)
    saved = polygrad_dask.chunks.partitions, polygrad_dask.chunks.min_block_rows
    polygrad_dask.chunks.set_partitions(2)
    polygrad_dask.chunks.min_block_rows = 1
    try:
        yield c
    finally:
        polygrad_dask.chunks.set_partitions(saved[0])
        polygrad_dask.chunks.min_block_rows = saved[1]
        polygrad_dask.cluster.close(c)
        if ctx is not None:
            ctx.__exit__(None, None, None)


SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, 3.0]


@st.composite
def operands(draw):
    """Two n x f arrays of one dtype (specials included, NaNs of both signs and another payload),
    C or Fortran ordered, and an edge list over n nodes."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n, f = draw(st.integers(2, 9)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    pick = draw(st.lists(st.integers(0, len(SPECIALS) - 1), min_size=0, max_size=6))
    arrays = []
    for _ in range(2):
        a = rng.normal(size=(n, f)).astype(dtype)
        flat = a.reshape(-1)
        for i, p in enumerate(pick):
            flat[(i * 7 + seed) % flat.size] = SPECIALS[p]
        if draw(st.booleans()):  # a NaN with another payload
            flat[seed % flat.size] = np.frombuffer(np.array([0x7FC00123 if dtype == np.float32 else 0x7FF8000000000123],
                                                            dtype=np.uint32 if dtype == np.float32 else np.uint64
                                                            ).tobytes(), dtype=dtype)[0]
        arrays.append(np.asfortranarray(a) if draw(st.booleans()) else a)
    ei = rng.integers(0, n, size=(2, draw(st.integers(0, 3 * n))))
    return arrays[0], arrays[1], ei


def _step(x: pg.Tensor, y: pg.Tensor, adj) -> list:
    """A chain of elementwise ops, a reduction, SpMM and a matmul (forward and backward), as a
    GCN layer's epoch builds them: the outputs to persist."""
    w = pg.tensor(np.linspace(-1.5, 2.0, x.shape[1] * 3).reshape(x.shape[1], 3).astype(x.dtype), requires_grad=True)
    h = ((x * 2.0 + y).relu() - y * 0.5)
    z = (adj @ (h @ w)).relu()
    loss = (z.exp() - z).sum()
    loss.backward()
    return [h, z, loss, w.grad, (x - y).abs() / (y * y + 1.0)]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operands())
def test_fused_submission_gives_the_unfused_bits(client, monkeypatch, case):
    """The same graph materialised fused and unfused: the same bytes in every output (NaN payloads
    and signs included), with fewer tasks fused."""
    x_np, y_np, ei = case
    got = {}
    for fuse in (False, True):
        monkeypatch.setattr(dask_backend, "FUSE", fuse)
        with pg.use_backend("dask"):
            x, y = pg.tensor(x_np), pg.tensor(y_np)
            adj = pg.from_edge_index(ei, x_np.shape[0], values=np.ones(ei.shape[1], dtype=x_np.dtype))
            outs = _step(x, y, adj)
            with np.errstate(all="ignore"):
                pg.materialize(*outs)
            got[fuse] = [_bits(o.numpy()) for o in outs]
    assert got[True] == got[False]


def test_fusion_cuts_the_tasks_of_a_step(client):
    """A step's elementwise chains on one row block run as one task each."""
    from dask.highlevelgraph import HighLevelGraph

    from polygrad_dask import fusion, sparse_kernels

    rng = np.random.default_rng(0)
    with pg.use_backend("dask"):
        x, y = pg.tensor(rng.normal(size=(40, 3))), pg.tensor(rng.normal(size=(40, 3)))
        ei = rng.integers(0, 40, size=(2, 120))
        outs = _step(x, y, pg.from_edge_index(ei, 40))
        arrays = [o._data for o in outs]
        table, everyone = polygrad_dask.cluster.row_table(arrays, 2, client)

        def default(k):
            return {"workers": table.get(k, everyone), "allow_other_workers": True}

        graph, keys = fusion.fused_graph(arrays, default)
        before = HighLevelGraph.merge(*(a.__dask_graph__() for a in arrays))
        placed = fusion.layer_annotations(graph)
    assert set(keys) <= set(dict(graph))  # the requested keys survive, ...
    assert all(placed[k] == default(k) for k in keys if k in table)  # ... placed on their row block's worker
    assert len(dict(graph)) < 0.7 * len(dict(before))  # the row blocks' chains: ~40% fewer tasks
    # the SpMMs' own tiles stay tasks of their own (they run while the halo rows travel)
    own = [k for k, node in dict(before).items() if getattr(node, "func", None) in sparse_kernels.KEEP_APART]
    assert own and all(getattr(dict(graph).get(k), "func", None) in sparse_kernels.KEEP_APART for k in own)


def _problem():
    rng = np.random.default_rng(2)
    n = 300
    h = n // 2
    ei = np.concatenate([rng.integers(0, h, (2, 6 * h)), rng.integers(h, n, (2, 6 * h)),
                         np.stack([rng.integers(0, h, 40), rng.integers(h, n, 40)])], axis=1)
    return ei, rng.normal(size=(n, 5)), rng.integers(0, 3, n)


def test_fit_fused_equals_fit_unfused(client, monkeypatch):
    """GCN training with fused submissions: numpy's losses, and the unfused run's losses and
    parameters."""
    ei, feats, labels = _problem()
    runs = {}
    for backend, fuse in (("numpy", True), ("dask", False), ("dask", True)):
        monkeypatch.setattr(dask_backend, "FUSE", fuse)
        with pg.use_backend(backend):
            pg.manual_seed(0)
            model = nn.GCN(feats.shape[1], 8, 2, 3, dropout=0.0, dtype=np.float64)
            opt = optim.Adam(model.parameters(), lr=0.02)
            x = pg.tensor(feats)
            history = fit(model, opt, lambda: nn.cross_entropy(model(x, ei), labels), 5, rollback_threshold=None)
            runs[(backend, fuse)] = (list(history.losses), [p.numpy() for p in model.parameters()])
    np.testing.assert_allclose(runs[("dask", True)][0], runs[("numpy", True)][0], rtol=1e-9)
    np.testing.assert_allclose(runs[("dask", True)][0], runs[("dask", False)][0], rtol=1e-13)
    for a, b in zip(runs[("dask", True)][1], runs[("dask", False)][1]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("seen, axis", [
    ({(0, 0), (1, 0)}, 0),             # a row-blocked array
    ({(0, 0), (0, 1)}, 1),             # its transpose
    ({(0, 0, 0), (0, 1, 0)}, 1),       # per-block products of a contraction over rows
    ({(0,), (1,)}, 0),                 # a row-blocked vector
    ({(0, 0), (0, 1), (1, 0), (1, 1)}, 0),  # first index over the blocks (as before)
    ({(0, 0, 0), (0, 1, 1)}, None),    # two indices vary
    ({(0, 0), (0, 2)}, None),          # values other than the blocks
    ({(0,)}, None),                    # one block
])
def test_which_index_is_the_row_block(seen, axis):
    from polygrad_dask.cluster import _row_axis

    assert _row_axis(seen, 2) == axis
