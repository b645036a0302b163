"""Xfail files of the conformance kit: known gaps, one line each (``backend op layout check
[case]  # reason``, fnmatch globs allowed)."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Sequence

from ..ir.ops import Op

XFAIL_FILE = "xfail.txt"


@dataclass(frozen=True)
class XFail:
    """One xfail line: ``backend op layout check [case]  # reason`` (fnmatch globs allowed)."""
    backend: str
    op: str
    layout: str
    check: str
    case: str = "*"
    reason: str = ""

    def matches(self, backend: str, op: Op | str, layout: str, check: str, case: str) -> bool:
        op = op.value if isinstance(op, Op) else op
        return all(fnmatch.fnmatchcase(value, pat) for value, pat in (
            (backend, self.backend), (op, self.op), (layout, self.layout), (check, self.check), (case, self.case)))


def parse_xfails(text: str, source: str = "<xfail>") -> list[XFail]:
    """Parse xfail lines.  Blank lines and ``#`` comments are ignored; a trailing ``# ...`` is the reason."""
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        body, _, reason = raw.partition("#")
        fields = body.split()
        if not fields:
            continue
        if not 4 <= len(fields) <= 5:
            raise ValueError(f"{source}:{lineno}: expected 'backend op layout check [case]  # reason', got {raw!r}")
        backend, op, layout, check, *case = fields
        out.append(XFail(backend, op, layout, check, case[0] if case else "*", reason=reason.strip()))
    return out


def load_xfails(paths: Iterable[str] = (), builtin: bool = True) -> list[XFail]:
    """The built-in xfail list shipped with polygrad (known gaps), plus the given files."""
    out: list[XFail] = []
    if builtin:
        text = resources.files("polygrad.testing").joinpath(XFAIL_FILE).read_text(encoding="utf-8")
        out += parse_xfails(text, f"polygrad/testing/{XFAIL_FILE}")
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            out += parse_xfails(fh.read(), path)
    return out


def find_xfail(xfails: Sequence[XFail], backend: str, op: Op, layout: str, check: str, case: str) -> XFail | None:
    return next((x for x in xfails if x.matches(backend, op, layout, check, case)), None)
