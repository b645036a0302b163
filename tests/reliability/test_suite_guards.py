"""The suite cannot hide breakage behind a skip (issue 23).

A guard such as ``HAS_SPARSE = hasattr(pg, "from_edge_index")`` with ``skipif(not HAS_SPARSE)``,
or ``pytest.importorskip("polygrad.data")``, turns a broken import of polygrad's own code (or of
a required dependency: numpy, scipy, pluggy, psutil) into a skipped test instead of a failure;
a test that skips as root never runs in the containers CI uses.  These scans keep them out.
Optional extras (matplotlib, graphviz, torch, dask in the plugin's tests) may still be skipped.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_FILES = sorted(p for d in ("tests", "plugins") for p in (REPO / d).rglob("test_*.py")
                    if ".venv" not in p.parts and p.resolve() != Path(__file__).resolve())
#: what polygrad needs to run at all: never optional in its tests
REQUIRED = ("polygrad", "numpy", "scipy", "pluggy", "psutil")

HIDING = {
    "importorskip of a required module": re.compile(
        r"""importorskip\(\s*["'](?:%s)(?:\.|["'])""" % "|".join(REQUIRED)),
    "a feature guard on polygrad's own API": re.compile(r"\bHAS_SPARSE\b|hasattr\(\s*pg\s*,"),
    "a skip for root": re.compile(r"geteuid\(\)\s*==\s*0"),
}


def hiding_guards(text: str) -> list[str]:
    return [f"{what}: line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for what, pattern in HIDING.items() for m in pattern.finditer(text)]


def test_the_scan_sees_each_kind_of_guard():
    for line in ('pytest.importorskip("polygrad.data")', "sp = pytest.importorskip('scipy.sparse')",
                 'pytest.importorskip("scipy")', 'HAS_SPARSE = hasattr(pg, "sparse_coo")',
                 'names = [n for n in ("a",) if hasattr(pg, n)]', "if os.geteuid() == 0:"):
        assert hiding_guards(line), line
    for line in ('pytest.importorskip("matplotlib")', 'pytest.importorskip("torch_geometric")',
                 'pytest.importorskip("dask.array")', "hasattr(module, 'x')"):
        assert not hiding_guards(line), line


def test_found_the_test_files():
    names = {p.name for p in TEST_FILES}
    assert {"test_value.py", "test_fuzz.py", "test_nn.py", "test_polygrad_dask.py"} <= names


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_test_hides_a_broken_import_behind_a_skip(path):
    assert hiding_guards(path.read_text(encoding="utf-8")) == []


def test_readme_and_ci_run_the_tests_in_random_order():
    """The README's test command (which .ci/run runs) shuffles the tests: an order dependence
    shows up as a failure with a printed seed, not as a test that passes only after another."""
    readme = (REPO / "README.md").read_text()
    first_bash = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    test_command = [line for line in first_bash.splitlines() if "pytest" in line][0]
    assert "python -m pytest -p randomly" in test_command
    assert "python -m pytest -q -p randomly" in (REPO / ".ci" / "run").read_text()
    # (a regex, not tomllib: Python 3.10 has none, and a skip there would hide this)
    extra = re.search(r"^test = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), flags=re.M)
    assert extra and '"pytest-randomly' in extra.group(1), "pytest-randomly is not in the test extra"
