"""The results of a conformance run (:func:`polygrad.testing.conformance.run_conformance`): one
:class:`Result` per check and case, and the :class:`Report` that holds them, with the op x layout
table ``polygrad check`` prints."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.ops import Op
from .cases import LAYOUTS, covered


@dataclass
class Result:
    backend: str
    op: Op
    layout: str
    check: str
    case: str
    status: str                  # "pass", "fail", "xfail", "xpass"
    message: str = ""
    max_error: float | None = None
    reason: str = ""             # xfail reason


@dataclass
class Report:
    """All results of a conformance run, with the op x layout table."""
    backend: str
    results: list[Result] = field(default_factory=list)
    provided: set = field(default_factory=set)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "xfail": 0, "xpass": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def cell(self, op: Op, layout: str) -> str:
        if (op, layout) not in self.provided:
            return "-"
        mine = [r for r in self.results if r.op == op and r.layout == layout]
        if not mine:
            return "no cases"
        statuses = {r.status for r in mine}
        if "fail" in statuses:
            return "FAIL"
        if "xfail" in statuses:
            return "xfail"
        return "pass"

    def layouts(self) -> list[str]:
        extra = sorted({layout for _, layout in self.provided} - set(LAYOUTS))
        return list(LAYOUTS) + extra

    def table(self) -> str:
        layouts = self.layouts()
        rows = [["op", *layouts]] + [[op.value, *(self.cell(op, lay) for lay in layouts)] for op in Op]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def summary(self) -> str:
        c = self.counts()
        missing = len(covered() - self.provided)
        text = (f"backend {self.backend!r}: {len(self.results)} checks: {c['pass']} passed, {c['fail']} failed, "
                f"{c['xfail']} xfailed")
        if c["xpass"]:
            text += f", {c['xpass']} xpassed (stale xfail entries?)"
        return text + (f"; {len(self.provided)} kernels provided, {missing} of the kit's {len(covered())} "
                       "(op, layout) pairs not provided")

    def to_dict(self) -> dict:
        return {"backend": self.backend, "ok": self.ok, "counts": self.counts(),
                "table": {f"{op.value}/{lay}": self.cell(op, lay) for op in Op for lay in self.layouts()},
                "failures": [{"op": r.op.value, "layout": r.layout, "check": r.check, "case": r.case,
                              "message": r.message, "max_error": r.max_error} for r in self.failures]}
