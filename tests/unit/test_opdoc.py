"""docs/ops.md is generated from the op table and must be current (python -m polygrad.testing.opdoc)."""
from __future__ import annotations

import re
from pathlib import Path

import polygrad as pg
from polygrad.testing import opdoc

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "ops.md"


def test_committed_page_is_what_the_generator_renders():
    assert PAGE.read_text(encoding="utf-8") == opdoc.render(), (
        "docs/ops.md is stale: run `python -m polygrad.testing.opdoc` and commit the result")


def test_page_covers_every_op_with_a_section_and_a_table_row():
    text = opdoc.render()
    sections = re.findall(r"^## (\w+)$", text, re.MULTILINE)
    assert sections == pg.list_ops()
    for name in pg.list_ops():
        assert f"| [`{name}`](#{name}) |" in text
        body = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert "- **inputs**:" in body and "- **output**:" in body


def test_the_edge_cases_the_issue_names_are_documented_with_computed_examples():
    text = opdoc.render()
    assert "axes=() is no reduction: `sum([[1, 2], [3, 4]], axes=(), keepdims=False)` → `[[1, 2], [3, 4]]`" in text
    assert "rows [[0, 2], [], [1]])` → `[-1.0, 0.0, -3.0]`" in text                  # segment_max: empty row is 0
    assert "index=(slice(None, None, -1),))` → `[30, 20, 10]`" in text              # reversed slice
    assert "index=([-1, 0, 0],))` → `[30, 10, 10]`" in text                         # negative indices
    assert "repeats accumulate" in text and "read-only" in text


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    page = tmp_path / "ops.md"
    assert opdoc.main(["--path", str(page)]) == 0
    assert opdoc.main(["--check", "--path", str(page)]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert opdoc.main(["--check", "--path", str(page)]) == 1
    assert "stale" in capsys.readouterr().err


def test_specs_cover_exactly_the_op_enum():
    assert set(opdoc.SPECS) == set(pg.Op)
