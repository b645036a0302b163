"""The README's Python examples run as written, and its first two commands are what CI runs."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_readme_starts_with_the_two_commands_ci_runs():
    text = README.read_text()
    first_bash = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    commands = [line.split("#")[0].strip() for line in first_bash if line.strip()]
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[0].startswith("pip install -e . && polygrad demo moons")
    assert "pytest" in commands[1]
    for command in commands:
        install = command.split("&&")[0].strip().replace("pip install", "python -m pip install -q")
        assert install in ci, f"CI does not run the README's {command!r}"
