"""`polygrad COMMAND --help` works for every command, and `--version` lists the plugins' versions."""
from __future__ import annotations

from importlib.metadata import version

import pytest

import polygrad as pg
from polygrad.apps.cli import main


@pytest.mark.parametrize("argv, expected", [
    (["check", "--help"], "usage: polygrad check"),
    (["check", "-h"], "--op OP"),
    (["demo", "--help"], "usage: polygrad demo"),
    (["demo", "moons", "--help"], "--steps"),
    (["bench", "--help"], "usage: polygrad bench"),
    (["backends", "--help"], "usage: polygrad backends"),
])
def test_help_of_every_command(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert expected in capsys.readouterr().out


def test_check_still_passes_its_arguments_through(capsys):
    assert main(["check", "numpy", "--op", "neg", "--check", "forward"]) == 0
    assert "backend 'numpy'" in capsys.readouterr().out


def test_version_shows_polygrad_and_each_plugin_distribution(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"polygrad {pg.__version__}"
    origins = {i.origin for i in pg.list_backends()}
    for origin in origins - {"<runtime>", "<unknown>"}:
        assert any(line.strip().startswith(f"{origin} {version(origin)}:") for line in out[1:]), (origin, out)
