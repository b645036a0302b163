"""``Op.CROSS_ENTROPY`` and ``Op.SOFT_CROSS_ENTROPY`` on dask (``polygrad_dask.loss_kernels``)
against the composite they replace on dask, bit for bit: loss and gradients for generated logits
(NaN, infinities, -0.0, huge values, one class), float32 and float64 (float16: the dask kernels'
path), 1-4 (soft: 1-6) row blocks of uneven sizes, every reduction, zero and NaN upstream
gradients; and a GCN trained on the dask backend with and without the fused op ends with the
same parameter bytes.

The composite is what the backend ran before the op had a kernel: :func:`composite_cross_entropy`
takes the kernel and its fused backward out of the registry's tables for the block, so
``pg.cross_entropy`` decides on the composite exactly as it did then.
"""
from __future__ import annotations

import contextlib
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
from polygrad.ir.ops import Op  # noqa: E402
from polygrad.runtime.registry import registry  # noqa: E402

KEY = (Op.CROSS_ENTROPY, "dense")
SOFT_KEY = (Op.SOFT_CROSS_ENTROPY, "dense")
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38, 1e-45]


@pytest.fixture(scope="module")
def dask_cluster():
    """Two worker processes (payloads and layouts cross process boundaries as in real runs);
    tiny arrays still get several row blocks."""
    from distributed import Client, LocalCluster

    from polygrad.testing.temporary import temporary_plugin

    with contextlib.ExitStack() as stack:
        if "dask" not in pg.list_backends():
            stack.enter_context(temporary_plugin(polygrad_dask, "dask"))
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                               scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
        client = Client(cluster, set_as_default=True, timeout=120)
        saved = polygrad_dask.chunks.partitions, polygrad_dask.chunks.min_block_rows
        polygrad_dask.chunks.min_block_rows = 1
        try:
            yield client
        finally:
            polygrad_dask.chunks.set_partitions(saved[0])
            polygrad_dask.chunks.min_block_rows = saved[1]
            client.close()
            cluster.close()


@contextlib.contextmanager
def composite_cross_entropy(key: tuple = KEY):
    """The dask backend without a cross-entropy op's kernels: ``pg.cross_entropy`` runs the
    composite (the decision reads the forward table), backward by the composite's rules."""
    forward = registry.tables["dask"].pop(key)
    backward = registry.vjp_tables["dask"].pop(key)
    try:
        yield
    finally:
        registry.tables["dask"][key] = forward
        registry.vjp_tables["dask"][key] = backward


def _loss_and_grad(x: np.ndarray, target: np.ndarray, reduction: str, g: float) -> tuple:
    """(loss bytes, logits gradient bytes, the loss's dask chunks) with upstream gradient ``g``."""
    with pg.use_backend("dask"):
        logits = pg.tensor(x, requires_grad=True)
        loss = nn.cross_entropy(logits, target, reduction=reduction)
        seed = np.full(loss.shape, g, dtype=x.dtype)
        loss.backward(pg.tensor(seed))
        return loss.numpy().tobytes(), logits.grad.numpy().tobytes(), loss._data.chunks


@st.composite
def problems(draw):
    n, c = draw(st.integers(1, 23)), draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c)) * draw(st.sampled_from([1.0, 40.0, 1e5]))
    if draw(st.booleans()):  # specials sprinkled in (a row whose max is inf or NaN turns NaN)
        hit = rng.random((n, c)) < 0.15
        x[hit] = rng.choice(SPECIALS, int(hit.sum()))
    with np.errstate(over="ignore"):  # 1e5 * N(0,1) past float16's range: infinities, on purpose
        x = x.astype(dtype)
    if draw(st.booleans()):  # a NaN with a payload and its sign bit set
        bits = x.view(np.uint32 if dtype == np.float32 else np.uint64 if dtype == np.float64 else np.uint16)
        bits.flat[draw(st.integers(0, x.size - 1))] = {np.float32: 0xFFC01234, np.float64: 0xFFF8000000001234,
                                                       np.float16: 0xFE12}[dtype]
    target = rng.integers(0, c, n)
    return x, target


@pytest.mark.usefixtures("dask_cluster")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems(), partitions=st.integers(1, 4), reduction=st.sampled_from(["mean", "sum", "none"]),
       g=st.sampled_from([1.0, 0.0, -0.0, 2.5, np.nan]))
def test_fused_cross_entropy_is_the_composite_bit_for_bit(problem, partitions, reduction, g):
    x, target = problem
    polygrad_dask.chunks.set_partitions(partitions)
    fused = _loss_and_grad(x, target, reduction, g)
    with composite_cross_entropy():
        composite = _loss_and_grad(x, target, reduction, g)
    assert fused == composite


@pytest.mark.usefixtures("dask_cluster")
def test_losses_keep_the_composite_chunks_across_several_vindex_chunks():
    """One class and 3 row blocks: the composite's ``vindex`` gives the losses blocks of
    ``max(rows) * C`` points, not the row blocks; "none" keeps them and "sum" reduces over them."""
    polygrad_dask.chunks.set_partitions(3)
    x = np.random.default_rng(1).standard_normal((10, 1)).astype(np.float32) * 1e4
    target = np.zeros(10, dtype=np.int64)
    for reduction in ("none", "sum", "mean"):
        fused = _loss_and_grad(x, target, reduction, 1.0)
        with composite_cross_entropy():
            composite = _loss_and_grad(x, target, reduction, 1.0)
        assert fused == composite
    assert fused[2] == ()  # the scalar; "none" was compared with its chunks (4, 4, 2) above
    assert polygrad_dask.loss_kernels.vindex_chunks(pg.tensor(x, backend="dask")._data) == ((4, 4, 2),)


@pytest.mark.usefixtures("dask_cluster")
def test_the_fused_op_runs_one_task_per_row_block():
    """What the kernel is for: the loss of 4 row blocks is 4 block tasks, the 4 tiny tasks that
    hand their losses on, and one total (the composite builds dozens); its backward one task per
    block, which reads the block's forward (its exponentials) instead of recomputing it."""
    from dask.core import get_dependencies

    polygrad_dask.chunks.set_partitions(4)
    x = np.random.default_rng(2).standard_normal((40, 4))  # 4 classes: the losses are one vindex chunk
    with pg.use_backend("dask"):
        logits = pg.tensor(x, requires_grad=True)
        loss = nn.cross_entropy(logits, np.arange(40) % 4)
        assert len(loss._data.__dask_graph__()) - len(logits._data.__dask_graph__()) == 9
        forwards = {k for k in loss._data.__dask_graph__() if isinstance(k, tuple) and "forward" in k[0]}
        assert len(forwards) == 4
        loss.backward()
        grad_graph = logits.grad._data.__dask_graph__()
        grads = [k for k in grad_graph if isinstance(k, tuple) and "cross-entropy-grad" in k[0]]
        assert len(grads) == 4
        plain = dict(grad_graph)
        assert all(len(set(get_dependencies(plain, k)) & forwards) == 1 for k in grads)
        with composite_cross_entropy():
            slow = nn.cross_entropy(logits, np.arange(40) % 4)
        assert len(slow._data.__dask_graph__()) - len(logits._data.__dask_graph__()) > 30


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_no_rows_gives_numpys_loss(reduction):
    """No rows: the composite fails on dask (its ``vindex`` of nothing); the op gives numpy's
    loss and an empty gradient, with no fallback."""
    x, target = np.zeros((0, 3), dtype=np.float32), np.zeros(0, dtype=np.int64)
    want = nn.cross_entropy(pg.tensor(x, backend="numpy"), target, reduction=reduction).numpy()
    with pg.use_backend("dask"):
        pg.reset_stats()
        logits = pg.tensor(x, requires_grad=True)
        loss = nn.cross_entropy(logits, target, reduction=reduction)
        loss.sum().backward()
        assert loss.numpy().tobytes() == want.tobytes() and loss.dtype == want.dtype
        assert logits.grad.shape == (0, 3)
        assert pg.stats()["fallbacks_total"] == 0


def _train_gcn(partitions: int, soft: bool = False) -> bytes:
    """Parameter bytes after a few Adam steps of a two-layer GCN on a small random graph (dask):
    61 rows in ``partitions`` row blocks, the 3-class bias and logits' columns whole (blocks of at
    least 4 rows), as in a real run, so the fused loss serves."""
    polygrad_dask.chunks.set_partitions(partitions)
    polygrad_dask.chunks.min_block_rows = 4
    rng = np.random.default_rng(5)
    n = 61  # uneven row blocks
    edges = rng.integers(0, n, (2, 300))
    with pg.use_backend("dask"):
        adj = pg.gcn_norm(pg.from_edge_index(edges, n))
        x = pg.tensor(rng.standard_normal((n, 6)).astype(np.float32))
        target = rng.integers(0, 3, n)
        if soft:  # one-hot probabilities, made on the backend in its row blocks
            target = pg.tensor(np.eye(3, dtype=np.float32)[target])
        pg.manual_seed(0)
        conv1, conv2 = nn.GCNConv(6, 8, normalize=False), nn.GCNConv(8, 3, normalize=False)

        class Two(nn.Module):
            def __init__(self):
                self.conv1, self.conv2 = conv1, conv2

            def forward(self):
                return conv2.propagate(conv1.propagate(x, adj).relu(), adj)

        model = Two()
        opt = optim.Adam(model.parameters(), lr=0.05)
        fit(model, opt, lambda: nn.cross_entropy(model(), target), 3, rollback_threshold=None)
        return b"".join(p.numpy().tobytes() for p in model.parameters())


@pytest.fixture
def served(monkeypatch) -> list:
    """The prefixes of the per-block arrays ``loss_kernels`` builds (which fused path served)."""
    from polygrad_dask import loss_kernels

    names: list = []
    stacked = loss_kernels._stacked

    def counted(prefix, *args, **kwargs):
        names.append(prefix)
        return stacked(prefix, *args, **kwargs)

    monkeypatch.setattr(loss_kernels, "_stacked", counted)
    return names


@pytest.mark.usefixtures("dask_cluster")
def test_gcn_training_with_the_fused_loss_gives_the_same_parameters(served):
    try:
        fused = _train_gcn(3)
        assert served.count("cross-entropy-rows") == 3 and served.count("cross-entropy-grad") == 3, served
        with composite_cross_entropy():
            composite = _train_gcn(3)
    finally:
        polygrad_dask.chunks.min_block_rows = 1
    assert fused == composite


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("rows", [None, (3000, 4000), (1000, 3000, 3000)])
def test_logits_in_other_row_blocks_get_the_composites_gradient_chunks(rows):
    """Logits whose row blocks are not the backend's own (``from_backend`` with the caller's
    chunks): the composite builds their gradient in the backend's row blocks, and a later
    reduction over rows (a weight gradient ``x.T @ g``) sums over those blocks, so the chunks are
    part of the bits.  The op serves only logits in the backend's own blocks (``accepts``); the
    others run the composite: loss, gradient bytes and gradient chunks the composite's."""
    import dask.array as da

    from polygrad_dask import loss_kernels

    polygrad_dask.chunks.set_partitions(4)
    rng = np.random.default_rng(3)
    n, c = 7000, 8
    x = rng.standard_normal((n, c)).astype(np.float32)
    target = rng.integers(0, c, n)
    chunks = (polygrad_dask.chunks.row_chunks(n) if rows is None else rows, (c,))
    assert loss_kernels._accepts(da.from_array(x, chunks=chunks)) == (rows is None)

    def run() -> tuple:
        with pg.use_backend("dask"):
            logits = pg.Tensor.from_backend(da.from_array(x, chunks=chunks), "dask", requires_grad=True)
            loss = nn.cross_entropy(logits, target)
            loss.backward()
            return loss.numpy().tobytes(), logits.grad.numpy().tobytes(), logits.grad._data.chunks

    fused = run()
    with composite_cross_entropy():
        composite = run()
    assert fused == composite


@pytest.mark.parametrize("keepdims", [True, False])
def test_row_max_of_no_rows_is_empty(keepdims):
    """The max of each of no rows (the loss's shift on no logits, the rule's recomputation): numpy's
    empty result; dask's own max turned the empty block into one its aggregate could not reduce."""
    from polygrad_dask import dense_kernels

    x = np.zeros((0, 3), dtype=np.float32)
    got = dense_kernels.reduce_max(pg.tensor(x, backend="dask")._data, axes=(1,), keepdims=keepdims)
    want = np.max(x, axis=1, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.compute(scheduler="sync").shape == want.shape


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_rows_sum_pairwise_as_the_composite(dtype):
    """3,001 rows in 3 blocks: the loss's sum runs numpy's pairwise blocks (128 and up) over the
    whole vector as the composite's one vindex chunk does; the bench's shape (8 classes)."""
    polygrad_dask.chunks.set_partitions(3)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3001, 8)) * 30).astype(dtype)
    target = rng.integers(0, 8, 3001)
    for reduction in ("mean", "sum"):
        fused = _loss_and_grad(x, target, reduction, 1.0)
        with composite_cross_entropy():
            composite = _loss_and_grad(x, target, reduction, 1.0)
        assert fused == composite


# -- class probabilities: Op.SOFT_CROSS_ENTROPY ------------------------------------------------------

def _soft_loss_and_grads(x: np.ndarray, probs: np.ndarray, reduction: str, g: float, probs_grad: bool,
                         chunks: tuple | None = None) -> tuple:
    """(loss bytes, logits gradient bytes and chunks, probabilities gradient bytes, the loss's
    chunks, the op the loss came from); ``chunks``: the arrays' own (``from_backend``)."""
    import dask.array as da

    with pg.use_backend("dask"):
        if chunks is None:
            logits, target = pg.tensor(x, requires_grad=True), pg.tensor(probs, requires_grad=probs_grad)
        else:
            logits = pg.Tensor.from_backend(da.from_array(x, chunks=chunks), "dask", requires_grad=True)
            target = pg.Tensor.from_backend(da.from_array(probs, chunks=chunks), "dask", requires_grad=probs_grad)
        loss = nn.cross_entropy(logits, target, reduction=reduction)
        loss.backward(pg.tensor(np.full(loss.shape, g, dtype=x.dtype)))
        dprobs = target.grad.numpy().tobytes() if probs_grad else None
        return (loss.numpy().tobytes(), logits.grad.numpy().tobytes(), logits.grad._data.chunks, dprobs,
                loss._data.chunks, loss._node.op)


@st.composite
def soft_problems(draw):
    x, _ = draw(problems())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(["one-hot", "dirichlet", "any"]))
    n, c = x.shape
    if kind == "one-hot":
        probs = np.eye(c)[rng.integers(0, c, n)]
    elif kind == "dirichlet":
        probs = rng.dirichlet(np.ones(c), size=n)
    else:  # PyTorch takes any numbers; specials too
        probs = rng.standard_normal((n, c)) * 3
        hit = rng.random((n, c)) < 0.1
        probs[hit] = rng.choice(SPECIALS, int(hit.sum()))
    with np.errstate(over="ignore"):
        return x, probs.astype(x.dtype)


@pytest.mark.usefixtures("dask_cluster")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=soft_problems(), partitions=st.integers(1, 6), reduction=st.sampled_from(["mean", "sum", "none"]),
       g=st.sampled_from([1.0, 0.0, -0.0, 2.5, np.nan]), probs_grad=st.booleans())
def test_fused_soft_cross_entropy_is_the_composite_bit_for_bit(problem, partitions, reduction, g, probs_grad):
    """Up to 6 row blocks: over 4 (dask's default ``split_every``) the sum goes through dask's own tree."""
    x, probs = problem
    polygrad_dask.chunks.set_partitions(partitions)
    fused = _soft_loss_and_grads(x, probs, reduction, g, probs_grad)
    with composite_cross_entropy(SOFT_KEY):
        composite = _soft_loss_and_grads(x, probs, reduction, g, probs_grad)
    # float16 logits are not the per-block path's: they run the composite itself (``accepts``)
    assert (fused[-1] == Op.SOFT_CROSS_ENTROPY) == (x.dtype != np.float16)
    assert composite[-1] != Op.SOFT_CROSS_ENTROPY
    assert fused[:-1] == composite[:-1]


@pytest.mark.usefixtures("dask_cluster")
def test_the_fused_soft_op_runs_a_task_per_row_block():
    """2 row blocks: the loss is 2 block tasks, their 2 partial sums and one total (the composite
    builds about 25), its backward one task per block (only the logits take a gradient), which
    reads the block's forward (its exponentials) instead of recomputing it."""
    from dask.core import get_dependencies
    polygrad_dask.chunks.set_partitions(2)
    rng = np.random.default_rng(2)
    x, probs = rng.standard_normal((40, 4)), np.eye(4)[np.arange(40) % 4]
    with pg.use_backend("dask"):
        logits, target = pg.tensor(x, requires_grad=True), pg.tensor(probs)
        base = len(logits._data.__dask_graph__()) + len(target._data.__dask_graph__())
        loss = nn.cross_entropy(logits, target)
        assert loss._node.op == Op.SOFT_CROSS_ENTROPY
        assert len(loss._data.__dask_graph__()) - base == 5
        forwards = {k for k in loss._data.__dask_graph__() if isinstance(k, tuple) and "forward" in k[0]}
        assert len(forwards) == 2
        loss.backward()
        grad_graph = logits.grad._data.__dask_graph__()
        grads = [k for k in grad_graph if isinstance(k, tuple) and "soft-cross-entropy-grad" in k[0]]
        assert len(grads) == 2
        plain = dict(grad_graph)
        assert all(len(set(get_dependencies(plain, k)) & forwards) == 1 for k in grads)
        with composite_cross_entropy(SOFT_KEY):
            slow = nn.cross_entropy(logits, target)
        assert len(slow._data.__dask_graph__()) - base > 15


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("rows", [None, (3000, 4000), (1000, 3000, 3000)])
def test_soft_targets_in_other_row_blocks_run_the_composite(rows):
    """Arrays in row blocks that are not the backend's own: the composite's chunks are part of the
    bits (a later ``x.T @ g``), so the op serves only the backend's blocks (``accepts``)."""
    import dask.array as da

    from polygrad_dask import loss_kernels

    polygrad_dask.chunks.set_partitions(4)
    rng = np.random.default_rng(3)
    n, c = 7000, 8
    x = rng.standard_normal((n, c)).astype(np.float32)
    probs = np.eye(c, dtype=np.float32)[rng.integers(0, c, n)]
    chunks = (polygrad_dask.chunks.row_chunks(n) if rows is None else rows, (c,))
    own = da.from_array(x, chunks=(polygrad_dask.chunks.row_chunks(n), (c,)))
    assert loss_kernels._accepts_pair(da.from_array(x, chunks=chunks), da.from_array(probs, chunks=chunks)) == (
        rows is None)
    assert not loss_kernels._accepts_pair(own, da.from_array(probs, chunks=(rows or (7000,), (c,))))
    fused = _soft_loss_and_grads(x, probs, "mean", 1.0, True, chunks)
    with composite_cross_entropy(SOFT_KEY):
        composite = _soft_loss_and_grads(x, probs, "mean", 1.0, True, chunks)
    assert fused[:-1] == composite[:-1]
    assert (fused[-1] == Op.SOFT_CROSS_ENTROPY) == (rows is None)


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_loss_of_no_rows_gives_numpys_loss(reduction):
    x = np.zeros((0, 3), dtype=np.float32)
    want = nn.cross_entropy(pg.tensor(x, backend="numpy"), pg.tensor(x, backend="numpy"), reduction=reduction)
    with pg.use_backend("dask"):
        pg.reset_stats()
        logits, target = pg.tensor(x, requires_grad=True), pg.tensor(x, requires_grad=True)
        loss = nn.cross_entropy(logits, target, reduction=reduction)
        loss.sum().backward()
        assert loss.numpy().tobytes() == want.numpy().tobytes() and loss.dtype == want.dtype
        assert logits.grad.shape == (0, 3) and target.grad.shape == (0, 3)
        assert pg.stats()["fallbacks_total"] == 0


def _forward_key(logits: pg.Tensor, target: pg.Tensor | np.ndarray) -> tuple:
    """The ``loss_kernels._FORWARDS`` entry of ``logits``' loss at ``target`` (classes or probabilities)."""
    from polygrad_dask import loss_kernels

    if isinstance(target, np.ndarray):
        return loss_kernels._classes_key(logits._data)
    return loss_kernels._soft_key(logits._data, target._data)


def _targets(soft: bool, n: int = 40, c: int = 4) -> pg.Tensor | np.ndarray:
    classes = np.arange(n) % c
    return pg.tensor(np.eye(c)[classes]) if soft else classes


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("soft", [True, False])
def test_a_backward_whose_forward_is_no_longer_kept_recomputes_it_with_the_same_bits(soft):
    """The backward finds its forward's tasks by the arrays' names among the latest
    ``FORWARDS_KEPT`` losses; past them (or after the forward's results were released: the loss
    read first) it recomputes the exponentials: the composite's bits either way."""
    from polygrad_dask import loss_kernels

    polygrad_dask.chunks.set_partitions(2)
    x = np.random.default_rng(5).standard_normal((40, 4))

    def run(evict: bool, read_first: bool) -> tuple:
        with pg.use_backend("dask"):
            logits, target = pg.tensor(x, requires_grad=True), _targets(soft)
            loss = nn.cross_entropy(logits, target)
            others = []   # losses kept alive: their entries push the first one out
            if evict:
                for k in range(loss_kernels.FORWARDS_KEPT):
                    others.append(nn.cross_entropy(pg.tensor(x + k + 1), target))
                assert _forward_key(logits, target) not in loss_kernels._FORWARDS
            value = loss.numpy().tobytes() if read_first else None
            loss.backward()
            return value or loss.numpy().tobytes(), logits.grad.numpy().tobytes()

    runs = [run(evict, read_first) for evict in (False, True) for read_first in (False, True)]
    with composite_cross_entropy(SOFT_KEY if soft else KEY):
        composite = run(False, True)
    assert all(r == composite for r in runs)
    assert len(loss_kernels._FORWARDS) <= loss_kernels.FORWARDS_KEPT


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("soft", [True, False])
def test_a_forward_is_remembered_only_while_its_loss_lives(soft):
    """The entry that lets a backward read its forward goes with the loss array: it keeps no graph
    (and no futures in it) alive that the loss would not; a backward after that recomputes."""
    import gc

    from polygrad_dask import loss_kernels

    polygrad_dask.chunks.set_partitions(2)
    x = np.random.default_rng(6).standard_normal((40, 4))
    with pg.use_backend("dask"):
        logits, target = pg.tensor(x, requires_grad=True), _targets(soft)
        key = _forward_key(logits, target)
        loss = nn.cross_entropy(logits, target)
        assert key in loss_kernels._FORWARDS
        assert loss_kernels._forwards_of(key, 2)[0] is not None
        del loss
        gc.collect()
        assert key not in loss_kernels._FORWARDS
        assert loss_kernels._forwards_of(key, 2) == [None, None]


@pytest.mark.usefixtures("dask_cluster")
def test_gcn_training_with_the_fused_soft_loss_gives_the_same_parameters(served):
    """The benchmark's case: one-hot probability targets in the backend's row blocks."""
    try:
        fused = _train_gcn(3, soft=True)
        assert served.count("soft-cross-entropy-partial") == 3 and served.count("soft-cross-entropy-grad") == 3, \
            served
        with composite_cross_entropy(SOFT_KEY):
            composite = _train_gcn(3, soft=True)
    finally:
        polygrad_dask.chunks.min_block_rows = 1
    assert fused == composite


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("split_every", [2, 3, {0: 2}])
def test_the_soft_loss_sums_its_blocks_as_dasks_configured_tree(split_every):
    """dask's ``split_every`` (config) shapes the composite's sum over 4 row blocks: ``(p0+p1)+(p2+p3)``
    at 2; the op's one aggregate serves only where dask's tree is one level."""
    import dask

    polygrad_dask.chunks.set_partitions(4)
    rng = np.random.default_rng(11)
    for seed in range(6):
        x = (rng.standard_normal((41, 3)) * 10).astype(np.float32)
        probs = rng.dirichlet(np.ones(3), size=41).astype(np.float32)
        with dask.config.set(split_every=split_every):
            fused = _soft_loss_and_grads(x, probs, "sum", 1.0, False)
            with composite_cross_entropy(SOFT_KEY):
                composite = _soft_loss_and_grads(x, probs, "sum", 1.0, False)
        assert fused[:-1] == composite[:-1], seed


@pytest.mark.usefixtures("dask_cluster")
@pytest.mark.parametrize("soft", [True, False])
def test_an_upstream_gradient_in_other_row_blocks_gives_the_composites_bits(soft):
    """Per-row losses ("none") weighted by an array in other row blocks: the composite's steps split
    the rows as the weights and the logits together split them, and a bias's gradient (the
    logits' gradient summed over rows) adds those blocks; the fused backward must give the same
    gradient, chunks included (the soft op then runs the composite's steps)."""
    import dask.array as da

    polygrad_dask.chunks.set_partitions(2)
    rng = np.random.default_rng(0)
    n, c = 4000, 7
    h = rng.standard_normal((n, c)).astype(np.float32)
    b0 = rng.standard_normal((1, c)).astype(np.float32)
    target = np.eye(c, dtype=np.float32)[rng.integers(0, c, n)] if soft else rng.integers(0, c, n)
    w = rng.random(n).astype(np.float32)

    def run() -> tuple:
        with pg.use_backend("dask"):
            b = pg.tensor(b0, requires_grad=True)
            logits = pg.tensor(h) + b
            weights = pg.Tensor.from_backend(da.from_array(w, chunks=((5, n - 5),)), "dask")
            labels = pg.tensor(target) if soft else target
            (nn.cross_entropy(logits, labels, reduction="none") * weights).sum().backward()
            return b.grad.numpy().tobytes()

    fused = run()
    with composite_cross_entropy(SOFT_KEY if soft else KEY):
        composite = run()
    assert fused == composite


@pytest.mark.parametrize("soft", [True, False])
def test_a_block_backward_reads_its_forwards_exponentials(soft):
    """The per-block backward takes the exponentials of the forward task it is handed: its bits
    are the recomputation's, and sums altered on purpose change them (the tasks above are bitwise
    either way, so only this shows the kept arrays are read)."""
    from polygrad_dask import loss_kernels

    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 3)).astype(np.float32)
    classes = np.arange(9) % 3
    probs = np.eye(3, dtype=np.float32)[classes]
    g = np.ones((), np.float32)
    scale = 1 / 18
    if soft:
        forward = loss_kernels._block_soft_forward(x, probs)

        def grad(fw):
            return loss_kernels._block_soft_grad(g, x, probs, "mean", scale, 0, fw)
    else:
        forward = loss_kernels._block_forward(x, classes)
        assert forward[0].tobytes() == loss_kernels._block_losses(x, classes).tobytes()

        def grad(fw):
            return loss_kernels._block_grad(g, x, classes, "mean", scale, fw)

    assert grad(forward).tobytes() == grad(None).tobytes()
    altered = (forward[0], forward[1], forward[2] * 2)
    assert not np.allclose(grad(altered), grad(None))
