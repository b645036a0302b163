"""Class 3 (data): hostile Planetoid files are refused with DataError before allocating.

The cases run in a child under RLIMIT_AS (``_limited.py``) with the real memory budget: a file
that asks for 3 GB or 10^12 elements must be refused by the budget, not attempted.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from ._limited import run_limited


class _Ask:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


BYTEARRAY_3GB = pickle.dumps(_Ask(bytearray, (3_000_000_000,)), protocol=2)
BYTES_3GB = pickle.dumps(_Ask(bytes, (3_000_000_000,)), protocol=2)
_recon = np.zeros(1).__reduce__()[0]
RECONSTRUCT_HUGE = pickle.dumps(_Ask(_recon, (np.ndarray, (10 ** 12,), b"b")), protocol=2)


@pytest.fixture
def files(tmp_path):
    out = {}
    for name, raw in (("bytearray", BYTEARRAY_3GB), ("bytes", BYTES_3GB), ("reconstruct", RECONSTRUCT_HUGE)):
        f = tmp_path / f"ind.cora.{'graph' if name != 'reconstruct' else 'y'}.{name}"
        f.write_bytes(raw)
        out[name] = f
    idx = tmp_path / "ind.cora.test.index"
    idx.write_text("1708\n1709\n1000000000000\n")
    out["index"] = idx
    return out


def test_hostile_pickles_are_refused_before_allocating(files):
    got = run_limited(f"""
from polygrad.data import read_planetoid_file
case("bytearray", lambda: read_planetoid_file({str(files['bytearray'])!r}, "graph"))
case("bytes", lambda: read_planetoid_file({str(files['bytes'])!r}, "graph"))
case("reconstruct", lambda: read_planetoid_file({str(files['reconstruct'])!r}, "y"))
""")
    for name in ("bytearray", "bytes", "reconstruct"):
        assert got[name]["type"] == "DataError", got[name]
        assert "refused" in got[name]["message"], got[name]
        assert got[name]["rss_growth"] < 64 << 20


def test_test_index_spanning_a_trillion_ids(tmp_path):
    """A test.index whose ids span 10^12 nodes: refused by the budget when the split is built."""
    from tests.conftest import planetoid_dir
    root = planetoid_dir()
    if root is None:
        pytest.skip("Planetoid data not found")
    import shutil
    folder = tmp_path / "cora"
    folder.mkdir()
    for f in root.glob("ind.cora.*"):
        shutil.copy(f, folder / f.name)
    ids = (folder / "ind.cora.test.index").read_text().split()
    ids[-1] = str(10 ** 12)
    (folder / "ind.cora.test.index").write_text("\n".join(ids))
    got = run_limited(f"""
from polygrad.data import load_planetoid
case("span", lambda: load_planetoid({str(folder)!r}, "cora"))
""")
    assert got["span"]["type"] == "DataError", got["span"]
    assert "spanning" in got["span"]["message"]
    assert got["span"]["rss_growth"] < 64 << 20


@pytest.mark.parametrize("text", ["99999999999999999999999\n", "1.5\n", "abc\n", "", "-3\n"])
def test_malformed_test_index(tmp_path, text):
    from polygrad.data import read_planetoid_file
    from polygrad.errors import DataError
    f = tmp_path / "ind.cora.test.index"
    f.write_text(text)
    with pytest.raises(DataError):
        read_planetoid_file(f)


def test_graph_with_overflowing_ids(tmp_path):
    from polygrad.data.planetoid import _edge_index_from_dict
    from polygrad.errors import DataError
    with pytest.raises(DataError):
        _edge_index_from_dict({0: [2 ** 70]}, 10, "test")
