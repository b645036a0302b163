"""Deferred plugins: discovering and listing backends imports no plugin and no array library.

A plugin that names its backends in the entry-point group ``polygrad.backends`` is imported the
first time one of them is used.  Each scenario runs in a fresh interpreter with throwaway
distributions (module + ``*.dist-info``, as ``pip install`` leaves them) on ``PYTHONPATH``, so
discovery goes through ``importlib.metadata`` and this process's registry is never touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: a backend plugin whose import is recorded (a stand-in for "imports its array library")
LAZY_PLUGIN = '''
import sys
import numpy as np
import polygrad as pg
from polygrad.ir.ops import Op

sys.modules.setdefault("lazylib_imported", sys)   # marker: the "array library" was imported


class Box:
    """The plugin's own array type."""
    __module__ = "lazylib"

    def __init__(self, data):
        self.data = np.asarray(data)
        self.shape, self.dtype = self.data.shape, self.data.dtype


class LazyBackend(pg.Backend):
    name = "lazyb"

    def __init__(self):
        super().__init__()
        self.kernels = {(Op.ADD, "dense"): lambda a, b: Box(a.data + b.data)}

    def from_numpy(self, array):
        return Box(np.array(array))

    def to_numpy(self, array):
        return np.asarray(array.data)

    def owns(self, array):
        return isinstance(array, Box)


@pg.hookimpl
def polygrad_backends():
    return [LazyBackend()]
'''

PROBE = textwrap.dedent('''
    import json, sys
    import numpy as np
    import polygrad as pg
    out = {}
    out["listed"] = {i.name: [i.available, i.loaded, i.status, i.reason] for i in pg.list_backends()}
    x = pg.tensor(np.arange(3.0), requires_grad=True)
    (x * x).sum().backward()
    out["numpy_only"] = sorted(m for m in ("lazylib_imported", "jax", "dask", "distributed", "cupy",
                                           "array_api_strict") if m in sys.modules)
    mode = sys.argv[1]
    if mode == "use":
        with pg.use_backend("lazyb"):
            y = pg.tensor(np.ones(2)) + pg.tensor(np.ones(2))
        out["value"] = y.numpy().tolist()
    elif mode == "owner":
        import lazy_plugin_mod                  # the user made one of its arrays
        t = pg.tensor(lazy_plugin_mod.Box([1.0, 2.0]))
        out["owner"] = t.backend
    elif mode == "missing":
        try:
            pg.use_backend("ghost").__enter__()
        except pg.errors.BackendUnavailableError as exc:
            out["error"] = str(exc)
    out["after"] = "lazylib_imported" in sys.modules
    out["listed_after"] = {i.name: [i.available, i.loaded, i.status, i.reason] for i in pg.list_backends()}
    print("RESULT " + json.dumps(out))
''')


def _install(site: Path, source: str, requires: tuple[str, ...] = (), declared: tuple[str, ...] = ("lazyb",),
             module: str = "lazy_plugin_mod") -> None:
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    meta = "Metadata-Version: 2.1\nName: polygrad-lazy-test\nVersion: 0.1\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(meta)
    lazy = "".join(f"{name} = {module}\n" for name in declared)
    (info / "entry_points.txt").write_text(f"[polygrad]\nlazy = {module}\n\n[polygrad.backends]\n{lazy}")
    (info / "RECORD").write_text("")


def _run(site: Path | None, mode: str) -> dict:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("POLYGRAD_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_installed_plugins_import_no_array_library_in_a_numpy_only_process() -> None:
    """The plugins installed in this environment (dask, jax, array-api ... whichever are) are
    listed, yet a process that lists them and trains on numpy imports none of their libraries."""
    result = _run(None, "none")
    assert result["numpy_only"] == [], result
    assert result["listed"]["numpy"][:3] == [True, True, "ok"]


def test_deferred_plugin_is_listed_without_import_and_imported_on_first_use(tmp_path: Path) -> None:
    _install(tmp_path, LAZY_PLUGIN)
    result = _run(tmp_path, "use")
    assert result["listed"]["lazyb"] == [True, False, "ok", ""]
    assert result["numpy_only"] == []
    assert result["value"] == [2.0, 2.0]
    assert result["after"] is True
    assert result["listed_after"]["lazyb"] == [True, True, "ok", ""]


def test_a_foreign_array_loads_the_deferred_plugin_that_owns_it(tmp_path: Path) -> None:
    _install(tmp_path, LAZY_PLUGIN)
    assert _run(tmp_path, "owner")["owner"] == "lazyb"


def test_missing_requirement_is_reported_from_metadata_without_importing(tmp_path: Path) -> None:
    _install(tmp_path, LAZY_PLUGIN, requires=("polygrad-no-such-library>=1", "numpy",
                                              "pytest-no-such-extra; extra == 'test'"))
    result = _run(tmp_path, "none")
    available, loaded, status, reason = result["listed"]["lazyb"]
    assert (available, loaded, status) == (False, False, "unavailable")
    assert "polygrad-no-such-library" in reason and "pytest-no-such-extra" not in reason
    assert result["after"] is False


def test_declared_but_not_provided_and_broken_import_are_reported(tmp_path: Path) -> None:
    _install(tmp_path, LAZY_PLUGIN, declared=("lazyb", "ghost"))
    result = _run(tmp_path, "missing")
    assert "ghost" in result["error"] and "did not provide it" in result["error"]
    assert result["listed_after"]["lazyb"][:2] == [True, True]

    broken = tmp_path / "broken"
    broken.mkdir()
    _install(broken, "raise RuntimeError('boom at import')\n")
    result = _run(broken, "none")
    assert result["listed"]["lazyb"][:2] == [True, False]   # listing never imports it
    # first use reports the import failure, naming it
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent('''
        import polygrad as pg
        try:
            pg.set_backend("lazyb")
        except pg.errors.BackendUnavailableError as exc:
            print("ERR", exc)
        print([(i.name, i.status) for i in pg.list_backends() if i.name == "lazyb"])
    ''')], env={**os.environ, "PYTHONPATH": str(broken)}, capture_output=True, text=True, timeout=180)
    assert "boom at import" in proc.stdout and "'failed'" in proc.stdout, proc.stdout + proc.stderr
