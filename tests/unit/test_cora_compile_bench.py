"""``python -m benchmarks cora_compile --baseline DIR``: the baseline's demo processes import DIR's
polygrad, not the checkout the benchmark runs from (``python -m`` puts its working folder ahead of
``PYTHONPATH``: run from a checkout, both sides once measured that checkout)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.cora_compile_bench import demo_process

PROBE = "import polygrad; print(polygrad.__file__)"


def _imported(env: dict, cwd: str | None) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return os.path.realpath(out.stdout.strip().splitlines()[-1])


def _fake_tree(root) -> str:
    package = root / "polygrad"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return os.fspath(root)


def test_a_baseline_process_imports_the_baseline_tree_from_a_checkout(tmp_path, monkeypatch):
    checkout = _fake_tree(tmp_path / "checkout")  # the folder the benchmark is run from
    baseline = _fake_tree(tmp_path / "baseline")
    monkeypatch.chdir(checkout)
    env, cwd = demo_process(baseline, None)
    assert _imported(env, cwd) == os.path.realpath(os.path.join(baseline, "polygrad", "__init__.py"))
    env, cwd = demo_process(None, None)  # this tree: whatever the checkout's interpreter finds
    assert _imported(env, cwd) == os.path.realpath(os.path.join(checkout, "polygrad", "__init__.py"))


def test_a_working_folder_that_would_shadow_the_baseline_is_refused(tmp_path):
    baseline = _fake_tree(tmp_path / "baseline")
    other = _fake_tree(tmp_path / "other")
    with pytest.raises(SystemExit, match="holds its own polygrad"):
        demo_process(baseline, other)
    plain = tmp_path / "plain"
    plain.mkdir()
    env, cwd = demo_process(baseline, os.fspath(plain))  # a folder without one: PYTHONPATH decides
    assert _imported(env, cwd) == os.path.realpath(os.path.join(baseline, "polygrad", "__init__.py"))
