"""Class 4 (CLI): the command line never shows a traceback, whatever the arguments or data.

Each command runs in a child under RLIMIT_AS (a regression that allocates what it was asked for
gets a MemoryError, not the machine); the child must exit non-zero with a one-line
``polygrad: ...`` message and no ``Traceback``.
"""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._limited import REPO

DATA = REPO.parent / "shared" / "data" / "planetoid"
LIMIT = 3 << 30


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polygrad", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, preexec_fn=_limit,
                          env={"PATH": "/usr/bin:/bin", "POLYGRAD_DEBUG": "", "HOME": str(REPO)})


def _assert_clean_failure(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert proc.stderr.strip().startswith("polygrad"), proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, words", [
    (["demo", "moons", "--samples", "10000000000"], ["n_samples"]),
    (["demo", "moons", "--samples", "99999999999999999999999"], ["n_samples"]),
    (["demo", "moons", "--steps", "1", "--noise", "nan"], ["noise"]),
    (["demo", "moons", "--steps", "1", "--noise", "-1"], ["noise"]),
    (["demo", "moons", "--steps", "1", "--graph", "x.svg"], ["graphviz", ".gv"]),
    (["demo", "moons", "--steps", "1", "--backend", "nope"], ["nope"]),
    (["demo", "gcn", "--epochs", "1", "--data", "/nonexistent/dir"], ["missing"]),
    (["demo", "moons", "--steps", "1", "--plot", "/nonexistent/dir/x.png"], []),
    (["demo", "moons", "--steps", "1", "--graph", "/nonexistent/dir/x.gv"], []),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0] == "demo" else "")
def test_hostile_arguments(args, words, tmp_path):
    if "--graph" in args and args[-1] == "x.svg" and shutil.which("dot") and _has_graphviz():
        pytest.skip("graphviz is installed here: x.svg would render")
    proc = _cli(*args)
    _assert_clean_failure(proc, *words)


@pytest.mark.parametrize("flag, name", [("--plot", "x.png"), ("--graph", "x.gv")])
def test_output_file_in_a_missing_folder_is_refused_before_training(flag, name):
    """Found with tqdm installed: the progress bar had already run (and printed) when the write
    failed at the end.  The folder is checked first: nothing trains, one error line."""
    proc = _cli("demo", "moons", "--steps", "50", flag, f"/nonexistent/dir/{name}")
    _assert_clean_failure(proc, "/nonexistent/dir", "does not exist")
    assert "accuracy" not in proc.stdout and proc.stderr.count("\n") <= 1, proc.stderr


def _has_graphviz() -> bool:
    import importlib.util
    return importlib.util.find_spec("graphviz") is not None


def _cora_copy(tmp_path: Path) -> Path:
    if not (DATA / "ind.cora.x").is_file():
        pytest.skip("Planetoid Cora not found beside the checkout")
    folder = tmp_path / "cora"
    folder.mkdir()
    for f in DATA.glob("ind.cora.*"):
        shutil.copy(f, folder / f.name)
    return folder


@pytest.mark.parametrize("bad_id", [10 ** 12, 2 ** 70, -5])
def test_dataset_with_a_huge_id(tmp_path, bad_id):
    folder = _cora_copy(tmp_path)
    index = folder / "ind.cora.test.index"
    ids = index.read_text().split()
    ids[-1] = str(bad_id)
    index.write_text("\n".join(ids) + "\n")
    proc = _cli("demo", "gcn", "--epochs", "1", "--no-progress", "--data", str(folder))
    _assert_clean_failure(proc, "test")


def test_dataset_with_a_hostile_pickle(tmp_path):
    folder = _cora_copy(tmp_path)
    from .test_hostile_data import BYTEARRAY_3GB
    (folder / "ind.cora.graph").write_bytes(BYTEARRAY_3GB)
    proc = _cli("demo", "gcn", "--epochs", "1", "--no-progress", "--data", str(folder))
    _assert_clean_failure(proc, "ind.cora.graph")


def test_internal_errors_are_reported_without_traceback(monkeypatch, capsys):
    from polygrad.apps import cli
    monkeypatch.setattr(cli, "cmd_backends", lambda args: (_ for _ in ()).throw(AttributeError("oops")))
    monkeypatch.delenv("POLYGRAD_DEBUG", raising=False)
    parser = cli.build_parser

    def patched():
        p = parser()
        p._subparsers._group_actions[0].choices["backends"].set_defaults(func=cli.cmd_backends)
        return p

    monkeypatch.setattr(cli, "build_parser", patched)
    assert cli.main(["backends"]) == cli.EXIT_FAIL
    err = capsys.readouterr().err
    assert "internal error: AttributeError: oops" in err and "POLYGRAD_DEBUG" in err
