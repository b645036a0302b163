"""docs/writing-a-backend.md: its code blocks run as written, and its backend passes the kit."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from polygrad.errors import FallbackWarning
from polygrad.testing.temporary import registry_snapshot

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture
def guide_module(tmp_path, monkeypatch):
    """The guide's first block saved as tiny_backend.py and importable (as the guide says)."""
    code = blocks("python")
    (tmp_path / "tiny_backend.py").write_text(code[0], encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("tiny_backend", None)
    yield tmp_path
    sys.modules.pop("tiny_backend", None)


def test_guide_has_the_blocks_this_test_runs():
    py = blocks("python")
    assert len(py) == 5, "update tests/plugins/test_guide.py when adding python blocks to the guide"
    assert "class TinyBackend(pg.Backend)" in py[0]
    assert len([line for line in py[0].splitlines() if line.strip()]) <= 50  # "a few dozen lines"
    assert 'tiny = "tiny_backend"' in blocks("toml")[0]


def test_guide_code_runs_and_its_backend_conforms(guide_module, capsys):
    py = blocks("python")
    namespace: dict = {"__name__": "guide"}
    with registry_snapshot(), warnings.catch_warnings():
        # ops the tiny backend leaves out (e.g. the comparisons of the tie rules) fall back: expected
        warnings.simplefilter("ignore", FallbackWarning)
        exec(compile(py[1], f"{GUIDE}:use", "exec"), namespace)
        exec(compile(py[2], f"{GUIDE}:check", "exec"), namespace)
        out = capsys.readouterr().out
        assert "exp" in out and "pass" in out
    import polygrad as pg
    assert "tiny" not in [b.name for b in pg.list_backends()]  # the snapshot removed it again


def test_guide_step_compiler_runs_the_compiled_step(guide_module):
    """The polygrad_compile_kernels example: the tiny backend's steps run through its callable."""
    from polygrad.compile.backend_compile import CompiledStep

    py = blocks("python")
    namespace: dict = {"__name__": "guide"}
    with registry_snapshot(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        exec(compile(py[1], f"{GUIDE}:use", "exec"), namespace)
        exec(compile(py[4], f"{GUIDE}:compile", "exec"), namespace)
        step = namespace["step"]
        (entry,) = step._cache.values()
        assert isinstance(entry.capture.fast, CompiledStep) and entry.capture.fast.calls == 3
        assert step.stats["dropped"] == 0


def test_guide_xfail_block_parses():
    from polygrad.testing.conformance import parse_xfails
    (entry,) = parse_xfails(blocks("text")[0])
    assert (entry.backend, entry.op, entry.check) == ("tiny", "pow", "float32")
    assert entry.reason.startswith("float32 pow")


def test_guide_pytest_subclass_runs(guide_module):
    """The suite-subclass example, run by pytest in a subprocess (a slice of it, for time)."""
    (guide_module / "test_conformance.py").write_text(blocks("python")[3], encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(guide_module), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "-W", "ignore::polygrad.errors.FallbackWarning", "-k", "matmul or exp or spmm",
                           str(guide_module / "test_conformance.py")],
                          cwd=guide_module, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", proc.stdout) and "skipped" in proc.stdout  # spmm: not provided
