"""pg.save / pg.load: round trips, the .npz format, atomic writes, and corrupt or hostile files."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import polygrad as pg
from polygrad.io import checkpoint
from polygrad import nn
from polygrad.errors import CheckpointError



def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_nested_roundtrip_keeps_types_values_and_dtypes(tmp_path):
    obj = {
        "model": {"w": pg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True),
                  "w64": pg.tensor(np.array([1.5, -2.0])),
                  "idx": pg.tensor(np.array([3, 1], dtype=np.int64)),
                  "mask": pg.tensor(np.array([True, False]))},
        "arr": np.array([[1, 2]], dtype=np.int32),
        "epoch": 7, "loss": 0.25, "nan": float("nan"), "inf": float("-inf"), "name": "cora", "none": None,
        "flag": True, "betas": (0.9, 0.999), "list": [1, "two", [3.0]], "empty": {},
        "np_scalar": np.float32(1.5),
    }
    path = tmp_path / "ck.npz"
    pg.save(obj, path)
    got = pg.load(path)
    w = got["model"]["w"]
    assert isinstance(w, pg.Tensor) and w.dtype == pg.float32 and w.requires_grad
    np.testing.assert_array_equal(w.numpy(), np.arange(6).reshape(2, 3))
    assert got["model"]["w64"].dtype == pg.float64
    assert got["model"]["idx"].dtype == pg.int64 and got["model"]["idx"].tolist() == [3, 1]
    assert got["model"]["mask"].dtype == pg.bool_ and not got["model"]["mask"].requires_grad
    assert isinstance(got["arr"], np.ndarray) and got["arr"].dtype == np.int32
    assert got["epoch"] == 7 and got["loss"] == 0.25 and np.isnan(got["nan"]) and got["inf"] == -np.inf
    assert got["name"] == "cora" and got["none"] is None and got["flag"] is True
    assert got["betas"] == (0.9, 0.999) and got["list"] == [1, "two", [3.0]] and got["empty"] == {}
    assert got["np_scalar"] == 1.5


def test_a_bare_tensor_roundtrips_and_loads_on_the_chosen_backend(tmp_path):
    pg.save(pg.tensor([1.0, 2.0]), tmp_path / "t.npz")
    t = pg.load(tmp_path / "t.npz", backend="scalar")
    assert t.backend == "scalar" and t.tolist() == [1.0, 2.0]


def test_the_file_is_a_plain_npz_without_pickles(tmp_path):
    model = nn.MLP(2, [3, 1])
    pg.save(model.state_dict(), tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as npz:
        assert "layers.0.weight" in npz.files and "__polygrad__" in npz.files
        np.testing.assert_array_equal(npz["layers.0.weight"], model.layers[0].weight.numpy())


def test_odd_and_colliding_keys_roundtrip(tmp_path):
    obj = {"a/b": pg.tensor([1.0]), "a": {"b": pg.tensor([2.0])}, "sp ace/../x": pg.tensor([3.0]),
           "__polygrad__": pg.tensor([4.0])}
    pg.save(obj, tmp_path / "k.npz")
    got = pg.load(tmp_path / "k.npz")
    assert got["a/b"].tolist() == [1.0] and got["a"]["b"].tolist() == [2.0]
    assert got["sp ace/../x"].tolist() == [3.0] and got["__polygrad__"].tolist() == [4.0]


def test_unsupported_objects_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "x.npz"
    with pytest.raises(CheckpointError, match="cannot save a object"):
        pg.save({"f": object()}, path)
    with pytest.raises(CheckpointError, match="keys must be strings"):
        pg.save({1: pg.tensor([1.0])}, path)
    with pytest.raises(CheckpointError, match="dtype object"):
        pg.save({"o": np.array([{}], dtype=object)}, path)
    assert _files(tmp_path) == []


def test_failure_mid_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ck.npz"
    pg.save({"v": pg.tensor([1.0, 2.0])}, path)
    old_bytes = path.read_bytes()

    def half_then_crash(fh, arrays):
        fh.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint, "_write_npz", half_then_crash)
    with pytest.raises(OSError, match="simulated"):
        pg.save({"v": pg.tensor([9.0, 9.0])}, path)
    assert path.read_bytes() == old_bytes
    assert _files(tmp_path) == ["ck.npz"]      # the temporary file was removed
    assert pg.load(path)["v"].tolist() == [1.0, 2.0]


def test_failed_rename_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ck.npz"
    pg.save({"v": 1}, path)

    def refuse(src, dst):
        raise PermissionError("rename refused (simulated)")

    monkeypatch.setattr(checkpoint.os, "replace", refuse)
    with pytest.raises(PermissionError):
        pg.save({"v": 2}, path)
    monkeypatch.undo()
    assert pg.load(path) == {"v": 1}
    assert _files(tmp_path) == ["ck.npz"]


def test_a_process_killed_mid_write_leaves_the_old_file_intact(tmp_path):
    """A real crash: the child process dies (os._exit) halfway through writing the new checkpoint."""
    path = tmp_path / "ck.npz"
    pg.save({"v": pg.tensor(np.zeros(10))}, path)
    script = textwrap.dedent(f"""
        import os, numpy as np, polygrad as pg
        from polygrad import checkpoint
        real = checkpoint._write_npz
        def dying(fh, arrays):
            fh.write(b"PK\\x03\\x04" + b"x" * 4096)
            fh.flush()
            os._exit(3)
        checkpoint._write_npz = dying
        pg.save({{"v": pg.tensor(np.ones(10))}}, {str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == 3, proc.stderr.decode()
    np.testing.assert_array_equal(pg.load(path)["v"].numpy(), np.zeros(10))
    leftovers = [f for f in _files(tmp_path) if f != "ck.npz"]
    assert all(f.startswith(".ck.npz.") and f.endswith(".tmp") for f in leftovers)


def test_missing_truncated_and_garbage_files_raise_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        pg.load(tmp_path / "absent.npz")
    good = tmp_path / "good.npz"
    pg.save({"w": pg.tensor(np.arange(100.0))}, good)
    data = good.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 5):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            pg.load(bad)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(os.urandom(300))
    with pytest.raises(CheckpointError):
        pg.load(junk)


def test_a_flipped_bit_in_the_data_is_detected(tmp_path):
    path = tmp_path / "ck.npz"
    values = np.arange(1000, dtype=np.float64)
    pg.save({"w": pg.tensor(values)}, path)
    raw = bytearray(path.read_bytes())
    at = raw.find(np.float64(500.0).tobytes())
    assert at > 0
    raw[at + 3] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="CRC|corrupt"):
        pg.load(path)


def test_foreign_and_future_files_are_refused(tmp_path):
    plain = tmp_path / "plain.npz"
    np.savez(plain, a=np.ones(2))
    with pytest.raises(CheckpointError, match="not a polygrad checkpoint"):
        pg.load(plain)
    future = tmp_path / "future.npz"
    pg.save({"a": 1}, future)
    with np.load(future) as npz:
        members = {k: npz[k] for k in npz.files}
    meta = bytes(members["__polygrad__"]).replace(b'"version": 1', b'"version": 99')
    members["__polygrad__"] = np.frombuffer(meta, dtype=np.uint8)
    np.savez(future, **members)
    with pytest.raises(CheckpointError, match="version 99"):
        pg.load(future)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_CHECKPOINT",))


def test_a_pickled_payload_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.npz"
    pg.save({"w": pg.tensor([1.0])}, path)
    # replace the array member by a pickled object array that would run a command when unpickled
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    payload = np.empty(1, dtype=object)
    payload[0] = _Evil()
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, payload, allow_pickle=True)
    members["w.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(CheckpointError):
        pg.load(path)
    assert not (tmp_path / "PWNED_BY_CHECKPOINT").exists()
    # and the metadata itself is JSON: a pickle there is just invalid
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__polygrad__.npy", pickle.dumps(_Evil()))
    with pytest.raises(CheckpointError):
        pg.load(path)
    assert not (tmp_path / "PWNED_BY_CHECKPOINT").exists()


def test_sparse_tensors_roundtrip(tmp_path):
    sp = pg.sparse_coo(np.array([[0, 2, 2], [1, 0, 2]]), np.array([1.0, -2.0, 0.0]), (3, 4),
                       dtype=pg.float64, requires_grad=True)
    pg.save({"adj": sp}, tmp_path / "s.npz")
    got = pg.load(tmp_path / "s.npz")["adj"]
    assert got.layout == sp.layout == "coo" and got.shape == (3, 4) and got.nnz == 3 and got.requires_grad
    np.testing.assert_array_equal(got.numpy(), sp.numpy())   # the explicit zero is kept too
