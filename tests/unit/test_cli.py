"""The `polygrad` command line: backends, demo moons/gcn, bench, check; errors and exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import polygrad as pg
from polygrad.apps import cli

REPO_ROOT = Path(__file__).resolve().parents[2]


def _last_json(out: str) -> dict:
    last = out.strip().splitlines()[-1]
    return json.loads(last)


def test_backends_table_lists_the_builtin_backends(capsys):
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "available", "reason", "origin"]
    rows = {line.split()[0]: line for line in out[2:]}
    assert "numpy" in rows and "scalar" in rows and "True" in rows["numpy"]
    for info in pg.list_backends():
        if not info.available:
            assert info.reason.split()[0] in rows[info.name]


def test_backends_json(capsys):
    assert cli.main(["backends", "--json"]) == 0
    rows = _last_json(capsys.readouterr().out)["backends"]
    assert {r["name"] for r in rows} >= {"numpy", "scalar"}
    assert set(rows[0]) == {"name", "available", "reason", "origin"}


def test_demo_moons_json_reaches_95_percent(capsys):
    assert cli.main(["demo", "moons", "--json", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rec = _last_json(out)
    assert rec["test_accuracy"] >= 0.95 and rec["epochs"] == 100 and rec["backend"] == "numpy"
    assert set(rec) >= {"test_accuracy", "epochs", "epoch_time_ms", "peak_rss_mb", "backend"}
    assert "accuracy" in out.splitlines()[0]


def test_demo_progress_without_tqdm_falls_back_to_plain_text(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)     # `import tqdm` now fails
    assert cli.main(["demo", "moons", "--steps", "20"]) == 0
    err = capsys.readouterr().err
    assert "moons 20/20" in err and "loss=" in err


def test_plot_without_matplotlib_says_how_to_install(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["demo", "moons", "--plot", str(tmp_path / "m.png"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "polygrad-core[viz]" in err
    assert not (tmp_path / "m.png").exists()


def test_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "moons.png"
    assert cli.main(["demo", "moons", "--plot", str(path), "--no-progress", "--steps", "30"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_unknown_backend_is_a_one_line_error(capsys):
    assert cli.main(["demo", "moons", "--backend", "no-such-backend"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("polygrad: error:") and "no-such-backend" in err and "Traceback" not in err


def test_gcn_with_a_missing_data_folder_explains(capsys, tmp_path):
    assert cli.main(["demo", "gcn", "--data", str(tmp_path / "nowhere"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "missing" in err and "ind.cora" in err


def test_demo_gcn_on_the_embedded_graph(capsys):
    assert cli.main(["demo", "gcn", "--epochs", "30", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    rec = _last_json(captured.out)
    assert rec["demo"] == "gcn" and rec["epochs"] == 30 and rec["dataset"].startswith("sbm")
    assert 0.0 <= rec["test_accuracy"] <= 1.0 and rec["epoch_time_ms"] > 0
    assert "synthetic" in captured.err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "moons", "--steps", "0"])
    assert exc.value.code == 2
    assert cli.main([]) == 2


def test_bench_runs_no_code_from_the_working_directory(tmp_path):
    """`polygrad bench` used to import benchmarks/_harness.py from the current directory: a stub
    placed there ran.  The benchmarks are `python -m benchmarks` in a checkout; the installed
    command only says so (exit 2) and imports nothing from cwd."""
    stub = tmp_path / "benchmarks"
    stub.mkdir()
    marker = tmp_path / "ran"
    (stub / "__init__.py").write_text("")
    (stub / "_harness.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef main(argv=None): return 0\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for argv in (["bench", "value"], ["bench", "--list"]):
        proc = subprocess.run([sys.executable, "-m", "polygrad", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "python -m benchmarks" in proc.stderr, proc.stderr
    assert not marker.exists()


def test_check_hands_its_arguments_to_the_conformance_kit(monkeypatch):
    got = {}

    def fake_main(argv):
        got["argv"] = argv
        return 0

    fake = types.ModuleType("polygrad.testing.conformance")
    fake.main = fake_main
    monkeypatch.setitem(sys.modules, "polygrad.testing.conformance", fake)
    assert cli.main(["check", "numpy", "--quick"]) == 0
    assert got["argv"] == ["numpy", "--quick"]


def test_check_without_the_kit_explains(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "polygrad.testing.conformance", None)
    assert cli.main(["check", "numpy"]) == 2
    assert "conformance kit is not available" in capsys.readouterr().err


def test_the_console_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "polygrad", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("polygrad ")


def test_gcn_download_offline_or_empty_cache_is_a_clear_error(capsys, monkeypatch, tmp_path):
    from polygrad import data as pdata
    from polygrad.errors import DataError

    def offline(name, cache_dir=None, **kw):
        raise DataError(f"cannot download Planetoid {name}: network unreachable (simulated)")

    monkeypatch.setattr(pdata, "download_planetoid", offline)
    monkeypatch.setattr("polygrad.data.planetoid.download_planetoid", offline)
    monkeypatch.setenv("POLYGRAD_CACHE_DIR", str(tmp_path))   # an empty cache
    assert cli.main(["demo", "gcn", "--download", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("polygrad: error:") and "network unreachable (simulated)" in err


def test_demo_monitor_prints_per_epoch_reports_and_graph_is_drawn(capsys, tmp_path):
    graph = tmp_path / "gcn.gv"
    assert cli.main(["demo", "gcn", "--epochs", "3", "--no-progress", "--monitor", "--graph", str(graph)]) == 0
    err = capsys.readouterr().err
    epoch_lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 3
    assert all("grad_norm" in line and "rss" in line and "spmm/csr" in line for line in epoch_lines)
    text = graph.read_text()
    assert text.startswith("digraph") and "spmm" in text and "cross" not in text.split("\n")[0]
