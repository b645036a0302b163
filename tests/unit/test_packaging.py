"""Packaging cannot mislead: one `polygrad`, one `polygrad.backends`, in every install mode.

The failure modes of the old finder-based editable install (each reproduced in a subprocess):
  1. a script run from the folder that holds the clone got an empty namespace package `polygrad`;
  2. run from a second checkout, `polygrad` came from that checkout but `polygrad.backends` from
     the installed one (two checkouts silently mixed);
  3. from the repository root, `backends.numpy` and `polygrad.backends.numpy` loaded as two modules.
The slow tests build an sdist and a wheel and check what they ship; `.ci/run` runs them, and also
installs the wheel into a fresh environment and runs the demo and the conformance kit there.
"""
from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import polygrad

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(polygrad.__file__).resolve().parent
DIST = "polygrad-core"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "POLYGRAD_BACKEND")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_backends_package_lives_inside_polygrad():
    """polygrad.backends is found on disk inside polygrad's own folder (no import-hook mapping)."""
    import polygrad.backends.numpy as numpy_backend

    assert Path(numpy_backend.__file__).parent == PACKAGE / "backends"
    finders = [p for d in sys.path if os.path.isdir(d) for p in Path(d).glob("__editable__*finder*.py")]
    mapping_polygrad = [p for p in finders if "polygrad" in finder_mapping(p)]
    assert mapping_polygrad == [], "an editable install should be a path entry, not setuptools' finder"


def finder_mapping(finder: Path) -> dict:
    """The top-level packages a setuptools editable finder maps (its ``MAPPING`` literal): a
    plugin installed editable (``polygrad_scipy``, ``polygrad_dask``) has its own finder, which
    maps only the plugin's package and is no concern of polygrad's."""
    for node in ast.parse(finder.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "MAPPING" and node.value is not None:
            return dict(ast.literal_eval(node.value))
    return {}


def test_finder_mapping_tells_polygrad_from_its_plugins(tmp_path):
    """The check above flags a finder that maps ``polygrad`` and no other (a plugin's)."""
    template = "MAPPING: dict[str, str] = {mapping!r}\nNAMESPACES: dict = {{}}\n"
    (tmp_path / "core.py").write_text(template.format(mapping={"polygrad": "/src/polygrad"}))
    (tmp_path / "plugin.py").write_text(template.format(mapping={"polygrad_scipy": "/src/polygrad_scipy"}))
    (tmp_path / "old.py").write_text("MAPPING = {'polygrad': '/src/polygrad', 'backends': '/src/backends'}\n")
    assert "polygrad" in finder_mapping(tmp_path / "core.py")
    assert "polygrad" in finder_mapping(tmp_path / "old.py")
    assert "polygrad" not in finder_mapping(tmp_path / "plugin.py")


def test_script_run_from_the_folder_holding_the_clone_gets_the_real_package(tmp_path):
    """cwd holds a folder named `polygrad` without __init__.py (the clone): not a namespace package."""
    (tmp_path / "polygrad").symlink_to(ROOT, target_is_directory=True)
    proc = _python("import polygrad, polygrad.backends.numpy as n; "
                   "print(polygrad.__file__); print(n.__file__); print(polygrad.Backend.__name__)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    init, numpy_file, backend = proc.stdout.split()
    assert backend == "Backend"
    assert Path(init).resolve() == Path(polygrad.__file__).resolve()
    assert Path(numpy_file).resolve().parent == (PACKAGE / "backends").resolve()


def test_a_second_checkout_is_used_whole_or_not_at_all(tmp_path):
    """Run from another checkout's root, core and backends both come from that checkout."""
    other = tmp_path / "other-checkout"
    other.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "polygrad", other / "polygrad", symlinks=True, ignore=ignore)
    shutil.copytree(ROOT / "backends", other / "backends", ignore=ignore)
    proc = _python("import polygrad as pg, polygrad.backends.numpy as n; "
                   "print(pg.__file__); print(n.__file__); "
                   "import sys; "
                   "print(sys.modules[type(pg.runtime.registry.resolve('numpy')).__module__].__file__)", other)
    assert proc.returncode == 0, proc.stderr
    for path in proc.stdout.split():
        assert Path(path).resolve().is_relative_to(other.resolve()), (path, proc.stdout)


def test_backends_cannot_load_twice_from_the_repository_root():
    proc = _python("import polygrad as pg, sys; pg.runtime.registry.resolve('numpy'); "
                   "pg.runtime.registry.resolve('scalar')\n"
                   "assert not [m for m in sys.modules if m == 'backends' or m.startswith('backends.')]\n"
                   "try:\n    import backends.numpy\nexcept ImportError as e:\n    print('refused:', e)\n", ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "polygrad.backends" in proc.stdout


def test_plugins_depend_on_our_distribution_not_the_unrelated_one():
    """`polygrad` on PyPI is an unrelated project: nothing may depend on it or tell users to install it."""
    import re
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == DIST
    for pyproject in (ROOT / "plugins").glob("*/pyproject.toml"):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        names = [re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in deps]
        assert "polygrad" not in names and DIST in names, pyproject
    bad = re.compile(r"pip install ['\"]?polygrad(\[|['\"]?\s*$|['\"]?\s*[),])")
    for folder in ("polygrad", "backends", "plugins", "benchmarks", "docs", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".toml") and "build" not in path.parts:
                for line in path.read_text(errors="replace").splitlines():
                    assert not bad.search(line), f"{path}: {line.strip()}"


def _source_copy(dest: Path) -> Path:
    """The project's sources copied to ``dest`` (symlink kept), so builds leave the checkout alone:
    an in-tree build/ folder would sit on sys.path of an editable install."""
    junk = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                  ".pytest_cache", ".hypothesis", "data_local")
    shutil.copytree(ROOT, dest, symlinks=True, ignore=junk)
    return dest


def _build(kind: str, source: Path, out: Path) -> Path:
    if kind == "sdist":
        try:
            importlib.metadata.version("build")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("the sdist needs `pip install build`")
        cmd = [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(source)]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return next(out.glob("polygrad_core-*" + (".tar.gz" if kind == "sdist" else ".whl")))


def _check_wheel(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"polygrad", wheel.name.split("-py3")[0] + ".dist-info"}, tops  # no top-level backends/tests
    for module in ("__init__", "numpy", "scalar", "array_kernels", "cupy"):
        assert f"polygrad/backends/{module}.py" in names
    assert "polygrad/py.typed" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert f"Name: {DIST}" in meta and "License-Expression: MIT" in meta


@pytest.mark.slow
def test_wheel_and_sdist_ship_real_backend_files(tmp_path):
    source = _source_copy(tmp_path / "src")
    _check_wheel(_build("wheel", source, tmp_path / "wheel"))
    sdist = _build("sdist", source, tmp_path / "sdist")
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
    assert members["polygrad/backends/numpy.py"].isfile()  # the symlink followed: real files
    tmp_src = tmp_path / "unpacked"
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_src, filter="data")
    _check_wheel(_build("wheel", next(tmp_src.iterdir()), tmp_path / "from-sdist"))
