"""Plugin fault isolation, with real installed entry points.

Each broken plugin is a throwaway distribution written to a temporary site directory -- a module
plus a ``*.dist-info`` with ``METADATA`` and ``entry_points.txt`` (group ``polygrad``), exactly what
``pip install`` leaves behind -- and put on ``PYTHONPATH`` of a fresh interpreter, so discovery
goes through ``importlib.metadata`` like for any third party, and the registry of this test
process is never touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: name -> (distribution name, module source, entry-point name)
PLUGINS: dict[str, tuple[str, str, str]] = {
    "import": ("polygrad-broken-import", """
        raise RuntimeError("boom at import")
    """, "broken_import"),
    "exit": ("polygrad-exits-at-import", """
        import sys
        sys.exit(3)
    """, "exits_at_import"),
    "register": ("polygrad-broken-register", """
        import polygrad as pg

        @pg.hookimpl
        def polygrad_backends():
            raise RuntimeError("boom in registration")

        @pg.hookimpl
        def polygrad_op_executed(op, backend, layout, inputs, output):
            # a plugin whose registration failed must be unregistered: this must never run
            raise AssertionError("event hook of a failed plugin was called")
    """, "broken_register"),
    "available": ("polygrad-broken-available", """
        import numpy as np
        import polygrad as pg

        class BrokenAvailable(pg.Backend):
            name = "broken-available"

            def is_available(self):
                raise RuntimeError("boom in is_available")

            def from_numpy(self, array):
                return array

            def to_numpy(self, array):
                return np.asarray(array)

        @pg.hookimpl
        def polygrad_backends():
            return [BrokenAvailable()]
    """, "broken_available"),
    "good": ("polygrad-isolation-good", """
        import numpy as np
        import polygrad as pg

        class Good(pg.Backend):
            name = "isolation-good"

            def __init__(self):
                super().__init__()
                self.kernels = {("neg", "dense"): np.negative}

            def from_numpy(self, array):
                return array

            def to_numpy(self, array):
                return np.asarray(array)

            def owns(self, array):
                return isinstance(array, np.ndarray)

        @pg.hookimpl
        def polygrad_backends():
            return [Good()]
    """, "isolation_good"),
}

EXPECTED_FAILURES = {
    # entry in pg.list_backends() -> (distribution, reason fragment)
    "import": ("broken_import", "failed to import: RuntimeError: boom at import"),
    "exit": ("exits_at_import", "failed to import: SystemExit: 3"),
    "register": ("broken_register", "raised in registration: RuntimeError: boom in registration"),
    "available": ("broken-available", "is_available() raised RuntimeError: boom in is_available"),
}

PROBE = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import polygrad as pg

    infos = [dict(name=b.name, available=b.available, status=b.status, reason=b.reason, origin=b.origin)
             for b in pg.list_backends()]
    results = {}
    for backend in ("numpy", "scalar"):
        x = pg.tensor([1.0, -2.0, 3.0], backend=backend, requires_grad=True)
        (x * x).relu().sum().backward()
        results[backend] = x.grad.tolist()
    try:
        pg.tensor([1.0], backend="broken-available")
        unavailable = "no error"
    except pg.errors.BackendUnavailableError as exc:
        unavailable = str(exc)
    good = None
    if any(i["name"] == "isolation-good" and i["available"] for i in infos):
        good = (-pg.tensor([1.0, 2.0], backend="isolation-good")).tolist()
    print("RESULT " + json.dumps(dict(infos=infos, results=results, unavailable=unavailable, good=good)))
""")


def _install(site: Path, key: str) -> None:
    """Write one throwaway distribution (module + dist-info) into ``site``."""
    dist, source, ep_name = PLUGINS[key]
    module = dist.replace("-", "_")
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[polygrad]\n{ep_name} = {module}\n")
    (info / "RECORD").write_text("")


def _probe(site: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("POLYGRAD_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"import polygrad failed with broken plugins installed:\n{proc.stderr}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _check_core_still_works(result: dict) -> None:
    for backend in ("numpy", "scalar"):
        assert result["results"][backend] == [2.0, -4.0, 6.0]  # d/dx sum(relu(x * x)) = 2x
    infos = {i["name"]: i for i in result["infos"]}
    for name in ("numpy", "scalar"):
        assert infos[name]["available"] and infos[name]["status"] == "ok"


def _check_failure(result: dict, key: str) -> None:
    entry, reason = EXPECTED_FAILURES[key]
    infos = {i["name"]: i for i in result["infos"]}
    assert entry in infos, f"{entry!r} missing from pg.list_backends(): {sorted(infos)}"
    info = infos[entry]
    assert info["status"] == "failed" and not info["available"]
    assert reason in info["reason"]
    assert info["origin"] == PLUGINS[key][0]  # the distribution that shipped the broken plugin


@pytest.mark.parametrize("key", sorted(EXPECTED_FAILURES))
def test_one_broken_plugin_is_isolated(tmp_path, key):
    _install(tmp_path, key)
    result = _probe(tmp_path)
    _check_core_still_works(result)
    _check_failure(result, key)
    if key == "available":
        assert "boom in is_available" in result["unavailable"]


def test_broken_plugins_together_leave_the_good_ones_working(tmp_path):
    for key in PLUGINS:
        _install(tmp_path, key)
    result = _probe(tmp_path)
    _check_core_still_works(result)
    for key in EXPECTED_FAILURES:
        _check_failure(result, key)
    infos = {i["name"]: i for i in result["infos"]}
    good = infos["isolation-good"]
    assert good["available"] and good["status"] == "ok" and good["origin"] == "polygrad-isolation-good"
    assert result["good"] == [-1.0, -2.0]
