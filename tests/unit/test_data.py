"""Tests of polygrad.data (numpy only; no tensor layer, no backend).

The Planetoid tests that need the real files look for them in ``$POLYGRAD_PLANETOID_DIR`` or
``<repo>/../shared/data/planetoid`` and are skipped when neither exists.  Everything else
(including the Planetoid assembly logic, the restricted unpickler and the download path) runs
on tiny hand-made files, so it never needs the network or the data folder.
"""
from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from polygrad.errors import DataError, SparseIndexError
import polygrad.data as pdata
from polygrad.data import (
    CSRMatrix,
    GraphDataset,
    PlanetoidDataset,
    RestrictedUnpickler,
    coalesce_edge_index,
    edge_index_to_csr,
    index_to_mask,
    load_planetoid,
    make_moons,
    normalized_adjacency,
    random_graph,
    read_planetoid_file,
    remove_self_loops,
    row_normalize,
    standardize,
    stochastic_block_model,
    to_undirected,
    train_test_split,
)
from polygrad.data import planetoid as planetoid_mod
from polygrad.data.synthetic import _decode_lower_triangle
from tests.conftest import planetoid_dir

REPO_ROOT = Path(__file__).resolve().parents[2]




PLANETOID_DIR = planetoid_dir()
needs_planetoid = pytest.mark.skipif(
    PLANETOID_DIR is None,
    reason="Planetoid files not found: set POLYGRAD_PLANETOID_DIR or put them in "
           "<repo>/../shared/data/planetoid")


# ==============================================================================================
# moons
# ==============================================================================================


class TestMoons:
    def test_shapes_dtypes_and_balance(self):
        X, y = make_moons(101, noise=0.1, seed=0)
        assert X.shape == (101, 2) and X.dtype == np.float64
        assert y.shape == (101,) and y.dtype == np.int64
        assert set(np.unique(y).tolist()) == {0, 1}
        assert (y == 0).sum() == 50 and (y == 1).sum() == 51  # n_out = n // 2

    def test_geometry_without_noise(self):
        X, y = make_moons(200, noise=0.0, seed=3)
        outer, inner = X[y == 0], X[y == 1]
        np.testing.assert_allclose(np.hypot(outer[:, 0], outer[:, 1]), 1.0, atol=1e-12)
        assert outer[:, 1].min() >= -1e-12  # upper half circle
        np.testing.assert_allclose(np.hypot(inner[:, 0] - 1.0, inner[:, 1] - 0.5), 1.0, atol=1e-12)
        assert inner[:, 1].max() <= 0.5 + 1e-12  # lower half circle shifted by (1, 0.5)

    def test_unshuffled_matches_sklearn_formula(self):
        X, y = make_moons(7, noise=None, shuffle=False)
        t_out, t_in = np.linspace(0, np.pi, 3), np.linspace(0, np.pi, 4)
        expect = np.vstack([np.append(np.cos(t_out), 1 - np.cos(t_in)),
                            np.append(np.sin(t_out), 1 - np.sin(t_in) - 0.5)]).T
        np.testing.assert_array_equal(X, expect)
        np.testing.assert_array_equal(y, [0, 0, 0, 1, 1, 1, 1])

    def test_noise_level(self):
        X0, y0 = make_moons(4000, noise=0.0, seed=5)
        X1, y1 = make_moons(4000, noise=0.2, seed=5)
        np.testing.assert_array_equal(y0, y1)  # same permutation, noise drawn afterwards
        resid = X1 - X0
        assert abs(resid.std() - 0.2) < 0.01 and abs(resid.mean()) < 0.01

    def test_determinism(self):
        a = make_moons(50, seed=11)
        b = make_moons(50, seed=11)
        c = make_moons(50, seed=12)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert not np.array_equal(a[0], c[0])
        g = np.random.default_rng(11)
        np.testing.assert_array_equal(make_moons(50, seed=g)[0], a[0])

    @pytest.mark.parametrize("kwargs", [
        dict(n_samples=1), dict(n_samples=-5), dict(n_samples=2.5), dict(n_samples=True),
        dict(n_samples="100"), dict(noise=-0.1), dict(noise=float("nan")), dict(noise="x"),
        dict(seed=-1), dict(seed=1.5), dict(seed="a"),
    ])
    def test_bad_arguments(self, kwargs):
        with pytest.raises(DataError):
            make_moons(**kwargs)
        assert issubclass(DataError, ValueError)


# ==============================================================================================
# standardize / train_test_split
# ==============================================================================================


class TestTabular:
    def test_standardize(self):
        rng = np.random.default_rng(0)
        X = rng.normal(3.0, 2.0, size=(500, 3))
        X[:, 2] = 7.0  # constant column
        Xs, mu, sd = standardize(X)
        np.testing.assert_allclose(Xs[:, :2].mean(0), 0, atol=1e-12)
        np.testing.assert_allclose(Xs[:, :2].std(0), 1, atol=1e-12)
        np.testing.assert_array_equal(Xs[:, 2], 0.0)  # centred, not scaled
        assert sd[2] == 1.0 and mu[2] == 7.0
        # reuse on new data
        Xt = rng.normal(size=(10, 3))
        Xts, mu2, sd2 = standardize(Xt, mu, sd)
        np.testing.assert_allclose(Xts, (Xt - mu) / sd)
        np.testing.assert_array_equal(mu2, mu)

    @pytest.mark.parametrize("args", [
        ([[1.0, np.nan]],), (np.zeros((0, 2)),), (np.zeros((2, 2, 2)),), ([["a", "b"]],),
        (np.ones((3, 2)), np.zeros(3)), (np.ones((3, 2)), None, -np.ones(2)),
    ])
    def test_standardize_errors(self, args):
        with pytest.raises(DataError):
            standardize(*args)

    def test_split_sizes_and_alignment(self):
        X = np.arange(40).reshape(20, 2)
        y = np.arange(20)
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, seed=0)
        assert len(Xte) == 5 and len(Xtr) == 15
        np.testing.assert_array_equal(Xtr[:, 0] // 2, ytr)
        np.testing.assert_array_equal(Xte[:, 0] // 2, yte)
        assert sorted(np.concatenate([ytr, yte]).tolist()) == list(range(20))
        # ceil like scikit-learn; int sizes are absolute
        assert len(train_test_split(y, test_size=0.33, seed=0)[1]) == 7
        assert len(train_test_split(y, test_size=3, seed=0)[1]) == 3
        # determinism
        a = train_test_split(y, seed=4)
        b = train_test_split(y, seed=4)
        np.testing.assert_array_equal(a[1], b[1])
        # no shuffle: the tail is the test part
        np.testing.assert_array_equal(train_test_split(y, test_size=4, shuffle=False)[1],
                                      [16, 17, 18, 19])

    def test_stratified(self):
        y = np.array([0] * 60 + [1] * 30 + [2] * 10)
        ytr, yte = train_test_split(y, test_size=0.2, seed=1, stratify=y)
        assert len(yte) == 20
        assert np.bincount(yte).tolist() == [12, 6, 2]
        assert np.bincount(ytr).tolist() == [48, 24, 8]
        # uneven: the rounding still gives the exact total
        y2 = np.array([0] * 7 + [1] * 5 + [2] * 3)
        _, te = train_test_split(y2, test_size=4, seed=0, stratify=y2)
        assert len(te) == 4

    @pytest.mark.parametrize("kwargs", [
        dict(test_size=0.0), dict(test_size=1.0), dict(test_size=0), dict(test_size=10),
        dict(test_size="half"), dict(test_size=True), dict(stratify=np.zeros(3)),
        dict(stratify=np.zeros(10), shuffle=False),
    ])
    def test_split_errors(self, kwargs):
        with pytest.raises(DataError):
            train_test_split(np.arange(10), **kwargs)

    def test_split_needs_arrays_of_equal_length(self):
        with pytest.raises(DataError):
            train_test_split()
        with pytest.raises(DataError):
            train_test_split(np.arange(5), np.arange(6))


# ==============================================================================================
# CSRMatrix and preprocessing
# ==============================================================================================


class TestCSR:
    def test_round_trip_and_ops(self):
        rng = np.random.default_rng(0)
        A = rng.random((6, 5)) * (rng.random((6, 5)) < 0.4)
        A[2] = 0.0
        m = CSRMatrix.from_dense(A)
        assert m.nnz == np.count_nonzero(A) and m.shape == (6, 5)
        np.testing.assert_array_equal(m.to_dense(), A)
        np.testing.assert_array_equal(m.transpose().to_dense(), A.T)
        rows = np.array([5, 0, 0, 2])
        np.testing.assert_array_equal(m.take_rows(rows).to_dense(), A[rows])
        np.testing.assert_array_equal(CSRMatrix.vstack([m, m.take_rows([1])]).to_dense(),
                                      np.vstack([A, A[[1]]]))
        B = rng.random((5, 3))
        np.testing.assert_allclose(m @ B, A @ B)
        np.testing.assert_allclose(m.row_sums(), A.sum(1))

    def test_from_coo_sums_duplicates_and_sorts(self):
        m = CSRMatrix.from_coo([1, 0, 1, 1], [2, 1, 0, 2], [1.0, 2.0, 3.0, 4.0], (2, 3))
        np.testing.assert_array_equal(m.indptr, [0, 1, 3])
        np.testing.assert_array_equal(m.indices, [1, 0, 2])
        np.testing.assert_array_equal(m.data, [2.0, 3.0, 5.0])
        raw = CSRMatrix(np.array([0, 3]), np.array([2, 0, 2]), np.array([1.0, 1.0, 1.0]), (1, 3))
        canon = raw.canonical()
        np.testing.assert_array_equal(canon.indices, [0, 2])
        np.testing.assert_array_equal(canon.data, [1.0, 2.0])
        np.testing.assert_array_equal(canon.to_dense(), raw.to_dense())

    @pytest.mark.parametrize("indptr,indices,data,shape", [
        ([0, 1], [0], [1.0], (2, 2)),            # indptr too short
        ([0, 2, 1], [0, 1], [1.0, 1.0], (2, 2)),  # decreasing
        ([1, 2], [0], [1.0], (1, 2)),            # does not start at 0
        ([0, 1], [5], [1.0], (1, 2)),            # column out of range
        ([0, 1], [-1], [1.0], (1, 2)),           # negative column
        ([0, 1], [0.5], [1.0], (1, 2)),          # float indices
        ([0, 1], [0], [1.0, 2.0], (1, 2)),       # data/indices length mismatch
        ([0, 1], [0], ["a"], (1, 2)),            # non-numeric data
        ([0, 1], [0], [1.0], (1, -2)),           # negative shape
    ])
    def test_validation(self, indptr, indices, data, shape):
        with pytest.raises(SparseIndexError):
            CSRMatrix(np.array(indptr), np.array(indices), np.array(data), shape)

    def test_row_normalize(self):
        A = np.array([[1.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0]],
                     dtype=np.float32)
        r = row_normalize(CSRMatrix.from_dense(A))
        assert r.data.dtype == np.float32
        np.testing.assert_allclose(r.to_dense(), [[0.25, 0.25, 0, 0.5], [0, 0, 0, 0], [0, 1, 0, 0]])
        with pytest.raises(DataError):
            row_normalize(A)

    def test_normalized_adjacency(self):
        ei = np.array([[0, 1, 1, 2, 0, 2], [1, 0, 2, 1, 0, 1]])  # self loop 0-0, duplicate 2->1
        n = 4  # node 3 isolated
        A = np.zeros((n, n))
        A[ei[0], ei[1]] = 1.0
        np.fill_diagonal(A, 1.0)
        d = A.sum(1)
        expect = A / np.sqrt(np.outer(d, d))
        got = normalized_adjacency(ei, n).to_dense()
        np.testing.assert_allclose(got, expect)
        np.testing.assert_allclose(got, got.T)

    def test_edge_helpers(self):
        ei = np.array([[2, 0, 1, 2, 1], [2, 1, 0, 0, 0]])
        np.testing.assert_array_equal(remove_self_loops(ei), [[0, 1, 2, 1], [1, 0, 0, 0]])
        np.testing.assert_array_equal(coalesce_edge_index(ei, 3), [[0, 1, 2, 2], [1, 0, 0, 2]])
        und = to_undirected(np.array([[0, 1], [1, 2]]), 3)
        np.testing.assert_array_equal(und, [[0, 1, 1, 2], [1, 0, 2, 1]])
        np.testing.assert_array_equal(index_to_mask([0, 2], 4), [True, False, True, False])
        assert edge_index_to_csr(ei, 3).to_dense()[1, 0] == 2.0  # duplicates summed
        with pytest.raises(DataError):
            coalesce_edge_index(np.array([[0, 5], [1, 1]]), 3)
        with pytest.raises(DataError):
            index_to_mask([4], 4)
        with pytest.raises(DataError):
            remove_self_loops(np.zeros((3, 2), dtype=np.int64))


# ==============================================================================================
# hand-made Planetoid files (no real data needed)
# ==============================================================================================


def _csr_pickle(dense: np.ndarray, module: str = "scipy.sparse.csr", shape_key: str = "_shape") -> bytes:
    """Bytes of a protocol-2 pickle that looks exactly like scipy's csr_matrix pickle.

    Written by hand (class reference + NEWOBJ + BUILD) so that scipy is not needed."""
    m = CSRMatrix.from_dense(dense)
    state = {"format": "csr", shape_key: tuple(int(s) for s in dense.shape),
             "indptr": m.indptr.astype(np.int32), "indices": m.indices.astype(np.int32),
             "data": np.asarray(m.data, dtype=np.float32), "maxprint": 50}
    body = pickle.dumps(state, protocol=2)
    assert body[:2] == b"\x80\x02" and body[-1:] == b"."
    return (b"\x80\x02c" + module.encode() + b"\ncsr_matrix\n)\x81"
            + body[2:-1] + b"b.")


def _write_fake_planetoid(folder: Path, key: str = "cora", *, gap: bool = True,
                          seed: int = 0, shape_key: str = "_shape") -> dict:
    """A tiny dataset in the Planetoid layout: 2 train nodes, 500 val, 3 test ids.

    With ``gap`` the test ids are {502, 503, 505} (listed unsorted), so node 504 is a
    CiteSeer-style isolated id that must be padded.  Returns the raw arrays for checking."""
    rng = np.random.default_rng(seed)
    F, C = 4, 3
    n_all = 502
    allx = (rng.random((n_all, F)) < 0.5).astype(np.float32)
    ally = np.eye(C, dtype=np.int32)[rng.integers(0, C, n_all)]
    test_ids = np.array([505, 502, 503] if gap else [504, 502, 503])
    tx = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]], dtype=np.float32)
    ty = np.eye(C, dtype=np.int32)[[2, 1, 1]]
    n = int(test_ids.max()) + 1
    graph = {i: [(i + 1) % n, (i - 1) % n] for i in range(n)}
    graph[0].append(0)  # a self loop, dropped as in PyG
    graph[1].append(2)  # a duplicate, dropped
    files = {
        "x": _csr_pickle(allx[:2], shape_key=shape_key),
        "allx": _csr_pickle(allx, module="scipy.sparse._csr", shape_key=shape_key),
        "tx": _csr_pickle(tx, shape_key=shape_key),
        "y": pickle.dumps(ally[:2], protocol=2),
        "ally": pickle.dumps(ally, protocol=2),
        "ty": pickle.dumps(ty, protocol=2),
        "graph": pickle.dumps(graph, protocol=2),
        "test.index": ("\n".join(str(i) for i in test_ids) + "\n").encode(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for part, payload in files.items():
        (folder / f"ind.{key}.{part}").write_bytes(payload)
    return dict(allx=allx, ally=ally, tx=tx, ty=ty, test_ids=test_ids, graph=graph, files=files,
                n=n, F=F, C=C)


def _pyg_reference(raw: dict) -> tuple[np.ndarray, np.ndarray]:
    """Dense numpy transcription of PyG's read_planetoid_data (features, labels)."""
    tx, ty, ti = raw["tx"], raw["ty"], raw["test_ids"]
    st = np.sort(ti)
    span = st[-1] - st[0] + 1
    tx_ext = np.zeros((span, tx.shape[1]), dtype=tx.dtype)
    tx_ext[st - st.min()] = tx
    ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
    ty_ext[st - st.min()] = ty
    x = np.concatenate([raw["allx"], tx_ext])
    y = np.concatenate([raw["ally"], ty_ext]).argmax(1)
    x[ti] = x[st]
    y[ti] = y[st]
    return x, y


class TestPlanetoidAssembly:
    @pytest.mark.parametrize("gap", [True, False])
    @pytest.mark.parametrize("shape_key", ["_shape", "shape"])
    def test_matches_pyg_logic(self, tmp_path, gap, shape_key):
        raw = _write_fake_planetoid(tmp_path, gap=gap, shape_key=shape_key)
        ds = load_planetoid(tmp_path, "Cora")
        assert isinstance(ds, PlanetoidDataset) and isinstance(ds, GraphDataset)
        x_ref, y_ref = _pyg_reference(raw)
        np.testing.assert_array_equal(ds.x_dense(), x_ref)
        np.testing.assert_array_equal(ds.y, y_ref)
        assert ds.x.data.dtype == np.float32 and ds.y.dtype == np.int64
        assert ds.num_nodes == raw["n"] and ds.num_features == 4 and ds.num_classes == 3
        assert ds.split_sizes() == (2, 500, 3)
        assert ds.train_mask[:2].all() and ds.val_mask[2:502].all()
        np.testing.assert_array_equal(np.flatnonzero(ds.test_mask), np.sort(raw["test_ids"]))
        if gap:  # the isolated id 504 is padded: zero features, label 0, in no split
            assert ds.x_dense()[504].sum() == 0 and ds.y[504] == 0
            assert not (ds.train_mask[504] or ds.val_mask[504] or ds.test_mask[504])
        # the tx row listed first in test.index lands on that id
        np.testing.assert_array_equal(ds.x_dense()[raw["test_ids"][0]], raw["tx"][0])
        # edges: ring, both ways, self loop and duplicate removed, sorted
        n = raw["n"]
        expect = np.unique(np.concatenate([np.arange(n) * n + (np.arange(n) + 1) % n,
                                           np.arange(n) * n + (np.arange(n) - 1) % n]))
        np.testing.assert_array_equal(ds.edge_index[0] * n + ds.edge_index[1], expect)
        assert ds.edge_index.dtype == np.int64

    def test_scipy_classes_are_never_unpickled(self, tmp_path):
        # scipy is a core dependency (polygrad's compiled sparse kernels), but the pickled
        # scipy matrices must still be read as plain state, never rebuilt through scipy's classes
        _write_fake_planetoid(tmp_path)
        code = ("import scipy.sparse, scipy.sparse._csr as c\n"
                "class Trap:\n"
                "    def __new__(cls, *a, **k): raise AssertionError('a scipy class was unpickled')\n"
                "c.csr_matrix = scipy.sparse.csr_matrix = Trap\n"
                "from polygrad.data import load_planetoid\n"
                f"ds = load_planetoid({str(tmp_path)!r}, 'cora')\n"
                "assert ds.num_nodes == 506\n")
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, cwd=str(tmp_path), timeout=60)
        assert res.returncode == 0, res.stderr

    def test_unknown_name(self, tmp_path):
        with pytest.raises(DataError, match="unknown Planetoid dataset 'reddit'"):
            load_planetoid(tmp_path, "reddit")
        with pytest.raises(DataError):
            load_planetoid(tmp_path, 42)

    def test_missing_files(self, tmp_path):
        raw = _write_fake_planetoid(tmp_path)
        (tmp_path / "ind.cora.ty").unlink()
        with pytest.raises(DataError, match=r"missing ind\.cora\.ty"):
            load_planetoid(tmp_path, "cora")
        assert raw  # the rest was written

    @pytest.mark.parametrize("part", ["x", "tx", "allx", "y", "ty", "ally", "graph"])
    def test_truncated_file(self, tmp_path, part):
        raw = _write_fake_planetoid(tmp_path)
        payload = raw["files"][part]
        (tmp_path / f"ind.cora.{part}").write_bytes(payload[: len(payload) // 2])
        with pytest.raises(DataError, match=f"ind.cora.{part}"):
            load_planetoid(tmp_path, "cora")

    @pytest.mark.parametrize("payload", [b"", b"garbage\x00\xff", b"\x80\x02K\x05.",
                                         pickle.dumps([1, 2, 3], protocol=2)])
    def test_corrupt_or_wrong_type(self, tmp_path, payload):
        _write_fake_planetoid(tmp_path)
        (tmp_path / "ind.cora.allx").write_bytes(payload)
        with pytest.raises(DataError, match="ind.cora.allx"):
            load_planetoid(tmp_path, "cora")

    @pytest.mark.parametrize("text", [b"12\nabc\n", b"", b"5\n5\n", b"-3\n"])
    def test_bad_test_index(self, tmp_path, text):
        _write_fake_planetoid(tmp_path)
        (tmp_path / "ind.cora.test.index").write_bytes(text)
        with pytest.raises(DataError):
            load_planetoid(tmp_path, "cora")

    def test_inconsistent_files(self, tmp_path):
        _write_fake_planetoid(tmp_path)
        # ty with 4 label columns where ally has 3
        (tmp_path / "ind.cora.ty").write_bytes(pickle.dumps(np.eye(4, dtype=np.int32), protocol=2))
        with pytest.raises(DataError, match="widths|row counts"):
            load_planetoid(tmp_path, "cora")
        _write_fake_planetoid(tmp_path)
        bad_graph = {0: [1], 1: [10_000]}
        (tmp_path / "ind.cora.graph").write_bytes(pickle.dumps(bad_graph, protocol=2))
        with pytest.raises(DataError, match="outside"):
            load_planetoid(tmp_path, "cora")
        (tmp_path / "ind.cora.graph").write_bytes(pickle.dumps({0: ["a"]}, protocol=2))
        with pytest.raises(DataError, match="graph"):
            load_planetoid(tmp_path, "cora")

    def test_object_arrays_refused(self, tmp_path):
        _write_fake_planetoid(tmp_path)
        (tmp_path / "ind.cora.y").write_bytes(
            pickle.dumps(np.array([[1, None]], dtype=object), protocol=2))
        with pytest.raises(DataError, match="ind.cora.y"):
            load_planetoid(tmp_path, "cora")


# ==============================================================================================
# restricted unpickler
# ==============================================================================================


class _Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TestRestrictedUnpickler:
    def test_malicious_pickle_refused_and_never_runs(self, tmp_path):
        marker = tmp_path / "pwned"
        payload = pickle.dumps(_Evil(str(marker)), protocol=2)
        # sanity: the payload really would run the command under plain pickle (not executed here)
        assert b"system" in payload
        _write_fake_planetoid(tmp_path / "data")
        (tmp_path / "data" / "ind.cora.graph").write_bytes(payload)
        with pytest.raises(DataError) as info:
            load_planetoid(tmp_path / "data", "cora")
        msg = str(info.value)
        assert "ind.cora.graph" in msg and "system" in msg and "forbidden" in msg
        assert not marker.exists()

    @pytest.mark.parametrize("module,name", [
        ("builtins", "eval"), ("builtins", "getattr"), ("__builtin__", "eval"),
        ("os", "system"), ("subprocess", "Popen"), ("numpy", "load"),
        ("numpy.testing._private.utils", "runstring"), ("scipy.sparse._csr", "evil"),
        ("copyreg", "__newobj__"), ("collections", "namedtuple"),
    ])
    def test_forbidden_globals(self, module, name):
        data = b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\nq\x00."
        with pytest.raises(DataError, match=f"forbidden global {module}.{name}"):
            RestrictedUnpickler(io.BytesIO(data), "x.pkl").load()

    def test_copyreg_reconstructor_only_for_stand_ins(self):
        # protocol-0 style: copy_reg._reconstructor(cls, object, None) is admitted only when cls
        # is the scipy csr stand-in
        data = b"ccopy_reg\n_reconstructor\n(c__builtin__\nlist\nc__builtin__\nobject\nNtR."
        with pytest.raises(DataError):
            RestrictedUnpickler(io.BytesIO(data), "p0.pkl").load()
        dense = np.array([[0, 2], [3, 0]], dtype=np.float32)
        m = CSRMatrix.from_dense(dense)
        state = {"format": "csr", "_shape": (2, 2), "indptr": m.indptr.astype(np.int32),
                 "indices": m.indices.astype(np.int32), "data": m.data}
        p0 = (b"ccopy_reg\n_reconstructor\n(cscipy.sparse.csr\ncsr_matrix\nc__builtin__\nobject\nNtR"
              + pickle.dumps(state, protocol=0)[:-1] + b"b.")
        obj = RestrictedUnpickler(io.BytesIO(p0), "p0.pkl").load()
        np.testing.assert_array_equal(obj.to_csr().to_dense(), dense)

    def test_build_cannot_tamper_with_loader_callables(self):
        # GLOBAL _codecs.encode, then BUILD (None, {'__defaults__': ('rot13', 'strict')})
        data = (b"\x80\x02c_codecs\nencode\nN}X\x0c\x00\x00\x00__defaults__"
                b"X\x05\x00\x00\x00rot13X\x06\x00\x00\x00strict\x86s\x86b.")
        with pytest.raises(DataError):
            RestrictedUnpickler(io.BytesIO(data)).load()
        # the real loader still works afterwards
        assert RestrictedUnpickler(io.BytesIO(pickle.dumps(b"ok", protocol=2))).load() == b"ok"

    def test_codecs_encode_only_latin1(self):
        ok = RestrictedUnpickler(io.BytesIO(pickle.dumps(b"\x00\xffab", protocol=2))).load()
        assert ok == b"\x00\xffab"
        bad = b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00abX\x05\x00\x00\x00rot13\x86R."
        with pytest.raises(DataError, match="codec"):
            RestrictedUnpickler(io.BytesIO(bad)).load()

    def test_plain_python2_style_pickles_load(self):
        arr = np.arange(6, dtype=np.int32).reshape(2, 3)
        for proto in (0, 1, 2):
            out = RestrictedUnpickler(io.BytesIO(pickle.dumps(arr, protocol=proto))).load()
            np.testing.assert_array_equal(out, arr)
        g = RestrictedUnpickler(io.BytesIO(pickle.dumps({1: [2, 3]}, protocol=2))).load()
        assert g == {1: [2, 3]}

    def test_read_planetoid_file_returns_csr(self, tmp_path):
        dense = np.array([[0, 1, 0], [1, 0, 1]], dtype=np.float32)
        p = tmp_path / "ind.cora.tx"
        p.write_bytes(_csr_pickle(dense))
        m = read_planetoid_file(p)
        assert isinstance(m, CSRMatrix)
        np.testing.assert_array_equal(m.to_dense(), dense)
        with pytest.raises(DataError, match="not found"):
            read_planetoid_file(tmp_path / "ind.cora.x")


# ==============================================================================================
# download / cache (network simulated)
# ==============================================================================================


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class TestDownload:
    def test_offline_gives_clear_error(self, tmp_path, monkeypatch):
        calls = []

        def offline(url, timeout=None):
            calls.append(url)
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

        monkeypatch.setattr(urllib.request, "urlopen", offline)
        with pytest.raises(DataError, match="offline") as info:
            load_planetoid(name="cora", download=True, cache_dir=tmp_path / "cache")
        assert "root=" in str(info.value)
        assert calls
        assert calls[0].startswith("https://github.com/kimiyoung/planetoid/raw/master/data/ind.cora.")
        assert list((tmp_path / "cache").iterdir()) == []  # nothing partial left behind

    def test_socket_error_also_data_error(self, tmp_path, monkeypatch):
        def broken(url, timeout=None):
            raise ConnectionResetError("reset")

        monkeypatch.setattr(urllib.request, "urlopen", broken)
        with pytest.raises(DataError):
            pdata.download_planetoid("citeseer", tmp_path)

    def test_cache_miss_without_download(self, tmp_path, monkeypatch):
        def no_network(*a, **k):
            raise AssertionError("must not touch the network")

        monkeypatch.setattr(urllib.request, "urlopen", no_network)
        with pytest.raises(DataError, match="download=True"):
            load_planetoid(name="cora", cache_dir=tmp_path)
        monkeypatch.setenv("POLYGRAD_CACHE_DIR", str(tmp_path / "env"))
        assert pdata.default_cache_dir() == tmp_path / "env" / "planetoid"
        with pytest.raises(DataError, match="not in the cache"):
            load_planetoid(name="cora")

    def test_simulated_download_fills_cache_atomically(self, tmp_path, monkeypatch):
        src = tmp_path / "server"
        _write_fake_planetoid(src, key="pubmed")  # no known hashes for PubMed
        fetched = []

        def serve(url, timeout=None):
            fetched.append(url)
            return _FakeResponse((src / url.rsplit("/", 1)[1]).read_bytes())

        monkeypatch.setattr(urllib.request, "urlopen", serve)
        cache = tmp_path / "cache"
        ds = load_planetoid(name="PubMed", download=True, cache_dir=cache)
        assert ds.name == "pubmed" and ds.num_nodes == 506
        assert len(fetched) == 8
        assert sorted(p.name for p in cache.iterdir()) == sorted(
            f"ind.pubmed.{p}" for p in planetoid_mod.PLANETOID_PARTS)  # no temp files
        # second call: served from the cache, no network
        load_planetoid(name="pubmed", download=True, cache_dir=cache)
        assert len(fetched) == 8

    def test_hash_mismatch_not_saved(self, tmp_path, monkeypatch):
        monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: _FakeResponse(b"x"))
        with pytest.raises(DataError, match="SHA-256"):
            pdata.download_planetoid("cora", tmp_path)
        assert list(tmp_path.iterdir()) == []


# ==============================================================================================
# real Planetoid data
# ==============================================================================================


@needs_planetoid
class TestRealPlanetoid:
    @pytest.mark.parametrize("name,n,f,c,e,train,classes", [
        ("cora", 2708, 1433, 7, 10556, 140, [351, 217, 418, 818, 426, 298, 180]),
        ("CiteSeer", 3327, 3703, 6, 9104, 120, [264, 590, 668, 701, 596, 508]),
    ])
    def test_counts(self, name, n, f, c, e, train, classes):
        ds = load_planetoid(PLANETOID_DIR, name)
        assert (ds.num_nodes, ds.num_features, ds.num_classes, ds.num_edges) == (n, f, c, e)
        assert ds.split_sizes() == (train, 500, 1000)
        assert ds.train_mask[:train].all() and ds.val_mask[train:train + 500].all()
        assert not (ds.train_mask & ds.val_mask).any() and not (ds.val_mask & ds.test_mask).any()
        assert np.bincount(ds.y, minlength=c).tolist() == classes
        assert ds.y.min() >= 0 and ds.y.max() < c
        # train: 20 per class
        assert np.bincount(ds.y[ds.train_mask], minlength=c).tolist() == [20] * c
        ei = ds.edge_index
        assert ei.dtype == np.int64 and ei.shape == (2, e)
        assert not (ei[0] == ei[1]).any()
        key = ei[0] * n + ei[1]
        assert np.all(np.diff(key) > 0)  # sorted, no duplicates
        np.testing.assert_array_equal(np.sort(ei[1] * n + ei[0]), key)  # symmetric
        xd = ds.x_dense()
        assert xd.shape == (n, f) and set(np.unique(xd).tolist()) <= {0.0, 1.0}
        assert ds.x.nnz == {"cora": 49216, "citeseer": 105165}[ds.name]

    def test_citeseer_padded_rows(self):
        ds = load_planetoid(PLANETOID_DIR, "citeseer")
        test_ids = ds.test_index
        pad = np.setdiff1d(np.arange(test_ids.min(), test_ids.max() + 1), test_ids)
        assert pad.size == 15
        assert ds.x.row_sums()[pad].sum() == 0 and (ds.y[pad] == 0).all()
        assert not ds.test_mask[pad].any()

    @pytest.mark.filterwarnings("ignore::DeprecationWarning")
    def test_matches_scipy_reference(self):
        import scipy.sparse as sp

        for key in ("cora", "citeseer"):
            ds = load_planetoid(PLANETOID_DIR, key)

            def load(part):  # trusted files; the plain pickle is the reference here
                with open(PLANETOID_DIR / f"ind.{key}.{part}", "rb") as fh:
                    return pickle.load(fh, encoding="latin1")

            allx, tx = sp.csr_matrix(load("allx")), sp.csr_matrix(load("tx"))
            raw = dict(allx=allx.toarray(), ally=load("ally"), tx=tx.toarray(), ty=load("ty"),
                       test_ids=np.loadtxt(PLANETOID_DIR / f"ind.{key}.test.index", dtype=np.int64))
            x_ref, y_ref = _pyg_reference(raw)
            np.testing.assert_array_equal(ds.x_dense(), x_ref)
            np.testing.assert_array_equal(ds.y, y_ref)

    def test_copied_folder_with_truncated_file(self, tmp_path):
        for p in PLANETOID_DIR.glob("ind.cora.*"):
            data = p.read_bytes()
            if p.name.endswith(".allx"):
                data = data[:1000]
            (tmp_path / p.name).write_bytes(data)
        with pytest.raises(DataError, match="ind.cora.allx"):
            load_planetoid(tmp_path, "cora")

    def test_gcn_preprocessing_on_cora(self):
        ds = load_planetoid(PLANETOID_DIR, "cora")
        xn = row_normalize(ds.x)
        sums = xn.row_sums()
        np.testing.assert_allclose(sums[sums > 0], 1.0, rtol=1e-6)
        A = normalized_adjacency(ds.edge_index, ds.num_nodes)
        assert A.nnz == 13264  # A + I, as in the README


# ==============================================================================================
# synthetic graphs
# ==============================================================================================


class TestSBM:
    def test_interface_and_invariants(self):
        t = time.perf_counter()
        ds = stochastic_block_model()
        assert time.perf_counter() - t < 1.0
        n, C = 600, 4
        assert isinstance(ds, GraphDataset)
        assert (ds.num_nodes, ds.num_classes, ds.num_features) == (n, C, 64)
        assert ds.y.dtype == np.int64 and ds.y.min() == 0 and ds.y.max() == C - 1
        assert np.bincount(ds.y).tolist() == [150] * 4
        # splits: 20 per class train, disjoint, scaled val/test
        assert np.bincount(ds.y[ds.train_mask], minlength=C).tolist() == [20] * C
        tr, va, te = ds.split_sizes()
        assert (tr, va, te) == (80, 173, 347)
        assert not ((ds.train_mask & ds.val_mask) | (ds.train_mask & ds.test_mask)
                    | (ds.val_mask & ds.test_mask)).any()
        # edges: symmetric, sorted, no duplicates, no self loops
        ei = ds.edge_index
        assert ei.dtype == np.int64 and ei.shape[0] == 2
        key = ei[0] * n + ei[1]
        assert np.all(np.diff(key) > 0)
        assert not (ei[0] == ei[1]).any()
        np.testing.assert_array_equal(np.sort(ei[1] * n + ei[0]), key)
        # densities close to p_in / p_out (loose: ~10 sigma)
        same = ds.y[ei[0]] == ds.y[ei[1]]
        n_in_pairs = C * 150 * 149 / 2
        n_out_pairs = (n * (n - 1) / 2) - n_in_pairs
        assert abs(same.sum() / 2 / n_in_pairs - 0.05) < 0.01
        assert abs((~same).sum() / 2 / n_out_pairs - 0.005) < 0.002
        # features: binary, sparse, every node has a word
        assert ds.x.data.dtype == np.float32 and set(np.unique(ds.x.data).tolist()) == {1.0}
        assert (np.diff(ds.x.indptr) >= 1).all()
        assert ds.x.density < 0.2

    def test_determinism_and_seed(self):
        a = stochastic_block_model(seed=7)
        b = stochastic_block_model(seed=7)
        c = stochastic_block_model(seed=8)
        np.testing.assert_array_equal(a.edge_index, b.edge_index)
        np.testing.assert_array_equal(a.x.indices, b.x.indices)
        np.testing.assert_array_equal(a.y, b.y)
        np.testing.assert_array_equal(a.test_mask, b.test_mask)
        assert not np.array_equal(a.y, c.y)

    def test_features_carry_signal(self):
        ds = stochastic_block_model(num_nodes=2000, feature_signal=0.9, seed=1)
        # with strong signal, the class-mean feature profiles are far apart
        X = ds.x_dense(np.float64)
        means = np.stack([X[ds.y == k].mean(0) for k in range(ds.num_classes)])
        top = means.argmax(1)
        assert len(set(top.tolist())) == ds.num_classes
        noise = stochastic_block_model(num_nodes=2000, feature_signal=0.0, seed=1)
        assert noise.x.nnz > 0

    def test_planetoid_sized_split(self):
        ds = stochastic_block_model(num_nodes=2000, num_classes=5, seed=0)
        assert ds.split_sizes() == (100, 500, 1000)
        ds2 = stochastic_block_model(num_nodes=300, num_classes=3, num_val=30, num_test=50)
        assert ds2.split_sizes() == (60, 30, 50)

    @pytest.mark.parametrize("kwargs", [
        dict(num_nodes=50), dict(num_classes=1), dict(p_in=1.5), dict(p_out=-0.1),
        dict(num_features=2), dict(feature_signal=2.0), dict(seed=-3), dict(words_per_node=0.5),
        dict(num_val=400, num_test=400), dict(num_nodes=600.0),
    ])
    def test_bad_arguments(self, kwargs):
        with pytest.raises(DataError):
            stochastic_block_model(**kwargs)


class TestRandomGraph:
    @pytest.mark.parametrize("directed", [False, True])
    def test_small_exact(self, directed):
        n, m = 50, 300
        ei = random_graph(n, m, seed=3, directed=directed)
        assert ei.shape == (2, m) and ei.dtype == np.int64
        assert ei.min() >= 0 and ei.max() < n
        assert not (ei[0] == ei[1]).any()
        key = ei[0] * n + ei[1]
        assert np.all(np.diff(key) > 0)
        if not directed:
            np.testing.assert_array_equal(np.sort(ei[1] * n + ei[0]), key)
        np.testing.assert_array_equal(ei, random_graph(n, m, seed=3, directed=directed))
        assert not np.array_equal(ei, random_graph(n, m, seed=4, directed=directed))

    def test_complete_and_empty(self):
        n = 6
        full = random_graph(n, n * (n - 1), seed=0)
        assert full.shape[1] == 30 and len(set(zip(*full.tolist()))) == 30
        assert random_graph(n, n * (n - 1), seed=0, directed=True).shape == (2, 30)
        assert random_graph(n, 0).shape == (2, 0)

    def test_large_sparse_path(self):
        # population far above the dense threshold: exercises the draw-dedupe-trim path
        n, m = 200_000, 400_000
        t = time.perf_counter()
        ei = random_graph(n, m, seed=0)
        assert time.perf_counter() - t < 3.0
        key = ei[0] * n + ei[1]
        assert ei.shape == (2, m) and np.all(np.diff(key) > 0) and not (ei[0] == ei[1]).any()
        np.testing.assert_array_equal(np.sort(ei[1] * n + ei[0]), key)

    def test_uniform_degrees(self):
        n = 40
        ei = random_graph(n, 400, seed=0)
        deg = np.bincount(ei[0], minlength=n)
        assert deg.min() >= 2 and deg.max() <= 20  # mean 10, G(n,m) spread

    @pytest.mark.parametrize("args,kwargs", [
        ((10, 7), {}), ((4, 14), {}), ((4, 13), dict(directed=True)), ((0, 0), {}),
        ((10, -2), {}), ((10.0, 4), {}), ((10, 4), dict(seed="x")), ((10, 4), dict(directed="yes")),
    ])
    def test_bad_arguments(self, args, kwargs):
        with pytest.raises(DataError):
            random_graph(*args, **kwargs)

    def test_triangle_decode_exact_at_boundaries(self):
        i = np.array([1, 2, 3, 1000, 999_999, 123_456_789, 3_000_000_000], dtype=np.int64)
        start = i * (i - 1) // 2
        codes = np.concatenate([start, start + i - 1])
        ii, jj = _decode_lower_triangle(codes)
        np.testing.assert_array_equal(ii, np.concatenate([i, i]))
        np.testing.assert_array_equal(jj, np.concatenate([np.zeros_like(i), i - 1]))


def test_public_api_exports():
    for name in pdata.__all__:
        assert hasattr(pdata, name), name
    for name in ("make_moons", "load_planetoid", "stochastic_block_model", "random_graph",
                 "CSRMatrix", "PlanetoidDataset", "row_normalize", "standardize",
                 "train_test_split"):
        assert name in pdata.__all__
