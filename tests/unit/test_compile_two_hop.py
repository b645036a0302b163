"""The two-hop row restriction (compile/two_hop.py) against eager: a pure replay of the GCN demo's
step that computes the first layer's products only over the training rows' 2-hop neighbourhood --
forward and fused backward -- gives eager's bits, on generated graphs, features, masks and dtypes,
with signed zeros, NaN, infinities and overflow injected into the features, the first weight and
the graph's weights (the replay's check then runs the call eagerly, with eager's bits)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.compile import Call
from polygrad.runtime.registry import registry
from polygrad.ir.ops import Op
from tests.helpers import assert_bitwise, observed

SPECIALS = {"inf": np.inf, "nan": np.nan, "-inf": -np.inf, "-0": -0.0, "huge": 1e30}


def _setup(c: dict):
    """(step, model, rows) for case ``c``: the GCN demo's model, optimizer and step on a random graph."""
    pg.manual_seed(c["seed"])
    rng = np.random.default_rng(c["seed"])
    n, f, k = c["nodes"], c["features"], c["classes"]
    dtype = np.float32 if c["float32"] else np.float64
    edges = max(1, int(c["degree"] * n))
    ei = rng.integers(0, n, (2, edges))
    dense = rng.random((n, f)) < c["density"]
    dense[np.arange(n), rng.integers(0, f, n)] = True  # every node has a feature
    indptr = np.concatenate([[0], np.cumsum(dense.sum(axis=1))])
    cols = np.nonzero(dense)[1]
    values = rng.uniform(0.05, 1.0, cols.shape[0])
    rows = np.flatnonzero(rng.random(n) < c["fraction"])
    if rows.size == 0:
        rows = np.array([n // 3])
    if c["x_special"] is not None:  # at a node whose rows eager computes and the replay may skip
        node = _far_nodes(ei, n, rows)[0] if c["far"] and _far_nodes(ei, n, rows).size else rng.integers(0, n)
        values[indptr[node]:indptr[node + 1]] = SPECIALS[c["x_special"]]
    x = pg.sparse_csr(indptr, cols, values, (n, f), dtype=dtype, allow_nonfinite=True)
    model = nn.GCN(f, c["hidden"], 2, k, dropout=c["dropout"], bias=c["bias"], dtype=dtype)
    if c["w_special"] is not None:
        w = np.array(model.conv1.weight.numpy(), copy=True)
        w[rng.integers(0, f), rng.integers(0, c["hidden"])] = SPECIALS[c["w_special"]]
        model.conv1.weight.data = pg.tensor(w, dtype=dtype)
    graph = ei
    if c["edge_special"] is not None:  # a weighted adjacency (GCNConv normalises it) holding a special value
        weight = rng.uniform(0.5, 2.0, edges)
        weight[rng.integers(0, edges)] = SPECIALS[c["edge_special"]]
        graph = pg.from_edge_index(ei, n, values=weight, dtype=dtype, allow_nonfinite=True)
    if c["rows"] == "unsorted":
        rows = rows[::-1].copy()
    elif c["rows"] == "repeated":
        rows = np.concatenate([rows, rows[:1]])
    y = rng.integers(0, k, rows.size)
    opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                      {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=0.01)

    def step():  # the demo's loss_fn inside fit's step: zero_grad, forward, backward, Adam
        opt.zero_grad()
        logits = model(x, graph)[rows]
        loss = nn.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        return loss, {"train_logits": logits}

    step.features = x  # type: ignore[attr-defined]
    return step, model, rows


def _far_nodes(ei: np.ndarray, n: int, rows: np.ndarray) -> np.ndarray:
    """The nodes outside the 2-hop neighbourhood of ``rows`` (GCN: row i of Â reads the sources of
    the edges into i, and i itself)."""
    near = np.zeros(n, dtype=bool)
    near[rows] = True
    for _ in range(2):
        near[ei[0][near[ei[1]]]] = True
    return np.flatnonzero(~near)


def _run(c: dict, compiled: bool, calls: int = 5):
    step, model, rows = _setup(c)
    f = pg.compile(step, pure=True) if compiled else step
    seen = []
    with np.errstate(all="ignore"):
        for _ in range(calls):
            loss, metrics = f()
            seen.append([observed(loss), observed(metrics["train_logits"]), observed(list(model.parameters()))])
    return seen, f


def _two_hop_fired(f) -> bool:
    return any(isinstance(e, Call) and e.fn.__name__ == "_two_hop_bound"
               for entry in f._cache.values() if entry.capture is not None for e in entry.capture.program)


cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "nodes": st.integers(10, 120),
    "degree": st.sampled_from([0.3, 0.7, 1.0, 2.0, 4.0]),
    "features": st.integers(2, 12),
    "density": st.sampled_from([0.1, 0.3, 0.6]),
    "hidden": st.integers(1, 6),
    "classes": st.integers(2, 4),
    "dropout": st.sampled_from([0.0, 0.5]),
    "bias": st.booleans(),
    "fraction": st.sampled_from([0.02, 0.05, 0.1, 0.3, 0.95]),
    "rows": st.sampled_from(["sorted", "sorted", "sorted", "unsorted", "repeated"]),
    "float32": st.booleans(),
    "x_special": st.sampled_from([None, None, None, "inf", "nan", "-0", "huge"]),
    "far": st.booleans(),
    "w_special": st.sampled_from([None, None, None, "inf", "nan", "-0", "huge"]),
    "edge_special": st.sampled_from([None, None, None, None, "inf", "nan", "huge"]),
})


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_two_hop_replay_equals_eager_bit_for_bit(c):
    (want, _), (got, f) = _run(c, False), _run(c, True)
    assert_bitwise(got, want)
    rows = _setup(c)[2]
    if not bool((np.diff(rows) > 0).all()):  # the row gather refuses such rows, and so nothing is pushed back
        assert not _two_hop_fired(f)


def _cora_like(seed: int = 0, float32: bool = True) -> dict:
    """A sparse, low-degree graph with few training rows: the shape of Cora's step."""
    return {"seed": seed, "nodes": 300, "degree": 1.5, "features": 60, "density": 0.03, "hidden": 8, "classes": 4,
            "dropout": 0.5, "bias": True, "fraction": 0.03, "rows": "sorted", "float32": float32, "x_special": None,
            "far": False, "w_special": None, "edge_special": None}


@pytest.mark.parametrize("float32", [True, False])
@pytest.mark.parametrize("variant", ["demo", "no_dropout", "no_bias"])
def test_two_hop_fires_on_a_cora_like_step_and_keeps_bits(float32, variant):
    c = _cora_like(float32=float32)
    c.update({"no_dropout": {"dropout": 0.0}, "no_bias": {"bias": False}}.get(variant, {}))
    (want, _), (got, f) = _run(c, False, calls=6), _run(c, True, calls=6)
    assert_bitwise(got, want)
    assert _two_hop_fired(f)
    assert f.stats["replays"] >= 2 and f.stats["dropped"] == 0  # the check passes: the replays ran rewritten


def test_the_kernels_run_only_the_two_hop_rows(monkeypatch):
    """Count the rows of the SpMMs a replay actually runs: the features' product runs over the
    2-hop rows only, the first propagation over the 1-hop rows only."""
    c = _cora_like(seed=3)
    step, model, rows = _setup(c)
    f = pg.compile(step, pure=True)
    for _ in range(3):
        f()
    assert _two_hop_fired(f)
    seen: list[tuple] = []
    fwd, bwd = registry.tables["numpy"][(Op.SPMM, "csr")], registry.vjp_tables["numpy"][(Op.SPMM, "csr")]

    def spmm(values, x, *, pattern):
        seen.append(("fwd", pattern.shape, int(np.count_nonzero(np.diff(pattern.indptr)))))
        return fwd(values, x, pattern=pattern)

    def spmm_vjp(g, values, x, *, needs, pattern):
        seen.append(("bwd", pattern.shape, int(np.count_nonzero(np.diff(pattern.indptr)))))
        return bwd(g, values, x, needs=needs, pattern=pattern)

    monkeypatch.setitem(registry.tables["numpy"], (Op.SPMM, "csr"), spmm)
    monkeypatch.setitem(registry.vjp_tables["numpy"], (Op.SPMM, "csr"), spmm_vjp)
    before = f.stats["replays"]
    f()
    assert f.stats["replays"] == before + 1
    adj = model.conv1.adjacency(_graph(c), c["nodes"])
    pattern = adj.pattern
    n1 = np.unique(pattern.take_rows(rows)[0].cols)
    n2 = np.unique(pattern.take_rows(n1)[0].cols)
    assert n2.size < c["nodes"]  # the case is meant to have something to skip
    features = [s for s in seen if s[1][1] == c["features"]]
    assert [s[0] for s in features] == ["fwd", "bwd"]
    assert all(s[1][0] == n2.size for s in features)  # |N2| rows of the features, forward and backward
    first = [s for s in seen if s[1] == (c["nodes"], n2.size)]
    assert [s[0] for s in first] == ["fwd", "bwd"]
    assert all(s[2] <= n1.size for s in first)  # only the 1-hop rows hold entries


def _graph(c: dict) -> np.ndarray:
    return np.random.default_rng(c["seed"]).integers(0, c["nodes"], (2, max(1, int(c["degree"] * c["nodes"]))))


@pytest.mark.parametrize("where", ["x_inf", "x_huge", "w1_inf", "w1_huge", "w2_nan"])
def test_a_non_finite_value_after_capture_runs_the_call_eagerly_with_eagers_bits(where):
    """A value set after the capture that makes eager's skipped rows non-finite (an infinity in the
    features or the first weight, values that overflow only there, a NaN in the second weight):
    the replay's check faults, the call runs eagerly (with the same dropout draws), and the
    numbers are eager's."""
    c = _cora_like(seed=5)

    def run(compiled: bool):
        step, model, rows = _setup(c)
        f = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for call in range(6):
                if call == 3:
                    _spoil(where, step, model, rows)
                loss, metrics = f()
                seen.append([observed(loss), observed(metrics["train_logits"]), observed(list(model.parameters()))])
        return seen, f

    (want, _), (got, f) = run(False), run(True)
    assert_bitwise(got, want)
    assert f.stats["dropped"] >= 1


def _far_node(model, step, rows: np.ndarray) -> int:
    """A node outside the training rows' 2-hop neighbourhood (eager computes it, the replay skips it)."""
    pattern = model.conv1._cache.pattern
    n1 = np.unique(pattern.take_rows(rows)[0].cols)
    n2 = np.unique(pattern.take_rows(n1)[0].cols)
    far = np.setdiff1d(np.arange(pattern.shape[0]), n2)
    assert far.size
    return int(far[0])


def _spoil(where: str, step, model, rows: np.ndarray) -> None:
    x = step.features
    if where.startswith("x"):
        node = _far_node(model, step, rows)
        values = np.array(x.values.numpy(), copy=True)
        lo, hi = x.pattern.indptr[node], x.pattern.indptr[node + 1]
        values[lo:hi] = np.inf if where == "x_inf" else np.finfo(values.dtype).max  # x 2 by dropout: inf
        x.values.data = pg.tensor(values, dtype=values.dtype)
    elif where.startswith("w1"):
        node = _far_node(model, step, rows)
        w = np.array(model.conv1.weight.numpy(), copy=True)
        col = x.pattern.cols[x.pattern.indptr[node]]  # a feature of the far node
        w[col, :] = np.inf if where == "w1_inf" else np.finfo(w.dtype).max / 4
        model.conv1.weight.data = pg.tensor(w, dtype=w.dtype)
    else:
        w = np.array(model.conv2.weight.numpy(), copy=True)
        w[0, 0] = np.nan
        model.conv2.weight.data = pg.tensor(w, dtype=w.dtype)


def test_a_nan_bias_after_a_step_keeps_eagers_nan_bits():
    """Found by the generator: an infinite first weight makes the gradients, and after the first step
    the second layer's bias, NaN; the row gather's short bias add could then keep the other
    operand's NaN than eager's full-length add (numpy's vector body and scalar tail differ).  The
    replay checks the bias and runs such calls eagerly."""
    c = {"seed": 0, "nodes": 18, "degree": 4.0, "features": 3, "density": 0.1, "hidden": 1, "classes": 2,
         "dropout": 0.0, "bias": True, "fraction": 0.3, "rows": "sorted", "float32": True, "x_special": None,
         "far": False, "w_special": "inf", "edge_special": None}
    (want, _), (got, f) = _run(c, False), _run(c, True)
    assert_bitwise(got, want)
    assert f.stats["dropped"] >= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spoil", [None, "xd_nan", "w1_inf", "av_nan", "b1_inf", "m2_negzero", "m2_neg", "w2_nan",
                                   "zero_neg", "overflow", "m2_nan", "m2_negnan", "m2_inf", "m2_huge",
                                   "m2_fortran_negzero", "m2_strided_neg", "m2_one_negzero", "m2_fortran_clean",
                                   "m2_strided_clean"])
@pytest.mark.parametrize("namespace", ["numpy", "array_api_strict"])
def test_the_bound_check_and_its_array_api_form_decide_alike(dtype, spoil, namespace):
    """The replay's check (numpy's form and the one written against the array namespace, for a
    backend that traces it) passes finite inputs of moderate size, and fails on any non-finite
    value, a mask with a sign bit, a ``-0`` constant, or a bound past the dtype's range."""
    from polygrad.compile.two_hop import _two_hop_bound, _two_hop_bound_generic

    rng = np.random.default_rng(0)
    xd, w1, av = rng.random(50).astype(dtype), rng.normal(size=(6, 3)).astype(dtype), rng.random(40).astype(dtype)
    b1, w2 = rng.normal(size=3).astype(dtype), rng.normal(size=(3, 2)).astype(dtype)
    m2 = (rng.random((9, 3)) < 0.5).astype(dtype) * 2
    zero = np.asarray(0.0, dtype=dtype)
    if spoil == "xd_nan":
        xd[7] = np.nan
    elif spoil == "w1_inf":
        w1[1, 2] = -np.inf
    elif spoil == "av_nan":
        av[0] = np.nan
    elif spoil == "b1_inf":
        b1[0] = np.inf
    elif spoil == "m2_negzero":
        m2[m2 == 0] = -0.0
    elif spoil == "m2_neg":
        m2[0, 0] = -2.0
    elif spoil in ("m2_nan", "m2_negnan"):
        m2[4, 1] = np.nan if spoil == "m2_nan" else -np.nan
    elif spoil == "m2_inf":
        m2[8, 2] = np.inf
    elif spoil == "m2_huge":  # finite, but the bound passes the dtype's range
        m2[2, 2] = np.finfo(dtype).max / 2
    elif spoil == "m2_fortran_negzero":
        m2 = np.asfortranarray(m2)
        m2[3, 0] = -0.0
    elif spoil == "m2_strided_neg":
        m2 = np.repeat(m2, 2, axis=1)[:, ::2]
        m2[5, 1] = -2.0
    elif spoil == "m2_one_negzero":  # the last element only: a max over the bits must see it
        m2[-1, -1] = -0.0
    elif spoil == "m2_fortran_clean":
        m2 = np.asfortranarray(m2)
    elif spoil == "m2_strided_clean":
        m2 = np.repeat(m2, 2, axis=1)[:, ::2]
    elif spoil == "w2_nan":
        w2[0, 1] = np.nan
    elif spoil == "zero_neg":
        zero = np.asarray(-0.0, dtype=dtype)
    elif spoil == "overflow":
        xd[3] = np.finfo(dtype).max / 10
    passes = spoil is None or spoil.endswith("_clean")
    limit = float(np.finfo(dtype).max)
    kw = {"rx": 5, "ra": 4, "limit": limit}
    if namespace == "array_api_strict":  # the form a non-numpy backend runs, on a strict namespace
        xp = pytest.importorskip("array_api_strict")
        with np.errstate(all="ignore"):  # the strict namespace computes on numpy
            (strict,) = _two_hop_bound(*[xp.asarray(np.ascontiguousarray(a)) for a in (xd, w1, av, b1, m2, w2, zero)],
                                       bias=True, mask=True, **kw)
        assert strict.dtype == xp.asarray(w1).dtype and strict.shape == ()
        assert bool(xp.isfinite(strict)) == passes
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the replay's check warns of nothing (an overflow is its answer)
        (fast,) = _two_hop_bound(xd, w1, av, b1, m2, w2, zero, bias=True, mask=True, **kw)
    with np.errstate(all="ignore"):
        (generic,) = _two_hop_bound_generic(xd, w1, av, b1, m2, w2, zero, **kw)
    assert fast.dtype == generic.dtype == dtype and fast.shape == generic.shape == ()
    assert bool(np.isfinite(fast)) == bool(np.isfinite(generic)) == passes


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 30), st.integers(1, 30), st.floats(0.05, 0.6))
def test_pattern_restrict_keeps_rows_empties_the_rest_and_renumbers_columns(seed, n, m, density):
    from polygrad.sparse.pattern import Pattern

    rng = np.random.default_rng(seed)
    dense = rng.random((n, m)) < density
    r, k = np.nonzero(dense)
    pattern = Pattern.from_sorted((n, m), r, k)
    rows = np.flatnonzero(rng.random(n) < 0.5)
    cols = np.unique(np.concatenate([pattern.take_rows(rows)[0].cols, rng.integers(0, m, 2)]))
    out, positions = pattern.restrict(rows, cols)
    values = np.arange(1, pattern.nnz + 1, dtype=np.float64)
    want = np.zeros((n, m))
    want[r, k] = values
    keep = np.zeros(n, dtype=bool)
    keep[rows] = True
    want[~keep] = 0
    got = np.zeros((n, cols.size))
    got[out.rows, out.cols] = values[positions]
    assert out.shape == (n, cols.size)
    assert np.array_equal(got, want[:, cols])
    assert (np.diff(out.cols)[np.diff(out.rows) == 0] > 0).all()  # each row's columns still ascending
    again = pattern.restrict(rows.copy(), cols.copy())
    assert again[0] is out and again[1] is positions  # cached per content


def test_a_large_feature_gather_reads_through_a_mask_with_the_same_bits():
    """The features' gather (most of their values) runs as a boolean mask on numpy arrays: the
    replay still gives eager's bits, and the mask picks exactly the positions, in order."""
    from polygrad.compile import two_hop

    c = _cora_like(seed=2)
    c.update(density=0.2, fraction=0.1, degree=2.0)  # the 2-hop rows hold most of the features' values
    (want, _), (got, f) = _run(c, False, calls=6), _run(c, True, calls=6)
    assert_bitwise(got, want)
    assert f.stats["replays"] >= 2 and f.stats["dropped"] == 0
    indices = [e[4]["index"][0] for entry in f._cache.values() if entry.capture is not None
               for e in entry.capture.program if e[0] == 3 and e[2] == (Op.GETITEM, "dense")]
    assert any(i.dtype == bool for i in indices)
    rng = np.random.default_rng(0)
    values = rng.standard_normal(50).view(np.int64)
    values[[3, 7]] = [0x7FF8000000000123, -0x0008000000000456]  # NaNs with payloads, both signs
    values = values.view(np.float64)
    be = pg.tensor(np.zeros(1))._be
    for size in (30, 45):
        positions = np.sort(rng.choice(50, size, replace=False))
        index = two_hop._gather_index(be, positions, 50)
        assert index.dtype == bool and not index.flags.writeable
        assert values[index].tobytes() == values[positions].tobytes()

    class Elsewhere:  # a backend whose arrays are not numpy's keeps the positions
        def from_numpy(self, a):
            return list(a)

    assert two_hop._gather_index(Elsewhere(), positions, 50) is positions
    few = positions[:10]
    assert two_hop._gather_index(be, few, 50) is few
