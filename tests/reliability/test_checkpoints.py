"""Classes 3 and 4 (checkpoints) and 5: hostile checkpoint files raise only CheckpointError, are
budgeted before allocating, and killed saves leave nothing that the next save/load does not clean.
"""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import polygrad as pg
from polygrad.io.checkpoint import remove_stale_temporaries
from polygrad.errors import CheckpointError

from ._limited import REPO, run_limited

MIB = 1 << 20


def _npz(path: Path, members: dict[str, bytes], meta: object, compression=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        raw = json.dumps(meta).encode() if not isinstance(meta, bytes) else meta
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.frombuffer(raw, dtype=np.uint8))
        zf.writestr("__polygrad__.npy", buf.getvalue())
        for name, data in members.items():
            zf.writestr(name + ".npy", data)
    return path


def _npy_header(shape: tuple, dtype: str = "<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _meta(tree):
    return {"format": "polygrad-checkpoint", "version": 1, "tree": tree}


# -- error contract ----------------------------------------------------------------------------------

def test_deeply_nested_metadata(tmp_path):
    depth = 200_000
    raw = ('{"format": "polygrad-checkpoint", "version": 1, "tree": ' + '{"__list__": [' * depth
           + "1" + "]}" * depth + "}").encode()
    with pytest.raises(CheckpointError):
        pg.load(_npz(tmp_path / "deep.npz", {}, raw))


def test_deep_but_parseable_nesting(tmp_path):
    """Nesting json can parse but decode() would recurse through: still CheckpointError."""
    tree: object = 1
    for _ in range(5000):
        tree = {"__list__": [tree]}
    import sys as _sys
    old = _sys.getrecursionlimit()
    _sys.setrecursionlimit(20000)
    try:
        raw = json.dumps(_meta(tree)).encode()
    finally:
        _sys.setrecursionlimit(old)
    with pytest.raises(CheckpointError):
        pg.load(_npz(tmp_path / "deep2.npz", {}, raw))


@pytest.mark.parametrize("path", [123, None, b"\x00bad", object()])
def test_bad_path_arguments(path):
    with pytest.raises(CheckpointError):
        pg.load(path)


def test_header_claims_more_than_member_holds(tmp_path):
    member = _npy_header((10 ** 12,)) + b"\x00" * 64
    f = _npz(tmp_path / "claim.npz", {"w": member}, _meta({"__tensor__": "w"}))
    with pytest.raises(CheckpointError, match="claims"):
        pg.load(f)


def test_object_dtype_member(tmp_path):
    member = _npy_header((1,), "|O") + b"\x00" * 8
    f = _npz(tmp_path / "obj.npz", {"w": member}, _meta({"__tensor__": "w"}))
    with pytest.raises(CheckpointError):
        pg.load(f)


@pytest.mark.parametrize("tree", [
    {"__tensor__": 5}, {"__sparse__": {"indptr": "x"}, "shape": [2, 2]}, {"__dict__": [1, 2]},
    {"__float__": "not a float"}, {"__list__": 7}, {"__tuple__": None}, {"__sparse__": None},
    {"__ndarray__": ["a"]}, "string-tree-is-fine-but-this-is-a-test" * 0 or {"unknown": 1},
])
def test_malformed_trees(tmp_path, tree):
    with pytest.raises(CheckpointError):
        pg.load(_npz(tmp_path / "m.npz", {}, _meta(tree)))


def test_random_corruptions_raise_only_checkpoint_error(tmp_path):
    good = tmp_path / "good.npz"
    pg.save({"w": pg.randn(8, 4), "b": pg.zeros(4), "step": 3, "sp": pg.sparse_coo(
        np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0]), (2, 2))}, good)
    data = good.read_bytes()
    rng = np.random.default_rng(0)
    bad = tmp_path / "bad.npz"
    for i in range(150):
        buf = bytearray(data)
        kind = i % 3
        if kind == 0:
            for pos in rng.integers(0, len(buf), size=4):
                buf[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            buf = buf[: int(rng.integers(0, len(buf)))]
        else:
            pos = int(rng.integers(0, len(buf) - 8))
            buf[pos:pos + 8] = rng.bytes(8)
        bad.write_bytes(bytes(buf))
        try:
            pg.load(bad)
        except CheckpointError:
            pass


# -- budgeted loading (in a child under RLIMIT_AS, budget pinned to 8 MiB) ------------------------------

def test_budget_refuses_hostile_members_before_allocating(tmp_path):
    claim = _npz(tmp_path / "claim.npz", {"w": _npy_header((4 * MIB,)) + b"\x00" * (32 * MIB)},
                 _meta({"__tensor__": "w"}))   # an honest 32 MiB member: over the 8 MiB budget
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.frombuffer(json.dumps(_meta({"__tensor__": "w"})).encode(), np.uint8))
        zf.writestr("__polygrad__.npy", buf.getvalue())
        with zf.open("w.npy", "w", force_zip64=True) as member:   # 256 MiB of zeros, ~250 KiB deflated
            member.write(_npy_header((32 * MIB,)))
            chunk = b"\x00" * MIB
            for _ in range(256):
                member.write(chunk)
    assert bomb.stat().st_size < 2 * MIB
    meta_bomb = tmp_path / "meta_bomb.npz"      # the description member itself inflates to 256 MiB
    with zipfile.ZipFile(meta_bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("__polygrad__.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((256 * MIB,), "|u1"))
            for _ in range(256):
                member.write(b" " * MIB)
    got = run_limited(f"""
def load(p):
    try:
        pg.load(p)
    except pg.errors.CheckpointError as exc:
        raise
case("honest-but-over-budget", lambda: load({str(claim)!r}))
case("deflate-bomb", lambda: load({str(bomb)!r}))
case("metadata-bomb", lambda: load({str(meta_bomb)!r}))
""", available=10 * MIB)
    for name in ("honest-but-over-budget", "deflate-bomb", "metadata-bomb"):
        assert got[name]["type"] == "CheckpointError", got[name]
        assert "budget" in got[name]["message"] or "would need" in got[name]["message"]
        assert got[name]["rss_growth"] < 8 * MIB, got[name]


def test_within_budget_checkpoint_loads(tmp_path):
    f = tmp_path / "ok.npz"
    pg.save({"w": pg.ones(16, 16)}, f)
    got = run_limited(f"case('ok', lambda: pg.load({str(f)!r}))", available=10 * MIB)
    assert got["ok"]["type"] == "ok", got["ok"]


# -- crash leftovers -----------------------------------------------------------------------------------

_KILLED_SAVE = """
import os, signal, sys
import numpy as np
import polygrad as pg
os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)   # die after the full write
pg.save({"w": pg.tensor(np.ones(256 * 1024))}, sys.argv[1])
"""


def _killed_save(target: Path) -> list[Path]:
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(target)], cwd=REPO, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def test_killed_save_leftover_is_removed_by_next_save(tmp_path):
    target = tmp_path / "model.npz"
    pg.save({"w": pg.zeros(3)}, target)
    left = _killed_save(target)
    assert len(left) == 1 and left[0].stat().st_size > 2 * MIB         # the full-size leftover
    assert pg.load(target)["w"].numpy().tolist() == [0.0, 0.0, 0.0]   # old file intact
    pg.save({"w": pg.ones(3)}, target)
    assert not left[0].exists()
    assert pg.load(target)["w"].numpy().tolist() == [1.0, 1.0, 1.0]


def test_killed_save_leftover_is_removed_by_load(tmp_path):
    target = tmp_path / "model.npz"
    pg.save({"w": pg.zeros(3)}, target)
    left = _killed_save(target) + _killed_save(target)
    assert len(left) == 2
    pg.load(target)
    assert not any(p.exists() for p in left)


def test_cleanup_spares_live_writers_and_other_files(tmp_path):
    import fcntl
    target = tmp_path / "model.npz"
    live = tmp_path / ".model.npz.abcd1234.tmp"
    other_target = tmp_path / ".other.npz.abcd1234.tmp"
    lookalike = tmp_path / ".model.npz.notours.tmp"
    user_file = tmp_path / "model.npz.tmp"
    for p in (live, other_target, lookalike, user_file):
        p.write_bytes(b"x")
    with open(live, "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)    # a writer still busy with it
        assert remove_stale_temporaries(target) == []
        pg.save({"w": pg.zeros(1)}, target)
        assert live.exists()
    assert remove_stale_temporaries(target) == [str(live)]
    assert other_target.exists() and lookalike.exists() and user_file.exists()


def _leftover_temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("step, error", [
    ("tempfile.mkstemp", PermissionError),   # a read-only folder (what chmod 0o500 does to non-root)
    ("os.fsync", OSError),                   # a full disk, an I/O error while flushing
    ("os.replace", PermissionError),         # the rename refused
])
def test_save_that_cannot_write_raises_oserror_and_keeps_old(tmp_path, monkeypatch, step, error):
    """Each step of the atomic write failing (by monkeypatching, so it runs as root too, where
    chmod makes nothing read-only): the OSError reaches the caller, the old file is intact, and
    no temporary is left behind."""
    import polygrad.io.checkpoint as checkpoint

    target = tmp_path / "model.npz"
    pg.save({"w": pg.zeros(2)}, target)
    module, name = step.split(".")
    owner = getattr(checkpoint, module)

    def refuse(*args, **kwargs):
        raise error(13, f"{step} refused (test)")

    monkeypatch.setattr(owner, name, refuse)
    with pytest.raises(OSError, match="refused"):
        pg.save({"w": pg.ones(2)}, target)
    monkeypatch.undo()
    assert pg.load(target)["w"].numpy().tolist() == [0.0, 0.0]
    assert _leftover_temporaries(tmp_path) == []


def test_save_over_a_directory_raises_oserror_and_keeps_it(tmp_path):
    """A target the OS really refuses, for root too: a non-empty directory in place of the file."""
    target = tmp_path / "model.npz"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(OSError):
        pg.save({"w": pg.ones(2)}, target)
    assert (target / "keep.txt").read_text() == "mine"
    assert _leftover_temporaries(tmp_path) == []
