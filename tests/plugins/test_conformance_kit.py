"""The conformance kit end to end: built-in backends pass, the pytest plugin and `check` CLI work,
and a deliberately wrong backend fails with messages naming op, layout and the largest error."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

import polygrad as pg
from polygrad.ir.ops import FUSED
from polygrad.testing.conformance import main, run_conformance

# every installed, available backend: the built-in ones and any third party (CI installs polygrad-scipy)
BUILTIN = [b.name for b in pg.list_backends() if b.available]


@pytest.mark.parametrize("backend", BUILTIN)
def test_builtin_backends_pass_the_whole_kit(backend):
    report = run_conformance(backend)
    assert report.ok, "\n".join(r.message for r in report.failures)
    checks = {r.check for r in report.results}
    assert {"forward", "float32", "grad-numeric", "grad-scalar", "errors"} <= checks
    # every primitive op is exercised on its layouts; a fused one may be left out (its composite runs)
    for op in pg.Op:
        cells = [report.cell(op, layout) for layout in ("dense", "csr", "coo")]
        assert "pass" in cells or (op in FUSED and set(cells) == {"-"}), (op, cells)


def test_check_command_prints_table_and_exit_status(capsys):
    assert main(["numpy", "--op", "spmm", "--op", "add"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^spmm\s+-\s+pass\s+pass\s*$", out, flags=re.M)
    assert re.search(r"^add\s+pass\s+-\s+-\s*$", out, flags=re.M)
    assert re.search(r"^exp\s+pass", out, flags=re.M) is None  # filtered out: not run
    assert "0 failed" in out


def test_check_command_unknown_backend_and_op(capsys):
    assert main(["no-such-backend"]) == 2
    assert "unknown backend 'no-such-backend'" in capsys.readouterr().err
    assert main(["numpy", "--op", "frobnicate"]) == 2


def test_module_entry_point_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "polygrad.testing.conformance", "scalar", "--op", "sddmm"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^sddmm\s+-\s+pass\s+pass", proc.stdout, flags=re.M)


WRONG_CONFTEST = textwrap.dedent('''
    import numpy as np
    import polygrad as pg
    from polygrad.backends.array_kernels import make_kernels
    from polygrad.ir.ops import Op

    class Wrong(pg.Backend):
        name = "wrong"
        def __init__(self):
            super().__init__()
            self.kernels = make_kernels(np)
            self.kernels[(Op.EXP, "dense")] = lambda x: np.exp(x) + 1e-4   # off by a small epsilon
        def from_numpy(self, a):
            return a
        def to_numpy(self, a):
            return np.asarray(a)

    class Plugin:
        @pg.hookimpl
        def polygrad_backends(self):
            return [Wrong()]

    pg.register_plugin(Plugin(), "wrong-plugin")
''')


def _pytest(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "polygrad.testing.plugin", "-q",
                           "-p", "no:cacheprovider", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_pytest_plugin_runs_suite_on_named_backend(tmp_path):
    proc = _pytest(["--polygrad-backend", "numpy", "-k", "segment_sum or where"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"(\d+) passed", proc.stdout)


def test_pytest_plugin_reports_wrong_backend_via_env_and_xfail_file(tmp_path):
    (tmp_path / "conftest.py").write_text(WRONG_CONFTEST)
    env = dict(os.environ, POLYGRAD_CONFORMANCE_BACKEND="wrong")
    proc = _pytest(["-k", "exp and (forward or grad_numeric) and dense"], tmp_path, env)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "op 'exp' (dense), case matrix, check forward" in proc.stdout
    assert "max abs error 0.0001" in proc.stdout
    (tmp_path / "xfails.txt").write_text("wrong exp dense *  # known: off by 1e-4\n")
    proc = _pytest(["-k", "exp and forward and dense", "--polygrad-xfail", "xfails.txt"], tmp_path, env)
    assert proc.returncode == 0 and "xfailed" in proc.stdout, proc.stdout[-3000:]


def test_plugin_inactive_without_backend(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "POLYGRAD_CONFORMANCE_BACKEND"}
    proc = _pytest([], tmp_path, env)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout
